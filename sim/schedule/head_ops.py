"""Embedding, vocab-parallel output layer and cross-entropy ops on one TP rank (per micro-batch templates).

Embedding (Megatron VocabParallelEmbedding): each rank looks up the tokens whose ids fall in its
vocab/t shard (others give zeros), then the shards are summed by the region's exit operator
(g: all-reduce; SP: sp_scatter's reduce-scatter, leaving the output sequence-sharded), then dropout.

Output layer: final norm, the region's entry operator (f, or sp_gather's all-gather), logits GEMM
m = s*b, n = V_pad/t, k = h. Vocab-parallel cross-entropy (Megatron vocab_parallel_cross_entropy) on
fp32 logits: local max -> all-reduce(max) -> subtract, exp, local sum and predicted logit ->
all-reduce(predicted logit), all-reduce(sum-exp) -> loss and softmax (kept for backward). Each
all-reduce moves b*s fp32 values (b*s*4 bytes). Backward: dlogits = softmax - onehot, then the logits
GEMM's dgrad/wgrad with the entry operator's backward collective (and the SP re-gather for wgrad).

Tied embeddings: the output layer reads the embedding table; its gradient accumulates into the same
main-grad, so it is counted once (at the embedding, the last gradient produced in backward).

run.fp8_output_proj (MXFP8 only; Megatron's TELMHeadColumnParallelLinear, gpt_model.py L271-275 @d98e8a64): the
logits GEMM's forward, dgrad and wgrad run FP8 with the quantize kernels and FP8 gathers of a column-parallel
TE linear (sim/schedule/fp8_ops.py): its input quantized on the sequence shard, dlogits before dgrad / wgrad.
"""

from __future__ import annotations

from dataclasses import replace

from meshsim.sim.core.units import FP32_BYTES
from meshsim.sim.schedule import fp8_ops as fp8
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.duality import region_boundaries
from meshsim.sim.schedule.elementwise_ops import dropout_bwd, norm_bwd, norm_fwd
from meshsim.sim.schedule.fp8_rules import Fp8Plan
from meshsim.sim.schedule.layer_ops import (
    boundary_collective,
    comm_then_gemm,
    dgrad,
    gemm_then_comm,
    main_grad_add,
    regather_collective,
    wgrad,
)
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.sim.schedule.template import Template

FP32 = FP32_BYTES
TOKEN_ID_BYTES = 8  # int64 token ids


def _embed_dropout(d: LayerDims) -> Elementwise:
    n = d.tokens_out * d.hidden * d.dtype_bytes
    return Elementwise("dropout", n, n + d.tokens_out * d.hidden)


def embedding_forward(d: LayerDims) -> Template:
    tpl = Template()
    lookup = Elementwise("embedding", d.act_bytes + d.tokens * TOKEN_ID_BYTES, d.act_bytes)
    x = tpl.add("fwd", "lookup", lookup)
    coll = boundary_collective(d, region_boundaries(d.sp)[1], "fwd")
    if coll is not None:
        x = tpl.add("fwd", K.EMBED_OUT, coll, (x,))
    if d.dropout:
        x = tpl.add("fwd", "dropout", _embed_dropout(d), (x,))
    tpl.marks["out"] = x
    return tpl


def embedding_backward(d: LayerDims) -> Template:
    """Dropout backward, the exit operator's backward (SP: all-gather), then the table gradient: a
    scatter-add of s*b rows of h into the fp32 main grad (read rows, read+write touched grad rows)."""
    tpl = Template()
    g: tuple[int | str, ...] = ("gin",)
    if d.dropout:
        g = (tpl.add("bwd", "dropout", dropout_bwd(d), g),)
    coll = boundary_collective(d, region_boundaries(d.sp)[1], "bwd")
    if coll is not None:
        g = (tpl.add("bwd", K.EMBED_OUT, coll, g),)
    rows = d.tokens * d.hidden
    ids = d.tokens * TOKEN_ID_BYTES
    grad = Elementwise("embedding_bwd", rows * (d.dtype_bytes + FP32) + ids, rows * FP32)
    out = tpl.add("bwd", "embed_wgrad", grad, g)
    tpl.grads.append((out, d.vocab * d.hidden))
    tpl.marks["out"] = out
    return tpl


def logits_gemm(d: LayerDims) -> Gemm:
    return Gemm(d.tokens, d.vocab, d.hidden, fp8=d.fp8.on)


def head_dims(d: LayerDims) -> LayerDims:
    """The layer dims the output layer runs with: FP8 only with run.fp8_output_proj, else 16-bit."""
    return d if d.fp8.output_proj or not d.fp8.on else replace(d, fp8=Fp8Plan())


def _xent_kernels(d: LayerDims) -> dict[str, Elementwise]:
    """Cross-entropy kernels over this rank's T x V/t logits (fp32 copy of the bf16 GEMM output)."""
    lg16, lg32, tok = d.tokens * d.vocab * d.dtype_bytes, d.tokens * d.vocab * FP32, d.tokens * FP32
    return {
        "xent_max": Elementwise("xent_max", lg16, lg32 + tok),  # cast to fp32, row max
        "xent_exp": Elementwise("xent_exp", lg32 + tok, lg32 + 2 * tok),  # x - max, exp, sum, target
        "xent_loss": Elementwise("xent_loss", lg32 + 3 * tok, lg32 + tok),  # softmax = exp / sum, loss
        "xent_grad": Elementwise("xent_bwd", lg32 + 2 * tok, lg16),  # (softmax - onehot) * dloss -> bf16
    }


def _xent_all_reduce(tpl: Template, d: LayerDims, purpose: str, deps: tuple[int, ...]) -> tuple[int, ...]:
    """All-reduce of one fp32 value per token over tp (none when tp = 1)."""
    if d.tp == 1:
        return deps
    return (tpl.add("fwd", purpose + K.ALL_REDUCE, Collective("all_reduce", "tp", d.tokens * FP32, purpose), deps),)


def head_forward(d: LayerDims) -> Template:
    k, d = _xent_kernels(d), head_dims(d)
    tpl = Template()
    ln = tpl.add("fwd", "final_ln", norm_fwd(d), ("in",))
    x = fp8.quantize(tpl, "fwd", d, "logits", d.tokens_out * d.hidden, d.sp, (ln,), d.fp8.wgrad)
    coll = fp8.fp8_gather(d, boundary_collective(d, region_boundaries(d.sp)[0], "fwd"))
    # Megatron's output layer is its own ColumnParallelLinear (no userbuffers: tp_comm_buffer_name unused)
    _, logits = comm_then_gemm(tpl, "fwd", K.HEAD_IN, coll, "logits", logits_gemm(d), x, 1)
    mx = _xent_all_reduce(tpl, d, K.XENT_MAX, (tpl.add("fwd", "xent_max", k["xent_max"], logits),))
    ex = (tpl.add("fwd", "xent_exp", k["xent_exp"], mx),)
    red = _xent_all_reduce(tpl, d, K.XENT_PRED, ex) + _xent_all_reduce(tpl, d, K.XENT_SUM, ex)
    tpl.marks["out"] = tpl.add("fwd", "xent_loss", k["xent_loss"], tuple(dict.fromkeys(red)))
    return tpl


def head_backward(d: LayerDims, tied: bool) -> Template:
    entry, d = region_boundaries(d.sp)[0], head_dims(d)
    tpl = Template()
    g = tpl.add("bwd", "xent_grad", _xent_kernels(d)["xent_grad"], ("loss",))
    dy = fp8.quantize(tpl, "bwd", d, "logits", d.tokens * d.vocab, False, (g,), d.fp8.wgrad)
    regather: tuple[int, ...] = ()
    if d.sp:  # SP implies tp > 1
        regather = (tpl.add("bwd", K.HEAD_IN + K.REGATHER, fp8.fp8_gather(d, regather_collective(d)), (g,)),)
        regather = fp8.transpose_after_gather(tpl, d, "logits", d.tokens * d.hidden, regather)
    coll = boundary_collective(d, entry, "bwd")
    overlap = d.tp_grad_overlap or coll is None  # else 2020: after wgrad (sim/schedule/run_settings.py)
    if overlap:
        ready = gemm_then_comm(tpl, "bwd", "logits_dgrad", dgrad(logits_gemm(d)), dy, K.HEAD_IN, coll, 1)
    else:
        dg = tpl.add("bwd", "logits_dgrad", dgrad(logits_gemm(d)), dy)
    w = tpl.add("bwd", "logits_wgrad", wgrad(logits_gemm(d), d.grad_fusion, d.fp8.on and d.fp8.wgrad, d.main_grad_bytes),
                dy + regather)
    if not tied:
        w = main_grad_add(tpl, d, "logits", w, d.vocab * d.hidden)
    if not overlap:
        ready = (tpl.add("bwd", K.HEAD_IN, coll, (dg, w)),)
    out = tpl.add("bwd", "final_ln", norm_bwd(d), ready)
    if not tied:
        tpl.grads.append((w, d.vocab * d.hidden))
    tpl.grads.append((out, d.norm_params))
    tpl.marks["out"] = out
    return tpl
