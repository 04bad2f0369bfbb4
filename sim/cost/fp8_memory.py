"""FP8 memory per GPU (run.fp8): the linear weights' FP8 copies, FP8-saved linear inputs, FP8 primary weights.

Rules (sim/schedule/fp8_rules.py has the sources):
- Weight caches: Transformer Engine keeps each FP8 linear's quantized weight across the micro-batches of a
  step (its workspace, refreshed on the first micro-batch): a rowwise copy for the forward GEMM and a
  columnwise (transposed) copy for dgrad, 1 byte per parameter each, plus their scales (blockwise: fp32 per
  128 x 128 block; MXFP8: 1 byte per 32 values, both directions). So +2 bytes per linear weight on top of the
  bf16 weight.
- run.fp8_param_gather (FP8 primary weights, Megatron --fp8-param-gather): the linear weights exist only as
  FP8 tensors (data + transpose, 2 bytes per parameter); no bf16 copy: weights 2 B instead of 2 + 2 B.
- Saved activations: the four linears' inputs are kept for wgrad as FP8 (1 byte per value instead of 2,
  plus blockwise / MXFP8 scales): the qkv and fc1 inputs (the norms' outputs, sequence-sharded under SP)
  and the proj and fc2 inputs (inside the TP region). Norm inputs, Q/K/V, the MLP's fc1 output and the
  attention statistics stay 16-bit. Full recompute keeps only 16-bit layer inputs: no change.
"""

from __future__ import annotations

from meshsim.sim.schedule.fp8_rules import FP8_BYTES, MXFP8_BLOCK, MXFP8_SCALE_BYTES, scale_bytes
from meshsim.sim.schedule.shapes import LayerDims

BF16_BYTES = 2
BLOCKWISE_WEIGHT_BLOCK = 128 * 128  # Float8BlockScaling: one fp32 scale per 128 x 128 weight block


def weight_copy_bytes(d: LayerDims) -> float:
    """Bytes per linear weight of the FP8 rowwise + columnwise copies with their scales."""
    recipe = d.fp8.recipe
    if recipe == "mxfp8":
        return 2 * (FP8_BYTES + MXFP8_SCALE_BYTES / MXFP8_BLOCK)
    if recipe == "blockwise":
        return 2 * (FP8_BYTES + 4 / BLOCKWISE_WEIGHT_BLOCK)
    return 2 * FP8_BYTES


def fp8_weight_extra_bytes(d: LayerDims, layers: int, param_gather: bool) -> float:
    """Bytes added to the 16-bit weights of `layers` layers: the FP8 copies, less the bf16 linear weights that
    FP8 primary weights replace."""
    if not d.fp8.on:
        return 0.0
    n = layers * d.linear_weights
    return n * weight_copy_bytes(d) - (n * BF16_BYTES if param_gather else 0)


def fp8_activation_savings(d: LayerDims) -> int:
    """Bytes one layer's saved activations shrink by for one micro-batch (recompute none / selective): the
    four linear inputs at 1 byte plus scales instead of 2 bytes."""
    if not d.fp8.on or d.recompute == "full":
        return 0
    outside = 2 * d.tokens_out * d.hidden  # qkv and fc1 inputs (sharded under SP)
    inside = d.tokens * (d.heads * d.head_dim + d.ffn)  # proj and fc2 inputs
    total = outside + inside
    return total * (BF16_BYTES - FP8_BYTES) - scale_bytes(total, d.fp8.recipe)
