"""The attention core of one layer on one TP rank, forward and backward: flash attention as one kernel, or
Megatron's unfused chain (QK^T, scale + causal mask + softmax, dropout, scores x V; the backward's
conjugates), or context parallelism's ring / all-to-all variants (sim/schedule/cp_ops.py).

With model.qk_norm the query and key heads are normalized first (Megatron-Core SelfAttention
get_query_key_value_tensors: q_layernorm, then k_layernorm, each a norm of the model's kind over one head's
width, outside the checkpointed core: selective recompute of core_attn does not re-run them). Their
backward follows the core's (attention_forward / attention_backward).
"""

from __future__ import annotations

from meshsim.sim.schedule.cp_ops import core_backward_cp, core_forward_cp
from meshsim.sim.schedule.elementwise_ops import FUSED_SOFTMAX_MAX_SEQ, qk_norm_bwd, qk_norm_fwd, scores
from meshsim.sim.schedule.ops import Gemm
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.sim.schedule.template import Deps, Template


def core_forward(tpl: Template, phase: str, d: LayerDims, deps: Deps) -> tuple[int, ...]:
    """Flash: one Attention. Unfused: QK^T, fused scale+mask+softmax, dropout, scores x V. Context parallel:
    sim/schedule/cp_ops.py."""
    if d.cp > 1:
        return core_forward_cp(tpl, phase, d, deps)
    if d.flash:
        return (tpl.add(phase, "attn", d.attention(backward=False), deps),)
    qk = tpl.add(phase, "qk", Gemm(d.seq, d.seq, d.head_dim, d.micro_batch * d.heads), deps)
    if d.seq <= FUSED_SOFTMAX_MAX_SEQ:  # Megatron's FusedScaleMaskSoftmax: one kernel
        x = tpl.add(phase, "softmax", scores(d, "scale_mask_softmax", 2, 2), (qk,))
    else:
        x = tpl.add(phase, "scale_mask", scores(d, "scale_mask", 2, 2), (qk,))
        x = tpl.add(phase, "softmax", scores(d, "softmax", 2, 2), (x,))
    if d.dropout:
        x = tpl.add(phase, "attn_dropout", scores(d, "attn_dropout", 2, 3), (x,))
    return (tpl.add(phase, "pv", Gemm(d.seq, d.head_dim, d.seq, d.micro_batch * d.heads), (x,) + deps),)


def core_backward(tpl: Template, d: LayerDims, deps: Deps) -> tuple[int, ...]:
    """Gradient of the core; selective recompute of core_attn first re-runs the core forward (phase 'recompute')."""
    if d.recomputes("core_attn"):
        core_forward(tpl, "recompute", d, ())
    if d.cp > 1:
        return core_backward_cp(tpl, d, deps)
    if d.flash:
        return (tpl.add("bwd", "attn", d.attention(backward=True), deps),)
    bh = d.micro_batch * d.heads
    x = tpl.add("bwd", "pv_dgrad", Gemm(d.seq, d.seq, d.head_dim, bh), deps)
    tpl.add("bwd", "pv_wgrad", Gemm(d.seq, d.head_dim, d.seq, bh), deps)
    if d.dropout:
        x = tpl.add("bwd", "attn_dropout", scores(d, "attn_dropout_bwd", 3, 2), (x,))
    if d.seq <= FUSED_SOFTMAX_MAX_SEQ:  # the fused kernel's backward also applies the scale
        x = tpl.add("bwd", "softmax", scores(d, "scale_mask_softmax_bwd", 4, 2), (x,))
    else:
        x = tpl.add("bwd", "softmax", scores(d, "softmax_bwd", 4, 2), (x,))
        x = tpl.add("bwd", "scale_mask", scores(d, "scale_mask_bwd", 2, 2), (x,))
    q = tpl.add("bwd", "qk_dgrad", Gemm(d.seq, d.head_dim, d.seq, bh), (x,))
    k = tpl.add("bwd", "qk_wgrad", Gemm(d.seq, d.head_dim, d.seq, bh), (x,))
    return (q, k)


def attention_forward(tpl: Template, phase: str, d: LayerDims, deps: Deps) -> tuple[int, ...]:
    """model.qk_norm's query and key norms on the qkv output (module docstring), then the core."""
    if d.qk_norm:
        deps = (tpl.add(phase, "q_norm", qk_norm_fwd(d, key=False), deps),
                tpl.add(phase, "k_norm", qk_norm_fwd(d, key=True), deps))
    return core_forward(tpl, phase, d, deps)


def attention_backward(tpl: Template, d: LayerDims, deps: Deps) -> tuple[int, ...]:
    """The core's backward, then the query and key norms' (model.qk_norm)."""
    grads = core_backward(tpl, d, deps)
    if not d.qk_norm:
        return grads
    return (tpl.add("bwd", "q_norm", qk_norm_bwd(d, key=False), grads),
            tpl.add("bwd", "k_norm", qk_norm_bwd(d, key=True), grads))
