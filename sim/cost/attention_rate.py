"""Flash attention's fraction of the dense 16-bit peak, per GPU generation.

    attention_s = flops / (peak x attention_efficiency x wave) + launch      (sim/cost/compute.py)

The flops are the work the kernels do (causal halving and the 2.5x backward included), so the efficiency
is the rate Transformer Engine's fused attention (cuDNN FusedAttention, which TE prefers on sm >= 90:
dot_product_attention/utils.py @d0067d0 L1647) sustains over forward, recompute and backward together.

ATTENTION_EFFICIENCY_BY_GPU is measured from whole steps, not kernels (no attention kernel time is in
this project's reference set and no GPU was lent). Each NeMo long-sequence table (public-measurements-2.md
A.2: Llama 2 7B, H100, NeMo 24.03.01; section 3.2: Llama 3 8B, B200, NeMo 25.04.rc2) trains one model with
one recipe from 8k to 1024k tokens: per token the GEMM work is fixed while the attention work grows with
the sequence, so the spread of the rows is the attention rate. Each value is fitted on its table's 1024k
row, where attention is 94% (H100) / 97% (B200) of the simulated step and the FP8 GEMM ceiling hardly
enters; the table's other rows (five CP rows and two rows without CP each) are out of fit and land within
3% (benchmarks/accuracy.py, groups cp and fp8):
- h100 / h200 0.43 (H200: the same SM and clocks as H100; its extra HBM bandwidth does not feed the MMA);
- b200 0.55 (GB200, the same die: B200's absolute rate, 0.55 x 2250 / 2500 of its own peak;
  sim/cost/reference_rate.py).
Other GPUs keep DEFAULT_ATTENTION_EFFICIENCY 0.50, the first-principles figure of sim/cost/compute.py
(tensor-core work plus an unoverlapped softmax per score).

What the values hold, and what they do not: they are the kernels of those software stacks, with the rows'
assumed attention-core recompute (a run without it would imply 3.5 / 4.5 of each rate); a newer cuDNN on
an H100 may reach more. Override with hardware.compute.attention_efficiency, or measure the kernels
(`meshsim calibrate`, profile kernel_table flash_attention_fwd / _bwd).
"""

from __future__ import annotations

from meshsim.topologies.gpus import by_gpu_prefix

ATTENTION_EFFICIENCY_BY_GPU = {"h100": 0.43, "h200": 0.43, "b200": 0.55}
DEFAULT_ATTENTION_EFFICIENCY = 0.50


def attention_efficiency(gpu_name: str) -> float:
    """The generation's ATTENTION_EFFICIENCY_BY_GPU, DEFAULT_ATTENTION_EFFICIENCY if unknown."""
    return by_gpu_prefix(ATTENTION_EFFICIENCY_BY_GPU, gpu_name, DEFAULT_ATTENTION_EFFICIENCY)
