"""FP8 memory per GPU (run.fp8): the linear weights' FP8 copies, FP8-saved linear inputs, FP8 primary weights.

Rules (sim/schedule/fp8_rules.py has the sources):
- Weight caches: Transformer Engine keeps each FP8 linear's quantized weight across the micro-batches of a
  step (its workspace, refreshed on the first micro-batch): a rowwise copy for the forward GEMM and a
  columnwise (transposed) copy for dgrad, 1 byte per parameter each, plus their scales (blockwise: fp32 per
  128 x 128 block; MXFP8: 1 byte per 32 values, both directions; nvfp4: half a byte per value and one E4M3
  byte per 16 x 16 block, both directions). So +2 bytes per linear weight on top of the
  bf16 weight; +1 with per-tensor scales on Blackwell, which keeps no columnwise copy (Fp8Plan.transpose_free).
- run.fp8_param_gather (FP8 primary weights, Megatron --fp8-param-gather): the linear weights exist only as
  FP8 tensors (data + transpose, 2 bytes per parameter); no bf16 copy: weights 2 B instead of 2 + 2 B.
- Saved activations: the four linears' inputs are kept for wgrad as FP8 (1 byte per value instead of 2,
  plus blockwise / MXFP8 scales; nvfp4: half a byte plus an E4M3 scale per 16 values): the qkv and fc1 inputs (the norms' outputs, sequence-sharded under SP)
  and the proj and fc2 inputs (inside the TP region). Norm inputs, Q/K/V, the MLP's fc1 output and the
  attention statistics stay 16-bit. Full recompute keeps only 16-bit layer inputs: no change. MoE layers:
  the attention block's two linear inputs and the experts' (moe_fp8_savings); FP8 weight copies of the
  local experts and the shared expert (sim/schedule/moe_shapes.fp8_linear_weights).
"""

from __future__ import annotations

from meshsim.sim.schedule.fp8_rules import (
    FP8_BYTES,
    MXFP8_BLOCK,
    MXFP8_SCALE_BYTES,
    NVFP4_SCALE_BYTES,
    NVFP4_WEIGHT_BLOCK,
    fp8_tensor_bytes,
)
from meshsim.sim.schedule.layer_kinds import LayerPlan
from meshsim.sim.schedule.shapes import LayerDims

BF16_BYTES = 2
BLOCKWISE_WEIGHT_BLOCK = 128 * 128  # Float8BlockScaling: one fp32 scale per 128 x 128 weight block


def weight_copy_bytes(d: LayerDims) -> float:
    """Bytes per linear weight of the FP8 rowwise + columnwise copies with their scales (the rowwise one only
    where the plan is transpose-free)."""
    recipe = d.fp8.recipe
    if recipe == "mxfp8":
        return 2 * (FP8_BYTES + MXFP8_SCALE_BYTES / MXFP8_BLOCK)
    if recipe == "blockwise":
        return 2 * (FP8_BYTES + 4 / BLOCKWISE_WEIGHT_BLOCK)
    if recipe == "nvfp4":  # half a byte per value, an E4M3 scale per 16 x 16 block, both directions
        return 2 * (0.5 + NVFP4_SCALE_BYTES / NVFP4_WEIGHT_BLOCK)
    return (1 if d.fp8.transpose_free else 2) * FP8_BYTES


def fp8_weight_extra_bytes(d: LayerDims, linear_weights: int, param_gather: bool) -> float:
    """Bytes added to the 16-bit weights by `linear_weights` FP8 linear weights (sim/schedule/moe_shapes.py
    fp8_linear_weights): the FP8 copies, less the bf16 linear weights that FP8 primary weights replace."""
    if not d.fp8.on:
        return 0.0
    n = linear_weights
    return n * weight_copy_bytes(d) - (n * BF16_BYTES if param_gather else 0)


def fp8_activation_savings(d: LayerDims, mlp: bool = True) -> int:
    """Bytes one layer's saved activations shrink by for one micro-batch (recompute none / selective): the
    four linear inputs at 1 byte plus scales instead of 2 bytes; `mlp` False: the attention block's two."""
    if not d.fp8.on or d.recompute == "full":
        return 0
    outside = (2 if mlp else 1) * d.tokens_out * d.hidden  # qkv and fc1 inputs (sharded under SP)
    inside = d.tokens * (d.heads * d.head_dim + (d.ffn if mlp else 0))  # proj and fc2 inputs
    return fp8_saved_bytes(outside + inside, d.fp8.recipe)


def fp8_saved_bytes(values: int, recipe: str) -> int:
    """What `values` saved linear-input values shrink by when kept quantized (1 byte, nvfp4 half a byte, plus
    scales) instead of 16-bit."""
    return values * BF16_BYTES - fp8_tensor_bytes(values, recipe)


def moe_fp8_savings(plan: LayerPlan) -> int:
    """What an MoE block's saved activations shrink by under FP8 (recompute none / selective): the routed
    experts' fc1 and fc2 inputs (TE GroupedLinear keeps its quantized inputs for wgrad; fc2's only when
    moe_act is not recomputed) and the shared expert's fc2 input. Its fc1 input is the ln2 output, which the
    router keeps in 16 bit anyway."""
    d, m = plan.d, plan.moe
    if not d.fp8.on or d.recompute == "full" or m is None:
        return 0
    act_in = 0 if d.recomputes("moe_act") else m.ffn
    values = m.expert_rows * (m.hidden + act_in) + m.tokens * m.tp * m.shared_ffn
    return fp8_saved_bytes(values, d.fp8.recipe)
