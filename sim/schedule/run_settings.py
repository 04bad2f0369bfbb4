"""Run settings that change speed but not the math (scenario section `run`, scenarios/schema.RunConfig).

- Gradient-reduction dtype: Megatron-LM keeps fp32 main grads and reduces them in fp32 when training in
  bf16 (arguments.py forces accumulate_allreduce_grads_in_fp32 for bf16); --grad-reduce-in-bf16 halves the
  bytes. fp16 runs without --accumulate-allreduce-grads-in-fp32 (the default) reduce fp16 grads.
  `run.grad_reduce_dtype` overrides.
- Gradient-accumulation fusion (Megatron default on, needs APEX/TE's fused wgrad kernels): the wgrad GEMM
  accumulates straight into the fp32 main grad. Without it (--no-gradient-accumulation-fusion) wgrad
  writes a 16-bit gradient that a separate kernel adds into main_grad: per parameter read 2 + 4 bytes,
  write 4 bytes (MAIN_GRAD_ADD_BYTES), once per micro-batch.
- Deterministic mode (--deterministic-mode): the attention backward may not accumulate dQ with atomics.
  The compute model prices the kernel that runs: FlashAttention 2's deterministic grid where TE runs FA2
  (sim/cost/fa2_deterministic.py), cuDNN's dP-workspace path where it keeps cuDNN
  (sim/cost/cudnn_deterministic.py). Only the FP8 attention backward, a cuDNN node of its own, is still
  slowed by hardware.compute.deterministic_attention_slowdown (default DETERMINISTIC_ATTENTION_SLOWDOWN 1.25,
  an assumption: no public figure in our calibration set). It also calls torch.use_deterministic_algorithms(True),
  under which PyTorch fills every fresh output with NaN first: priced by the compute model
  (sim/cost/deterministic_fill.py).
- CUDA graphs (`run.cuda_graphs`): the step replays captured graphs, so no per-op host dispatch
  (sim/cost/host_dispatch.py).
- Overlap of the input-gradient TP collective with the weight-gradient GEMM (`run.tp_grad_reduce_overlap`,
  default true): Megatron-LM since 2021 (--async-tensor-model-parallel-allreduce, then Megatron-Core's
  linear layers and Transformer Engine) launches the column-parallel layer's input-gradient all-reduce
  (reduce-scatter under SP) right after dgrad and computes wgrad meanwhile (layer_ops.block_backward).
  The 2020 code did not: its f operator is an autograd function whose backward all-reduces synchronously
  (megatron/mpu/mappings.py _CopyToModelParallelRegion.backward, Megatron-LM 5281919420ac), and autograd
  runs it after the whole linear backward (F.linear: dgrad, wgrad and the bias grad in one node), so the
  collective starts after wgrad and the layer below waits for it: false.
- CUDA_DEVICE_MAX_CONNECTIONS (`run.cuda_device_max_connections`) and NCCL_ALGO (hardware.network.algo)
  are recorded; the first is not modeled (docs/calibration-history.md, "Considered and not adopted", says why), the second picks the algorithm.
"""

from __future__ import annotations

from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.units import BF16_BYTES, FP32_BYTES

DTYPE_BYTES = {"fp32": FP32_BYTES, "bf16": BF16_BYTES, "fp16": BF16_BYTES}
MAIN_GRAD_ADD_BYTES = (2 + 4, 4)  # (read 16-bit grad + fp32 main grad, write fp32 main grad) per parameter
DETERMINISTIC_ATTENTION_SLOWDOWN = 1.25


def grad_reduce_bytes(s: Scenario) -> int:
    """Bytes per parameter of the DP gradient reduction: run.grad_reduce_dtype, else bf16 with
    optimizer.main_grads_dtype bf16 (the DDP buffer is bf16, sim/schedule/optimizer_states.py), else fp32
    for bf16 runs and fp16 for fp16 runs (Megatron-LM defaults)."""
    default = "bf16" if s.optimizer.main_grads_dtype == "bf16" else ("fp32" if s.model.dtype == "bf16" else "fp16")
    dtype = s.run.grad_reduce_dtype or default
    return DTYPE_BYTES[dtype]
