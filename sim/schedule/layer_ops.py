"""One transformer layer's ops on one TP rank: forward, backward and recompute templates.

A `Template` (sim/schedule/template.py) records ops with deps relative to its first op (ints) or named
external inputs (strs: "in" = the layer input's producer, "gin" = the producer of the gradient of the
layer output); the builder stamps it once per (layer, micro-batch), so building 80 layers x 4
micro-batches costs one template plus cheap copies. The elementwise kernels' bytes are in
elementwise_ops.py, the attention core in attention_core.py.

Shapes (Megatron [s, b, h]; t = tp): GEMM m = s*b tokens inside TP regions; LayerNorm, dropout and
residual kernels see s*b/t tokens under SP (sequence-sharded), s*b otherwise. Column-parallel GEMMs
(qkv, fc1) shard n, row-parallel GEMMs (proj, fc2) shard k. Every TP/SP boundary collective comes from
the duality table (`region_boundaries(sp)`, `Boundary.op(phase)`); nothing here names f or g's op.

Backward of a linear Y[T,N] = X[T,K] W[K,N]: dgrad dX = dY W^T -> Gemm(T, K, N); wgrad dW = X^T dY ->
Gemm(K, N, T). Megatron computes dgrad first, launches the input-gradient collective asynchronously,
then computes wgrad, so the collective overlaps wgrad (run.tp_grad_reduce_overlap: false, the 2020 code,
issues it after wgrad and the bias gradient instead). Under SP the column-parallel layer's input was
stored sequence-sharded, so backward all-gathers it again ("{entry}_regather", issued before dgrad);
wgrad depends on that gather, dgrad does not.

Deps are data deps within a phase. A layer's backward needs its forward (or recompute) activations;
that order is implied by the compute stream's FIFO order and not repeated as deps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from meshsim.sim.schedule import fp8_ops as fp8
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.attention_core import attention_backward, attention_forward
from meshsim.sim.schedule.duality import Boundary, CommOp, region_boundaries
from meshsim.sim.schedule.elementwise_ops import (
    act_bwd,
    act_fwd,
    dropout_bwd,
    norm_bwd,
    norm_fwd,
    residual_fwd,
    residual_grad_add,
)
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm
from meshsim.sim.schedule.run_settings import MAIN_GRAD_ADD_BYTES
from meshsim.sim.schedule.shapes import USERBUFFERS, LayerDims
from meshsim.sim.schedule.template import Deps, Template


def boundary_collective(d: LayerDims, boundary: Boundary, phase: str) -> Collective | None:
    """The collective a duality-table boundary issues in `phase` on a full [s, b, h] activation over the
    tp group; None for the identity or when tp = 1 (a group of one communicates nothing)."""
    op = boundary.op(phase)
    if op is CommOp.IDENTITY or d.tp == 1:
        return None
    return Collective(op.value, "tp", d.act_bytes, boundary.name)


def regather_collective(d: LayerDims) -> Collective:
    """SP backward: the column-parallel layer's input was stored sequence-sharded, so it is gathered again
    (the entry boundary's forward collective) for the weight-gradient GEMM."""
    return Collective(region_boundaries(True)[0].op("fwd").value, "tp", d.act_bytes, K.SP_REGATHER)


def split(total: int, chunks: int) -> list[int]:
    """`total` in `chunks` near-equal integer parts (the first ones one larger)."""
    base, extra = divmod(total, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def comm_then_gemm(tpl: Template, phase: str, ckey: str, coll: Collective | None, gkey: str, gemm: Gemm,
                   deps: Deps, chunks: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(all-gather -> GEMM); returns (collective op indices, GEMM op indices).

    chunks > 1 (tp_comm_overlap: chunks = tp) is Transformer Engine's ring exchange (userbuffers
    split_overlap_ag, comm_gemm_overlap.cpp @d0067d0): step 0's GEMM runs on the rank's own shard at once,
    while each shard moves one rank along the ring; step i's GEMM runs on the shard step i - 1 received.
    The tp - 1 moves are chained ring shifts (`send_recv` over the group) of one shard, nbytes / tp."""
    if coll is None:
        return (), (tpl.add(phase, gkey, gemm, deps),)
    if chunks <= 1 or coll.op != "all_gather":
        c = tpl.add(phase, ckey, coll, deps)
        return (c,), (tpl.add(phase, gkey, gemm, (c,)),)
    shift = replace(coll, op="send_recv", nbytes=coll.nbytes // chunks)
    cs, gs = [], []
    for i, m in enumerate(split(gemm.m, chunks)):
        gs.append(tpl.add(phase, f"{gkey}_c{i}", replace(gemm, m=m), (cs[-1],) if cs else deps))
        if i < chunks - 1:
            cs.append(tpl.add(phase, f"{ckey}_c{i}", shift, (cs[-1],) if cs else deps))
    return tuple(cs), tuple(gs)


def gemm_then_comm(tpl: Template, phase: str, gkey: str, gemm: Gemm, deps: Deps, ckey: str,
                   coll: Collective | None, chunks: int) -> tuple[int, ...]:
    """(GEMM -> collective), chunked along m (tp_comm_overlap's pipeline: chunk i's collective overlaps
    chunk i + 1's GEMM); returns what consumers depend on (the collectives or GEMM)."""
    if coll is None:
        return (tpl.add(phase, gkey, gemm, deps),)
    if chunks <= 1:
        g = tpl.add(phase, gkey, gemm, deps)
        return (tpl.add(phase, ckey, coll, (g,)),)
    cs = []
    for i, (m, nbytes) in enumerate(zip(split(gemm.m, chunks), split(coll.nbytes, chunks), strict=True)):
        g = tpl.add(phase, f"{gkey}_c{i}", replace(gemm, m=m), deps)
        cs.append(tpl.add(phase, f"{ckey}_c{i}", replace(coll, nbytes=nbytes), (g,)))
    return tuple(cs)


def pipelined(coll: Collective | None, chunks: int) -> Collective | None:
    """The collective of tp_comm_overlap's pipelined GEMM chunks: moved by userbuffers (shapes.USERBUFFERS)."""
    return replace(coll, kernel=USERBUFFERS) if coll is not None and chunks > 1 else coll


def dgrad(g: Gemm) -> Gemm:
    return Gemm(g.m, g.k, g.n, g.batch, fp8=g.fp8)


def wgrad(g: Gemm, fused_accumulation: bool = False, fp8: bool | None = None, main_grad_bytes: int = 4) -> Gemm:
    """dW = X^T dY; with gradient-accumulation fusion the GEMM accumulates into the main grad, C = C + X^T dY:
    it reads and writes `main_grad_bytes` per element (fp32: 4 + 4, ops.FUSED_WGRAD_OUT_BYTES; a bf16 main grad: 2 + 2,
    TE linear.py L1250-1262 @d0067d0: out_dtype = main_grad.dtype, out = main_grad). In FP8 when the forward
    GEMM is (`fp8` None) or as given (run.fp8_wgrad false: 16-bit)."""
    out_bytes = 2 * main_grad_bytes if fused_accumulation else 2
    return Gemm(g.k, g.n, g.m, g.batch, out_bytes, fp8=g.fp8 if fp8 is None else fp8)


# ----- one block (attention or MLP): norm -> entry -> column GEMM -> middle -> row GEMM -> exit -> add --
@dataclass(frozen=True)
class Block:
    norm: str
    entry: str
    col: str
    row: str
    exit: str
    res: str
    col_gemm: Gemm
    row_gemm: Gemm
    middle_fwd: Callable[[Template, str, LayerDims, Deps], tuple[int, ...]]
    middle_bwd: Callable[[Template, LayerDims, Deps], tuple[int, ...]]


def block_forward(tpl: Template, phase: str, d: LayerDims, blk: Block, inp: Deps) -> int:
    """Forward of one block; returns the residual-add op (the block output)."""
    entry, exit_ = region_boundaries(d.sp)
    ln = tpl.add(phase, blk.norm, norm_fwd(d), inp)
    q = fp8.quantize(tpl, phase, d, blk.col, d.tokens_out * d.hidden, d.sp, (ln,), d.fp8.wgrad)
    coll = fp8.fp8_gather(d, boundary_collective(d, entry, "fwd"))
    _, col = comm_then_gemm(tpl, phase, blk.entry, coll, blk.col, blk.col_gemm, q, d.chunks)
    mid = blk.middle_fwd(tpl, phase, d, col)
    mid = fp8.quantize(tpl, phase, d, blk.row, d.tokens * blk.row_gemm.k, False, mid, d.fp8.wgrad)
    out = gemm_then_comm(tpl, phase, blk.row, replace(blk.row_gemm, comm_sms=d.comm_sms), mid, blk.exit,
                         pipelined(boundary_collective(d, exit_, "fwd"), d.rs_chunks), d.rs_chunks)
    return tpl.add(phase, blk.res, residual_fwd(d), out + inp)


def block_backward(tpl: Template, d: LayerDims, blk: Block, gin: Deps) -> int:
    """Backward of one block; returns the op that completes the gradient of the block input (the residual add)."""
    entry, exit_ = region_boundaries(d.sp)
    g: Deps = (tpl.add("bwd", blk.res, dropout_bwd(d), gin),) if d.dropout else gin
    g = fp8.quantize(tpl, "bwd", d, blk.row, d.tokens_out * d.hidden, d.sp, g, d.fp8.wgrad)
    coll = fp8.fp8_gather(d, boundary_collective(d, exit_, "bwd"), both_copies=True)
    cs, dg = comm_then_gemm(tpl, "bwd", blk.exit, coll, f"{blk.row}_dgrad", dgrad(blk.row_gemm), g, d.chunks)
    row_dy = fp8.transpose_after_gather(tpl, d, blk.row, d.tokens * d.hidden, cs or g)
    row_w = tpl.add("bwd", f"{blk.row}_wgrad", wgrad(blk.row_gemm, d.grad_fusion, d.fp8.on and d.fp8.wgrad, d.main_grad_bytes), row_dy)
    mid = blk.middle_bwd(tpl, d, dg)
    mid = fp8.quantize(tpl, "bwd", d, blk.col, d.tokens * blk.col_gemm.n, False, mid, d.fp8.wgrad)
    regather: tuple[int, ...] = ()
    if d.sp:
        regather = (tpl.add("bwd", blk.entry + K.REGATHER, fp8.fp8_gather(d, regather_collective(d)), mid),)
        regather = fp8.transpose_after_gather(tpl, d, blk.col, d.tokens * d.hidden, regather)
    coll = boundary_collective(d, entry, "bwd")
    if d.tp_grad_overlap or coll is None:  # bulk-overlapped with wgrad
        ready = gemm_then_comm(tpl, "bwd", f"{blk.col}_dgrad", replace(dgrad(blk.col_gemm), comm_sms=d.comm_sms),
                               mid, blk.entry, coll, 1)
    else:
        dg_col = tpl.add("bwd", f"{blk.col}_dgrad", dgrad(blk.col_gemm), mid)
    col_w = tpl.add("bwd", f"{blk.col}_wgrad", replace(wgrad(blk.col_gemm, d.grad_fusion, d.fp8.on and d.fp8.wgrad, d.main_grad_bytes),
                                                       comm_sms=d.comm_sms), mid + regather)
    row_w = bias_grad(tpl, d, blk.row, blk.row_gemm, main_grad_add(tpl, d, blk.row, row_w, d.params(blk.row_gemm)))
    col_w = bias_grad(tpl, d, blk.col, blk.col_gemm, main_grad_add(tpl, d, blk.col, col_w, d.params(blk.col_gemm)))
    tpl.grads += [(row_w, d.params(blk.row_gemm)), (col_w, d.params(blk.col_gemm))]
    if not (d.tp_grad_overlap or coll is None):  # 2020: after the whole linear backward (run_settings.py)
        ready = (tpl.add("bwd", blk.entry, coll, (dg_col, col_w)),)
    ln = tpl.add("bwd", blk.norm, norm_bwd(d), ready)
    return tpl.add("bwd", f"{blk.norm}_grad_add", residual_grad_add(d), (ln, *gin))


def bias_grad(tpl: Template, d: LayerDims, key: str, g: Gemm, after: int) -> int:
    """The bias gradient db = sum over tokens of dY, a separate reduction kernel in Megatron's linear layers
    (ColumnParallelLinear / RowParallelLinear backward: grad_output.sum(0)): reads the T x n output
    gradient, writes n fp32 values. Row-parallel layers see the full hidden width on every TP rank, so
    this work does not shrink with tp. None without biases; returns the gradient's last producer."""
    if not d.bias:
        return after
    kernel = Elementwise("bias_grad", g.m * g.n * d.dtype_bytes, g.n * 4)
    return tpl.add("bwd", f"{key}_bias_grad", kernel, (after,))


def main_grad_add(tpl: Template, d: LayerDims, key: str, wgrad_op: int, params: int) -> int:
    """Without gradient-accumulation fusion wgrad writes a 16-bit grad that one more kernel adds into the
    fp32 main grad (sim/schedule/run_settings.MAIN_GRAD_ADD_BYTES per parameter); returns the grad's producer."""
    if d.grad_fusion:
        return wgrad_op
    read, write = MAIN_GRAD_ADD_BYTES
    return tpl.add("bwd", f"{key}_main_grad_add", Elementwise("main_grad_add", read * params, write * params),
                   (wgrad_op,))


def _act_fwd(tpl: Template, phase: str, d: LayerDims, deps: Deps) -> tuple[int, ...]:
    return (tpl.add(phase, "act", act_fwd(d), deps),)


def _act_bwd(tpl: Template, d: LayerDims, deps: Deps) -> tuple[int, ...]:
    return (tpl.add("bwd", "act", act_bwd(d), deps),)


def blocks(d: LayerDims) -> tuple[Block, Block]:
    attn = Block("ln1", K.ATTN_IN, "qkv", "proj", K.ATTN_OUT, "attn_res", d.qkv_gemm(), d.proj_gemm(),
                 attention_forward, attention_backward)
    mlp = Block("ln2", K.MLP_IN, "fc1", "fc2", K.MLP_OUT, "mlp_res", d.fc1_gemm(), d.fc2_gemm(),
                _act_fwd, _act_bwd)
    return attn, mlp


def layer_forward(tpl: Template, phase: str, d: LayerDims, inp: Deps) -> int:
    attn, mlp = blocks(d)
    x = block_forward(tpl, phase, d, attn, inp)
    return block_forward(tpl, phase, d, mlp, (x,))


def forward_template(d: LayerDims) -> Template:
    tpl = Template()
    tpl.marks["out"] = layer_forward(tpl, "fwd", d, ("in",))
    return tpl


def backward_template(d: LayerDims) -> Template:
    """Backward of one layer (full recompute: the layer's forward again first, phase 'recompute')."""
    tpl = Template()
    if d.recompute == "full":
        layer_forward(tpl, "recompute", d, ())
    attn, mlp = blocks(d)
    if d.recomputes("mlp"):
        block_forward(tpl, "recompute", d, mlp, ())
    g = block_backward(tpl, d, mlp, ("gin",))
    out = block_backward(tpl, d, attn, (g,))
    tpl.grads.append((out, d.norm_params_per_layer))
    tpl.marks["out"] = out
    return tpl
