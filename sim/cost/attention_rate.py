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

Head width. Every fitted row (and the 0.50 derivation) has head_dim 128: per score element the kernel does
w = 2 (d_qk + d_v) = 512 tensor-core FLOPs plus a softmax whose work does not depend on the width (one exp
on the SFU and ~5 FP32 ops). With that split, not overlapped (compute.py's derivation), the time per score
is w / (F c) + S cycles per SM (F: dense 16-bit tensor FLOPs per clock per SM, c = MMA_CEILING; S: the
softmax's cycles), so the fraction of peak at width w, relative to the fitted one at 512, is

    width_factor(w) = (w / 512) (1 + rho) / (w / 512 + rho),     rho = S F c / 512,

the softmax's time over the MMA's at head_dim 128: 0.45 on an A100, 0.65 on an H100, 1.30 on a B200
(tensor cores twice Hopper's per clock, the SFU not), 0.90 on a B300 / GB300 (Blackwell Ultra doubles the
SFU's exp rate). Head_dim 64 (GPT-OSS) then runs at 0.72 (H100) / 0.64 (B200) of the fitted fraction, MLA's
192 + 128 (DeepSeek-V3) at 1.09 / 1.13. Per-clock rates: NVIDIA's datasheets divided by SMs x boost clock
(1,024 / 2,048 / 4,096 / 8,192 dense 16-bit FLOPs per clock per SM on sm_70 / 80 / 90 / 100) and the CUDA
programming guide's arithmetic-instruction throughput table (exp 16 per clock per SM; FP32 64 lanes per SM
on sm_70 / 80, 128 from sm_90). Fitted on nothing: no row in our set has another head width, so head_dim
128 is unchanged; hardware.compute.attention_efficiency is read at head_dim 128 too.

FlashAttention 2 on Hopper and Blackwell (`legacy_mma_fraction`). Where Transformer Engine runs FlashAttention 2
on a part newer than sm_80 (a deterministic run on sm_100+ with attention dropout: TE @d0067d0
pytorch/attention/dot_product_attention/utils.py "Filter: Determinism" and fused_attn.cpp "determinism on
Blackwell"; sim/cost/fa2_deterministic.uses_fa2), the kernels are FlashAttention 2's sm_80 kernels
(Dao-AILab/flash-attention @0251105a csrc/flash_attn/src/kernel_traits.h: every Flash_*_kernel_traits is
built on `SM80_16x8x16_F32F16F16F32_TN` / `..._F32BF16BF16F32_TN`, the warp-level mma.sync). Hopper's full
tensor rate needs its asynchronous warpgroup MMA (wgmma) and Blackwell's its tcgen05 MMA with the tensor memory;
mma.sync issues from one warp at sm_80's width per SM per clock, so FA2 sustains at most sm_80's
MMA_FLOP_PER_CLOCK (2,048) per SM per clock: 1/2 of an H100's peak, 1/4 of a B200's. Its rate is then
    peak x legacy_mma_fraction x DEFAULT_ATTENTION_EFFICIENCY (0.50, the FA2-style unoverlapped derivation
    of sim/cost/compute.py, the A100's figure) x width_factor,
at the part's reference rate (GB200: B200's absolute rate). Fitted on nothing. It explains why the Megatron
CI gpt3 7B GB200 rows (deterministic, dropout 0.1) were 37-41% too fast while their A100 twins (FA2 at
native width) and H100 twins (cuDNN) were not: with it they land at +1.3% / -9.0% (benchmarks/accuracy.py,
both out of fit). The FlashAttention-3 paper (Shah et al. 2024) reports FA2 at about 35% of an H100's peak,
the same halving seen from the other side.

Attention dropout (`dropout_factor`). With attention dropout the kernel draws a random number per score and
masks it, in the forward and again in the backward (which regenerates the mask from the same Philox state).
FlashAttention 2 (csrc/flash_attn/src/dropout.h, philox.cuh @0251105a) calls Philox4x32 once per 16 scores
(8-bit randoms): 7 rounds of two 32 x 32 -> 64-bit multiplies (2 issue slots each), two three-input XORs and two
key adds, 56 integer ops per call, 3.5 per score; widening the bytes to 16 bits 1, the f16x2 compare and the AND
0.5 each: DROPOUT_INT_OPS = 5.5 per score on the 64-lane INT32 pipe (CUDA programming guide throughput table,
sm_70 to sm_100). Like the softmax it is not overlapped with the MMA, so per score the kernel takes
w / (F c) + S + D cycles, D = 5.5 / 64, and the rate with dropout over the rate without is

    dropout_factor = (x + rho) / (x + rho + delta),     delta = D F c / 512,  x = w / 512

0.75 on an H100 (cuDNN; rho 0.65, delta 0.55), 0.84 on an A100, 0.68 on a B200, 0.83 for FA2 on Blackwell
(sm_80's F). cuDNN's dropout takes the same Philox seed and offset from TE (its kernels are closed): assumed to
cost the same per score. Every fitted rate above comes from rows without attention dropout (Llama recipes);
the only rows with it are the six Megatron CI gpt3 7B rows, all out of fit. Fitted on nothing.
"""

from __future__ import annotations

from meshsim.topologies.gpus import GpuSpec, by_gpu_prefix

ATTENTION_EFFICIENCY_BY_GPU = {"h100": 0.43, "h200": 0.43, "b200": 0.55}
DEFAULT_ATTENTION_EFFICIENCY = 0.50

REFERENCE_WIDTH = 512  # 2 (d_qk + d_v) at head_dim 128: the width every fitted rate was measured at
MMA_CEILING = 0.80  # the tensor cores' sustained fraction inside the kernel (compute.py's derivation)
SOFTMAX_FP32_OPS = 5  # scale, max, subtract, sum, rescale per score, besides the exp
MMA_FLOP_PER_CLOCK = {7: 1024, 8: 2048, 9: 4096, 10: 8192}  # dense 16-bit, per SM, by compute capability major
FP32_LANES = {7: 64, 8: 64, 9: 128, 10: 128}  # FP32 results per clock per SM
INT32_LANES = 64  # 32-bit integer add / logic / multiply-add results per clock per SM, sm_70 to sm_100
# Philox4x32 in FlashAttention 2 (csrc/flash_attn/src/philox.cuh, dropout.h @0251105a): 7 rounds of 2 mul.wide
# (2 issue slots each), 2 three-input XORs and 2 key adds = 56 integer ops per call, one call per 16 scores
# (8-bit randoms): 3.5; widening the bytes to 16 bits 1, the f16x2 compare and the AND 0.5 each
DROPOUT_INT_OPS = 3.5 + 1.0 + 0.5 + 0.5
LEGACY_MMA_MAJOR = 8  # FlashAttention 2's kernels are built from sm_80's mma.sync (module docstring)


def exp_per_clock(compute_capability: tuple[int, int]) -> int:
    """SFU exponentials per clock per SM: 16, 32 on Blackwell Ultra (sm_103)."""
    return 32 if compute_capability == (10, 3) else 16


def mma_per_clock(gpu: GpuSpec, fp8: bool = False, legacy: bool = False) -> float | None:
    """Dense tensor FLOPs per clock per SM the kernel's MMA issues at: the part's own (x its FP8 / 16-bit peak
    ratio for FP8 attention), sm_80's for FlashAttention 2's mma.sync (`legacy`); None outside the table."""
    major = gpu.compute_capability[0]
    if major not in MMA_FLOP_PER_CLOCK:
        return None
    if legacy:
        return float(MMA_FLOP_PER_CLOCK[min(major, LEGACY_MMA_MAJOR)])
    return MMA_FLOP_PER_CLOCK[major] * (gpu.fp8_peak_tflops / gpu.peak_tflops if fp8 else 1.0)


def softmax_to_mma(gpu: GpuSpec, fp8: bool = False, legacy: bool = False) -> float | None:
    """rho: the softmax's time per score over the MMA's at head_dim 128 (module docstring); None for a GPU
    whose compute capability is not in the tables (a custom part: no width correction). FP8 attention
    doubles the MMA rate (the part's FP8 peak over its 16-bit one); FA2 (`legacy`) issues at sm_80's."""
    mma = mma_per_clock(gpu, fp8, legacy)
    if mma is None:
        return None
    major = gpu.compute_capability[0]
    softmax_cycles = 1.0 / exp_per_clock(gpu.compute_capability) + SOFTMAX_FP32_OPS / FP32_LANES[major]
    return softmax_cycles * mma * MMA_CEILING / REFERENCE_WIDTH


def dropout_to_mma(gpu: GpuSpec, fp8: bool = False, legacy: bool = False) -> float | None:
    """delta: attention dropout's integer work per score over the MMA's time at head_dim 128 (module
    docstring, "Attention dropout"): DROPOUT_INT_OPS / INT32_LANES cycles per score."""
    mma = mma_per_clock(gpu, fp8, legacy)
    if mma is None:
        return None
    return DROPOUT_INT_OPS / INT32_LANES * mma * MMA_CEILING / REFERENCE_WIDTH


def width_factor(gpu: GpuSpec, width: float, fp8: bool = False, legacy: bool = False) -> float:
    """The attention efficiency at `width` = 2 (d_qk + d_v) tensor FLOPs per score, over the fitted one at
    REFERENCE_WIDTH (module docstring); 1 at head_dim 128 and for GPUs outside the tables."""
    rho = softmax_to_mma(gpu, fp8, legacy)
    if rho is None or width == REFERENCE_WIDTH:
        return 1.0
    x = width / REFERENCE_WIDTH
    return x * (1.0 + rho) / (x + rho)


def dropout_factor(gpu: GpuSpec, width: float, fp8: bool = False, legacy: bool = False) -> float:
    """The rate with attention dropout over the rate without, at `width`: (x + rho) / (x + rho + delta),
    x = width / REFERENCE_WIDTH (module docstring, "Attention dropout"); 1 for GPUs outside the tables."""
    rho, delta = softmax_to_mma(gpu, fp8, legacy), dropout_to_mma(gpu, fp8, legacy)
    if rho is None or delta is None:
        return 1.0
    x = width / REFERENCE_WIDTH
    return (x + rho) / (x + rho + delta)


def legacy_mma_fraction(gpu: GpuSpec) -> float:
    """The fraction of the part's 16-bit peak that SM80-style mma.sync kernels (FlashAttention 2) can reach:
    sm_80's MMA_FLOP_PER_CLOCK over the part's own (module docstring, "FlashAttention 2 on Hopper and
    Blackwell"); 1 at or below sm_80 and for parts outside the table."""
    major = gpu.compute_capability[0]
    if major <= LEGACY_MMA_MAJOR or major not in MMA_FLOP_PER_CLOCK:
        return 1.0
    return MMA_FLOP_PER_CLOCK[LEGACY_MMA_MAJOR] / MMA_FLOP_PER_CLOCK[major]


def fa2_fraction(gpu: GpuSpec, width: float, dropout: bool, native_efficiency: float, scale: float) -> float:
    """FlashAttention 2's fraction of the part's 16-bit peak: `native_efficiency` (the part's resolved
    attention_efficiency) where mma.sync is the part's own MMA (sm_80 and below), else legacy_mma_fraction x
    DEFAULT_ATTENTION_EFFICIENCY x `scale` (the part's reference rate); times the width and dropout factors at
    the MMA width the kernel issues (module docstring)."""
    legacy = legacy_mma_fraction(gpu)
    issued_legacy = legacy < 1.0
    eff = DEFAULT_ATTENTION_EFFICIENCY * scale if issued_legacy else native_efficiency
    shape = width_factor(gpu, width, legacy=issued_legacy)
    if dropout:
        shape *= dropout_factor(gpu, width, legacy=issued_legacy)
    return legacy * eff * shape


def attention_efficiency(gpu_name: str) -> float:
    """The generation's ATTENTION_EFFICIENCY_BY_GPU, DEFAULT_ATTENTION_EFFICIENCY if unknown."""
    return by_gpu_prefix(ATTENTION_EFFICIENCY_BY_GPU, gpu_name, DEFAULT_ATTENTION_EFFICIENCY)
