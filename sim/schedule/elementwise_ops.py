"""The elementwise kernels of a transformer layer as bytes read and written (16-bit activations, fp32
statistics, 1-byte dropout masks): LayerNorm forward / backward, the residual add and its gradient sum,
(bias-)dropout-add, the MLP activation, and the unfused attention's kernels over the s x s scores.
Tokens: d.tokens_out (s*b/t under SP, s*b otherwise) outside TP regions, d.tokens inside them.
"""

from __future__ import annotations

from meshsim.sim.schedule.ops import Elementwise
from meshsim.sim.schedule.shapes import LayerDims


def rows_norm_fwd(rows: int, width: int, dtype_bytes: int) -> Elementwise:
    """A norm over `rows` rows of `width`: read x, write y and the fp32 mean/rstd per row."""
    n = rows * width * dtype_bytes
    return Elementwise("layernorm", n, n + 8 * rows)


def rows_norm_bwd(rows: int, width: int, dtype_bytes: int) -> Elementwise:
    """Its backward: read dy, x and the fp32 mean/rstd per row; write dx (dgamma, dbeta partial sums are per
    block, small)."""
    n = rows * width * dtype_bytes
    return Elementwise("layernorm_bwd", 2 * n + 8 * rows, n)


def norm_fwd(d: LayerDims) -> Elementwise:
    """LayerNorm over the hidden width, one row per token."""
    return rows_norm_fwd(d.tokens_out, d.hidden, d.dtype_bytes)


def norm_bwd(d: LayerDims) -> Elementwise:
    return rows_norm_bwd(d.tokens_out, d.hidden, d.dtype_bytes)


def qk_norm_fwd(d: LayerDims, key: bool) -> Elementwise:
    """model.qk_norm's query (key=False) or key norm: one row per token and local head of head_dim."""
    return rows_norm_fwd(d.tokens * (d.kv_heads if key else d.heads), d.head_dim, d.dtype_bytes)


def qk_norm_bwd(d: LayerDims, key: bool) -> Elementwise:
    return rows_norm_bwd(d.tokens * (d.kv_heads if key else d.heads), d.head_dim, d.dtype_bytes)


def residual_grad_add(d: LayerDims) -> Elementwise:
    """The block input feeds both the norm and the residual add, so autograd sums its two gradients (the
    norm's dx and the residual path's) in a separate add kernel: read 2, write 1 activation."""
    n = d.tokens_out * d.hidden * d.dtype_bytes
    return Elementwise("residual_grad_add", 2 * n, n)


def residual_fwd(d: LayerDims) -> Elementwise:
    """(Bias-)dropout-add: read branch and residual, write sum (+ 1-byte mask with dropout)."""
    n = d.tokens_out * d.hidden * d.dtype_bytes
    mask = d.tokens_out * d.hidden if d.dropout else 0
    return Elementwise("dropout_add" if d.dropout else "residual_add", 2 * n, n + mask)


def dropout_bwd(d: LayerDims) -> Elementwise:
    n = d.tokens_out * d.hidden * d.dtype_bytes
    return Elementwise("dropout_bwd", n + d.tokens_out * d.hidden, n)


def act_fwd(d: LayerDims) -> Elementwise:
    """gelu: read/write T x ffn/t; swiglu: read gate+up (2 ffn/t), write ffn/t."""
    out = d.tokens * d.ffn * d.dtype_bytes
    return Elementwise(d.mlp, d.tokens * d.fc1_n * d.dtype_bytes, out)


def act_bwd(d: LayerDims) -> Elementwise:
    inp = d.tokens * d.fc1_n * d.dtype_bytes
    return Elementwise(f"{d.mlp}_bwd", d.tokens * d.ffn * d.dtype_bytes + inp, inp)


# Megatron's FusedScaleMaskSoftmax (fused_kernels/scaled_upper_triang_masked_softmax.h): scale, causal mask
# and softmax in one kernel, forward and backward, for key lengths up to 2,048 in the 2020-2022 code and up
# to 16,384 since 2023; longer sequences fall back to torch (scale+mask, then softmax: two kernels).
FUSED_SOFTMAX_MAX_SEQ = 16384


def scores(d: LayerDims, kernel: str, read_b: int, write_b: int) -> Elementwise:
    """A kernel over the b x heads/t x s x s scores (unfused attention); bytes per score element:
    scale_mask_softmax 2/2 (fused; unfused scale_mask 2/2 then softmax 2/2), dropout 2/3 (+1-byte mask);
    backward softmax 4/2 (+ scale_mask 2/2 when unfused), dropout 3/2."""
    n = d.micro_batch * d.heads * d.seq * d.seq
    return Elementwise(kernel, read_b * n, write_b * n)
