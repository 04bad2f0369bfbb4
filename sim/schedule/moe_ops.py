"""One MoE layer's feed-forward block on one rank, as Megatron-Core's MoELayer runs it (megatron/core/
transformer/moe/moe_layer.py forward at Megatron-LM d98e8a64): shared expert, router, token dispatch,
the local experts as grouped GEMMs, token combine.

Forward (moe_layer.py L658-697; token_dispatcher.py MoEAlltoAllTokenDispatcher L375-905):
  ln2 -> shared expert (an attention-TP MLP: SP all-gather, fc1, act, fc2, reduce-scatter; shared_experts.py)
  -> router GEMM [T, h] x [h, E] -> top-k and score function (one fused kernel, moe_router_fusion)
  -> token counts all-gathered over etp x ep (preprocess, L557-576) -> permute (T k rows, moe_utils.permute)
  -> all-to-all of the rows and of their fp32 probabilities over ep (L705-725)
  -> etp > 1: all-gathers of the rows and of their probabilities over etp (L741-751)
  -> sort the rows by local expert (L759-782, > 1 local expert)
  -> fc1, activation x probability, fc2 over the local experts (experts.py TEGroupedMLP: grouped GEMMs)
  -> unsort -> etp > 1: reduce-scatter over etp (L824-833) -> all-to-all back over ep (L864-870)
  -> unpermute (weighted sum of each token's k rows) -> + shared expert output -> residual add.
The allgather dispatcher (L233-372) all-gathers the tokens, routing map and probabilities over etp x ep,
permutes locally and reduce-scatters the output; the flex dispatcher (DeepEP / HybridEP, L1809-2050)
replaces permute + all-to-all (+ sort) by one fused kernel that sends each token once per destination
rank (sim/schedule/moe_shapes.py), DeepEP then permuting the received rows by expert, HybridEP inside the
kernel. Backward runs each step's conjugate in reverse (an all-to-all's backward is an all-to-all, an
all-gather's a reduce-scatter); grouped GEMMs do dgrad then wgrad (TE GroupedLinear), and everything runs
in program order on one stream (the dispatcher's all-to-all is synchronous, tensor_parallel/mappings.py
_AllToAll), so no collective of this block overlaps its compute; parallel.moe_ep_overlap overlaps two
micro-batches instead (sim/schedule/ep_overlap.py).

Template deps are data deps; the compute stream is FIFO; collectives run on ep_comm (ops.comm_stream).
"""

from __future__ import annotations

from meshsim.sim.schedule import elementwise_ops as ew
from meshsim.sim.schedule import fp8_ops as fp8
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.duality import region_boundaries
from meshsim.sim.schedule.expert_bias import fc2_bias_backward, fc2_bias_forward
from meshsim.sim.schedule.layer_ops import (
    boundary_collective,
    comm_then_gemm,
    dgrad,
    gemm_then_comm,
    regather_collective,
    wgrad,
)
from meshsim.sim.schedule.moe_act import act_kernel, expert_act
from meshsim.sim.schedule.moe_shapes import COUNT_BYTES, PROB_BYTES, ROUTING_MAP_BYTES, MoeDims
from meshsim.sim.schedule.ops import Collective, Elementwise
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.sim.schedule.template import Deps, Template


# ----- kernels -------------------------------------------------------------------------------------------
def _rows_kernel(kernel: str, read_rows: int, write_rows: int, m: MoeDims, probs: bool = True) -> Elementwise:
    """A row-moving kernel (permute, sort, unpermute): rows of h in the model dtype, plus fp32 probs."""
    p = PROB_BYTES if probs else 0
    return Elementwise(kernel, read_rows * (m.row_bytes + p), write_rows * (m.row_bytes + p))


def _route(m: MoeDims, backward: bool) -> Elementwise:
    """Top-k + softmax / sigmoid over the [T, E] logits (fp32): probs [T, E] fp32 and the routing map."""
    te = m.tokens * m.experts
    if backward:
        return Elementwise("moe_router_bwd", te * 2 * PROB_BYTES, te * PROB_BYTES)
    return Elementwise("moe_router", te * PROB_BYTES, te * (PROB_BYTES + ROUTING_MAP_BYTES))


def _add(rows: int, inputs: int, m: MoeDims) -> Elementwise:
    return Elementwise("moe_add", inputs * rows * m.row_bytes, rows * m.row_bytes)


def _coll(op: str, group: str, nbytes: int, purpose: str, kernel: str = "nccl") -> Collective:
    return Collective(op, group, nbytes, purpose, kernel)


# ----- shared expert (an SP MLP over the attention tp group) ---------------------------------------------
def shared_forward(tpl: Template, phase: str, d: LayerDims, m: MoeDims, inp: Deps) -> int:
    """The shared expert as a dense TE MLP block (layer_ops.block_forward without its norm and residual),
    FP8 quantize kernels and FP8 SP gathers included under run.fp8 (sim/schedule/fp8_ops.py)."""
    entry, exit_ = region_boundaries(d.sp)
    rows = m.tokens * m.tp
    q = fp8.quantize(tpl, phase, d, "shared_fc1", d.tokens_out * d.hidden, d.sp, inp, d.fp8.wgrad)
    coll = fp8.fp8_gather(d, boundary_collective(d, entry, "fwd"))
    _, col = comm_then_gemm(tpl, phase, K.SHARED_IN, coll, "shared_fc1", m.shared_fc1_gemm(), q, 1)
    act = tpl.add(phase, "shared_act", act_kernel(m, rows, m.shared_fc1_n, m.shared_ffn, False, False), col)
    mid = fp8.quantize(tpl, phase, d, "shared_fc2", rows * m.shared_ffn, False, (act,), d.fp8.wgrad)
    return gemm_then_comm(tpl, phase, "shared_fc2", m.shared_fc2_gemm(), mid, K.SHARED_OUT,
                          boundary_collective(d, exit_, "fwd"), 1)[-1]


def shared_backward(tpl: Template, d: LayerDims, m: MoeDims, g: Deps) -> int:
    entry, exit_ = region_boundaries(d.sp)
    fc1, fc2 = m.shared_fc1_gemm(), m.shared_fc2_gemm()
    rows, w8 = m.tokens * m.tp, d.fp8.on and d.fp8.wgrad
    g = fp8.quantize(tpl, "bwd", d, "shared_fc2", d.tokens_out * d.hidden, d.sp, g, d.fp8.wgrad)
    coll = fp8.fp8_gather(d, boundary_collective(d, exit_, "bwd"), both_copies=True)
    cs, dg = comm_then_gemm(tpl, "bwd", K.SHARED_OUT, coll, "shared_fc2_dgrad", dgrad(fc2), g, 1)
    dy = fp8.transpose_after_gather(tpl, d, "shared_fc2", rows * m.hidden, cs or g)
    w2 = tpl.add("bwd", "shared_fc2_wgrad", wgrad(fc2, d.grad_fusion, w8, d.main_grad_bytes), dy)
    act = tpl.add("bwd", "shared_act", act_kernel(m, rows, m.shared_fc1_n, m.shared_ffn, True, False), dg)
    mid = fp8.quantize(tpl, "bwd", d, "shared_fc1", rows * m.shared_fc1_n, False, (act,), d.fp8.wgrad)
    regather: tuple[int, ...] = ()
    if d.sp:
        regather = (tpl.add("bwd", K.SHARED_IN + K.REGATHER, fp8.fp8_gather(d, regather_collective(d)), mid),)
        regather = fp8.transpose_after_gather(tpl, d, "shared_fc1", rows * m.hidden, regather)
    ready = gemm_then_comm(tpl, "bwd", "shared_fc1_dgrad", dgrad(fc1), mid, K.SHARED_IN,
                           boundary_collective(d, entry, "bwd"), 1)
    w1 = tpl.add("bwd", "shared_fc1_wgrad", wgrad(fc1, d.grad_fusion, w8, d.main_grad_bytes), mid + regather)
    tpl.grads += [(w2, d.params(fc2)), (w1, d.params(fc1))]  # weights and (add_bias_linear) biases
    return ready[-1]


# ----- dispatch / combine ----------------------------------------------------------------------------------
def dispatch_forward(tpl: Template, phase: str, m: MoeDims, route: int, ln: int) -> int:
    """Routing output -> rows ready for the local experts (sorted by expert); returns the last op."""
    if m.dispatcher == "allgather":
        world = m.etp * m.ep
        x = ln
        if world > 1:
            x = tpl.add(phase, K.MOE_GATHER, _coll("all_gather", "etp_ep", world * m.tokens * m.row_bytes,
                                                    K.MOE_GATHER), (route, ln))
            tpl.add(phase, K.MOE_GATHER + "_map", _coll("all_gather", "etp_ep", world * m.tokens * m.experts
                                                         * (PROB_BYTES + ROUTING_MAP_BYTES), K.MOE_GATHER), (route,))
        return tpl.add(phase, "permute", _rows_kernel("moe_permute", world * m.tokens, m.expert_rows, m), (x,))
    if m.dispatcher == "flex":
        group = "etp_ep" if m.etp > 1 else "ep"
        x = tpl.add(phase, K.MOE_DISPATCH, _coll("all_to_all", group, m.etp * m.flex_bytes, K.MOE_DISPATCH,
                                                 m.flex_backend), (route, ln))
        if m.flex_backend == "deepep":  # received rows permuted by expert (_DeepepManager, fused_permute)
            rows = m.etp * m.flex_bytes // m.row_bytes
            x = tpl.add(phase, "permute", _rows_kernel("moe_permute", rows, m.expert_rows, m), (x,))
        return x
    x = route
    if m.ep * m.etp > 1:
        x = tpl.add(phase, K.MOE_META, _coll("all_gather", "etp_ep", m.etp * m.ep * m.experts * COUNT_BYTES,
                                             K.MOE_META), (route,))
    x = tpl.add(phase, "permute", _rows_kernel("moe_permute", m.tokens, m.sent_rows, m), (x, ln))
    if m.ep > 1:
        x = tpl.add(phase, K.MOE_DISPATCH, _coll("all_to_all", "ep", m.dispatch_bytes, K.MOE_DISPATCH), (x,))
        tpl.add(phase, K.MOE_DISPATCH_PROBS, _coll("all_to_all", "ep", m.received_rows * PROB_BYTES,
                                                   K.MOE_DISPATCH), (x,))
    if m.etp > 1:  # rows and probabilities in two all-gathers (token_dispatcher.py L741-751)
        x = tpl.add(phase, K.EXPERT_GATHER, _coll("all_gather", "etp", m.expert_rows * m.row_bytes, K.EXPERT_GATHER),
                    (x,))
        tpl.add(phase, K.EXPERT_GATHER_PROBS, _coll("all_gather", "etp", m.expert_rows * PROB_BYTES, K.EXPERT_GATHER),
                (x,))
    if m.local_experts > 1:
        x = tpl.add(phase, "sort_chunks", _rows_kernel("moe_sort_chunks", m.expert_rows, m.expert_rows, m), (x,))
    return x


def combine_forward(tpl: Template, phase: str, m: MoeDims, y: int) -> int:
    """Expert output rows -> this rank's tokens (the weighted sum of their k rows)."""
    if m.dispatcher == "allgather":
        world = m.etp * m.ep
        x = tpl.add(phase, "unpermute", _rows_kernel("moe_unpermute", m.expert_rows, world * m.tokens, m), (y,))
        if world > 1:
            x = tpl.add(phase, K.MOE_SCATTER, _coll("reduce_scatter", "etp_ep", world * m.tokens * m.row_bytes,
                                                     K.MOE_SCATTER), (x,))
        return x
    if m.dispatcher == "flex":
        x = y
        rows = m.etp * m.flex_bytes // m.row_bytes
        if m.flex_backend == "deepep":
            x = tpl.add(phase, "unpermute", _rows_kernel("moe_unpermute", m.expert_rows, rows, m), (x,))
        group = "etp_ep" if m.etp > 1 else "ep"
        return tpl.add(phase, K.MOE_COMBINE, _coll("all_to_all", group, m.etp * m.flex_bytes, K.MOE_COMBINE,
                                                   m.flex_backend), (x,))
    x = y
    if m.local_experts > 1:
        x = tpl.add(phase, "unsort_chunks", _rows_kernel("moe_sort_chunks", m.expert_rows, m.expert_rows, m,
                                                         False), (x,))
    if m.etp > 1:
        x = tpl.add(phase, K.EXPERT_SCATTER, _coll("reduce_scatter", "etp", m.expert_rows * m.row_bytes,
                                                   K.EXPERT_SCATTER), (x,))
    if m.ep > 1:
        x = tpl.add(phase, K.MOE_COMBINE, _coll("all_to_all", "ep", m.dispatch_bytes, K.MOE_COMBINE), (x,))
    return tpl.add(phase, "unpermute", _rows_kernel("moe_unpermute", m.sent_rows, m.tokens, m), (x,))


def dispatch_backward(tpl: Template, m: MoeDims, g: int, probs_g: int) -> int:
    """Gradient of the dispatch: rows' gradients back to this rank's tokens; returns the last op."""
    if m.dispatcher == "allgather":
        world = m.etp * m.ep
        x = tpl.add("bwd", "permute", _rows_kernel("moe_permute_bwd", m.expert_rows, world * m.tokens, m), (g,))
        if world > 1:
            x = tpl.add("bwd", K.MOE_GATHER, _coll("reduce_scatter", "etp_ep", world * m.tokens * m.row_bytes,
                                                    K.MOE_GATHER), (x, probs_g))
        return x
    if m.dispatcher == "flex":
        x = g
        rows = m.etp * m.flex_bytes // m.row_bytes
        if m.flex_backend == "deepep":
            x = tpl.add("bwd", "permute", _rows_kernel("moe_permute_bwd", m.expert_rows, rows, m), (x,))
        group = "etp_ep" if m.etp > 1 else "ep"
        return tpl.add("bwd", K.MOE_DISPATCH, _coll("all_to_all", group, m.etp * m.flex_bytes, K.MOE_DISPATCH,
                                                    m.flex_backend), (x, probs_g))
    x = g
    if m.local_experts > 1:
        x = tpl.add("bwd", "sort_chunks", _rows_kernel("moe_sort_chunks", m.expert_rows, m.expert_rows, m), (x,))
    if m.etp > 1:
        tpl.add("bwd", K.EXPERT_GATHER_PROBS, _coll("reduce_scatter", "etp", m.expert_rows * PROB_BYTES,
                                                    K.EXPERT_GATHER), (x, probs_g))
        x = tpl.add("bwd", K.EXPERT_GATHER, _coll("reduce_scatter", "etp", m.expert_rows * m.row_bytes,
                                                  K.EXPERT_GATHER), (x,))
    if m.ep > 1:
        tpl.add("bwd", K.MOE_DISPATCH_PROBS, _coll("all_to_all", "ep", m.received_rows * PROB_BYTES, K.MOE_DISPATCH),
                (x, probs_g))
        x = tpl.add("bwd", K.MOE_DISPATCH, _coll("all_to_all", "ep", m.dispatch_bytes, K.MOE_DISPATCH), (x,))
    return tpl.add("bwd", "permute", _rows_kernel("moe_permute_bwd", m.sent_rows, m.tokens, m), (x,))


def combine_backward(tpl: Template, m: MoeDims, g: Deps) -> int:
    """Gradient of the combine: the output gradient -> expert output rows' gradients."""
    if m.dispatcher == "allgather":
        world = m.etp * m.ep
        x = g
        if world > 1:
            x = (tpl.add("bwd", K.MOE_SCATTER, _coll("all_gather", "etp_ep", world * m.tokens * m.row_bytes,
                                                      K.MOE_SCATTER), g),)
        return tpl.add("bwd", "unpermute", _rows_kernel("moe_unpermute_bwd", world * m.tokens, m.expert_rows, m), x)
    if m.dispatcher == "flex":
        group = "etp_ep" if m.etp > 1 else "ep"
        x = tpl.add("bwd", K.MOE_COMBINE, _coll("all_to_all", group, m.etp * m.flex_bytes, K.MOE_COMBINE,
                                                m.flex_backend), g)
        if m.flex_backend == "deepep":
            rows = m.etp * m.flex_bytes // m.row_bytes
            x = tpl.add("bwd", "unpermute", _rows_kernel("moe_unpermute_bwd", rows, m.expert_rows, m), (x,))
        return x
    x = tpl.add("bwd", "unpermute", _rows_kernel("moe_unpermute_bwd", m.tokens, m.sent_rows, m), g)
    if m.ep > 1:
        x = tpl.add("bwd", K.MOE_COMBINE, _coll("all_to_all", "ep", m.dispatch_bytes, K.MOE_COMBINE), (x,))
    if m.etp > 1:
        x = tpl.add("bwd", K.EXPERT_SCATTER, _coll("all_gather", "etp", m.expert_rows * m.row_bytes,
                                                   K.EXPERT_SCATTER), (x,))
    if m.local_experts > 1:
        x = tpl.add("bwd", "unsort_chunks", _rows_kernel("moe_sort_chunks", m.expert_rows, m.expert_rows, m,
                                                         False), (x,))
    return x


# ----- experts ---------------------------------------------------------------------------------------------
def experts_forward(tpl: Template, phase: str, d: LayerDims, m: MoeDims, x: int) -> int:
    """fc1, activation x probability, fc2 as grouped GEMMs; under run.fp8 each GEMM's input is quantized first
    (TE GroupedLinear quantizes every expert's split in one kernel: the same bytes as one tensor); with
    biases, fc2's is added eagerly after it (expert_bias.py)."""
    q = fp8.quantize(tpl, phase, d, "expert_fc1", m.expert_rows * m.hidden, False, (x,), d.fp8.wgrad)
    fc1 = tpl.add(phase, "expert_fc1", m.fc1_gemm(), q)
    act = expert_act(tpl, phase, m, (fc1,), False)
    q = fp8.quantize(tpl, phase, d, "expert_fc2", m.expert_rows * m.ffn, False, (act,), d.fp8.wgrad)
    return fc2_bias_forward(tpl, phase, m, (tpl.add(phase, "expert_fc2", m.fc2_gemm(), q),))[0]


def experts_backward(tpl: Template, d: LayerDims, m: MoeDims, g: int) -> tuple[int, int, tuple[int, int]]:
    """The eager fc2 bias's backward (with biases), grouped dgrad then wgrad of fc2, the activation's
    backward, fc1 (each output gradient quantized first under run.fp8); returns (input-gradient op,
    probability-gradient op, the two wgrad ops)."""
    fc1, fc2, w8 = m.fc1_gemm(), m.fc2_gemm(), d.fp8.on and d.fp8.wgrad
    if d.recomputes("moe_act"):  # the activation output fc2's wgrad needs, again
        expert_act(tpl, "recompute", m, (), False)
    g = fc2_bias_backward(tpl, m, (g,))[0]
    gq = fp8.quantize(tpl, "bwd", d, "expert_fc2", m.expert_rows * m.hidden, False, (g,), d.fp8.wgrad)
    dg2 = tpl.add("bwd", "expert_fc2_dgrad", dgrad(fc2), gq)
    w2 = tpl.add("bwd", "expert_fc2_wgrad", wgrad(fc2, d.grad_fusion, w8, d.main_grad_bytes), gq)
    act = expert_act(tpl, "bwd", m, (dg2,), True)
    aq = fp8.quantize(tpl, "bwd", d, "expert_fc1", m.expert_rows * m.fc1_n, False, (act,), d.fp8.wgrad)
    dg1 = tpl.add("bwd", "expert_fc1_dgrad", dgrad(fc1), aq)
    w1 = tpl.add("bwd", "expert_fc1_wgrad", wgrad(fc1, d.grad_fusion, w8, d.main_grad_bytes), aq)
    fc2_params = m.local_experts * (m.ffn * m.hidden + (m.hidden if m.bias else 0))
    tpl.expert_grads += [(w2, fc2_params), (w1, m.expert_params - fc2_params)]
    return dg1, act, (w2, w1)


# ----- the whole block -------------------------------------------------------------------------------------
def moe_forward(tpl: Template, phase: str, d: LayerDims, m: MoeDims, inp: Deps) -> int:
    """ln2 -> shared expert -> router -> dispatch -> experts -> combine -> (+ shared) -> residual add."""
    ln = tpl.add(phase, "ln2", ew.norm_fwd(d), inp)
    shared = shared_forward(tpl, phase, d, m, (ln,)) if m.shared_ffn else None
    r = tpl.add(phase, "router", m.router_gemm(), (ln,))
    r = tpl.add(phase, "route", _route(m, False), (r,))
    x = dispatch_forward(tpl, phase, m, r, ln)
    y = experts_forward(tpl, phase, d, m, x)
    out = combine_forward(tpl, phase, m, y)
    if shared is not None:
        out = tpl.add(phase, "shared_add", _add(m.tokens, 2, m), (out, shared))
    return tpl.add(phase, "mlp_res", ew.residual_fwd(d), (out,) + tuple(inp))


def moe_backward(tpl: Template, d: LayerDims, m: MoeDims, gin: Deps) -> int:
    """Backward of moe_forward; returns the op completing the block input's gradient. Recompute of
    `layernorm` re-runs ln2 first (its output, which the router and the shared expert's weight gradients
    read, was not kept; sim/schedule/shapes.RECOMPUTE_MODULES)."""
    if d.recomputes("layernorm"):
        tpl.add("recompute", "ln2", ew.norm_fwd(d), gin)
    g: Deps = (tpl.add("bwd", "mlp_res", ew.dropout_bwd(d), gin),) if d.dropout else gin
    shared = shared_backward(tpl, d, m, g) if m.shared_ffn else None
    y = combine_backward(tpl, m, g)
    dx, probs_g, _ = experts_backward(tpl, d, m, y)
    x = dispatch_backward(tpl, m, dx, probs_g)
    route = tpl.add("bwd", "route", _route(m, True), (x,))
    rg = m.router_gemm()
    r_dx = tpl.add("bwd", "router_dgrad", dgrad(rg), (route,))
    r_w = tpl.add("bwd", "router_wgrad", wgrad(rg, d.grad_fusion), (route,))
    tpl.grads.append((r_w, m.router_params))
    parts = (x, r_dx) + ((shared,) if shared is not None else ())
    total = tpl.add("bwd", "moe_grad_add", _add(m.tokens, len(parts), m), parts)
    ln = tpl.add("bwd", "ln2", ew.norm_bwd(d), (total,))
    return tpl.add("bwd", "ln2_grad_add", ew.residual_grad_add(d), (ln, *gin))
