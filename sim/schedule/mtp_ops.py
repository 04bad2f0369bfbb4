"""Multi-token prediction (Megatron-Core --mtp-num-layers; DeepSeek-V3 trains with one depth): the blocks it
adds beside the output layer and loss, as one head template.

MTP depth k (megatron/core/transformer/multi_token_prediction.py @d98e8a64, MultiTokenPredictionLayer):
the input ids shifted by k + 1 go through the shared embedding again (`_get_embeddings`); the embedding and
the hidden states of depth k - 1 (the decoder's output for k = 0) are normalized apart (enorm, hnorm),
concatenated to [s, b, 2h] and projected back to h by eh_proj, a column-parallel linear with
gather_output=False whose output is all-gathered over tp along the hidden dimension and, under SP, split
back along the sequence (`_concat_embeddings`); then one transformer layer of the decoder's last layer's
kind (MoE for DeepSeek-V3), its own final norm, the shared output layer and a cross-entropy
(`process_mtp_loss`), whose loss is added to the main loss. Backward runs the duals: the split's
all-gather (SP), eh_proj's dgrad and wgrad (under SP its [s, b, 2h] input is gathered again for the wgrad),
the entry's reduce-scatter (SP) or all-reduce over [s, b, 2h], the two norms, and the embedding's table
gradient.

Placement: every MTP depth runs on the virtual stage of the loss (Megatron: the last pipeline stage, or
the layout's 'm' segment, which scenarios/pipeline_checks.py requires to be the last), so the head
template carries them: forward MTP depths, then the main output layer and loss, then the loss sum;
backward the main head, then each depth from the last, and the hidden states' gradient is the main head's
plus depth 0's (an add kernel). The output layer is shared (its gradient accumulates into the main output
layer's, no parameters of its own); the embedding is shared too, except that with pp > 1 and untied
embeddings the loss's stage holds a copy (GPTModel builds the embedding where mtp_process is set), whose
gradient is all-reduced with the first stage's (finalize_model_grads.py `_allreduce_word_embedding_grads`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from meshsim.sim.core.units import FP32_BYTES
from meshsim.sim.schedule import fp8_ops as fp8
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.duality import region_boundaries
from meshsim.sim.schedule.elementwise_ops import norm_bwd, norm_fwd, residual_grad_add
from meshsim.sim.schedule.layer_ops import dgrad, main_grad_add, wgrad
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.sim.schedule.template import Template, TemplateOp

Ext = Mapping[str, int | str]  # a sub-template's external input -> an op of the host template, or its own input


def mtp_layer_ids(model) -> list[int]:
    """The layer numbers whose kind the MTP depths run (the decoder's last layer's, once per depth): what
    parameter, memory and FP8 weight counts add for them."""
    return [model.layers - 1] * model.mtp_layers


def model_layer_ids(model) -> list[int]:
    """Every transformer layer a step runs: the decoder's, then each MTP depth's (the last layer's kind)."""
    return list(range(model.layers)) + mtp_layer_ids(model)


def append(dst: Template, src: Template, prefix: str, ext: Ext, *, grads: bool = True) -> int:
    """Copy `src`'s ops into `dst` (suffixes prefixed, local deps shifted, external inputs resolved through
    `ext`); its grads / expert_grads too unless `grads` is False. Returns the offset of src's first op."""
    base = len(dst.ops)
    for op in src.ops:
        local = [base + i for i in op.local_deps]
        named = []
        for name in op.ext_deps:
            target = ext[name]  # KeyError: an input the caller did not wire
            (local if isinstance(target, int) else named).append(target)
        wait = None if op.host_wait is None else base + op.host_wait
        dst.ops.append(TemplateOp(prefix + op.suffix, op.stream, op.category, op.phase, op.work, tuple(local),
                                  tuple(named), op.host_calls, wait))
    if grads:
        dst.grads += [(base + i, n) for i, n in src.grads]
        dst.expert_grads += [(base + i, n) for i, n in src.expert_grads]
    return base


def eh_proj_gemm(d: LayerDims) -> Gemm:
    """[s b, 2h] x [2h, h / t]: this rank's columns of the projection."""
    return Gemm(d.tokens, d.hidden // d.tp, 2 * d.hidden, fp8=d.fp8.on)


def eh_proj_weights(d: LayerDims) -> int:
    """eh_proj's weight shard on this rank: 2h x h / t."""
    g = eh_proj_gemm(d)
    return g.k * g.n


def eh_proj_params(d: LayerDims) -> int:
    """eh_proj's weight shard plus the two input norms (the depth's final norm is the head's)."""
    return eh_proj_weights(d) + 2 * d.norm_params


def _entry(d: LayerDims, phase: str) -> Collective | None:
    """The column-parallel entry over the concatenated [s, b, 2h] input (f / sp_gather, by phase)."""
    op = region_boundaries(d.sp)[0].op(phase)
    return None if d.tp == 1 or op.value == "identity" else Collective(op.value, "tp", 2 * d.act_bytes, K.MTP_EH_IN)


def proj_forward(d: LayerDims) -> Template:
    """enorm(embedding "emb"), hnorm(hidden "in"), concat, eh_proj, gather over tp (+ SP split: no kernel)."""
    tpl = Template()
    en, hn = tpl.add("fwd", "mtp_enorm", norm_fwd(d), ("emb",)), tpl.add("fwd", "mtp_hnorm", norm_fwd(d), ("in",))
    n = d.tokens_out * d.hidden * d.dtype_bytes
    x = (tpl.add("fwd", "mtp_concat", Elementwise("concat", 2 * n, 2 * n), (en, hn)),)
    x = fp8.quantize(tpl, "fwd", d, "eh_proj", 2 * d.tokens_out * d.hidden, d.sp, x, d.fp8.wgrad)
    coll = fp8.fp8_gather(d, _entry(d, "fwd"))
    if coll is not None:
        x = (tpl.add("fwd", K.MTP_EH_IN, coll, x),)
    x = tpl.add("fwd", "eh_proj", eh_proj_gemm(d), x)
    if d.tp > 1:  # gather_from_tensor_model_parallel_region: all-gather along the hidden dimension
        x = tpl.add("fwd", K.MTP_EH_OUT, Collective("all_gather", "tp", d.act_bytes, K.MTP_EH_OUT), (x,))
    tpl.marks["out"] = x
    return tpl


def proj_backward(d: LayerDims) -> Template:
    """The duals of proj_forward from "gin": marks "gh" (the hidden input's gradient) and "ge" (the
    embedding output's)."""
    tpl = Template()
    g: tuple[int | str, ...] = ("gin",)
    regather: tuple[int, ...] = ()
    if d.sp:  # the SP split's backward gathers the sequence (the hidden gather's backward is a split) ...
        g = (tpl.add("bwd", K.MTP_SP_SPLIT, Collective("all_gather", "tp", d.act_bytes, K.MTP_SP_SPLIT), g),)
        gather = fp8.fp8_gather(d, Collective("all_gather", "tp", 2 * d.act_bytes, K.SP_REGATHER))
        regather = (tpl.add("bwd", K.MTP_EH_IN + K.REGATHER, gather, g),)  # ... and wgrad re-gathers the input
        regather = fp8.transpose_after_gather(tpl, d, "eh_proj", 2 * d.tokens * d.hidden, regather)
    dy = fp8.quantize(tpl, "bwd", d, "eh_proj", d.tokens * (d.hidden // d.tp), False, g, d.fp8.wgrad)
    dx = tpl.add("bwd", "eh_proj_dgrad", dgrad(eh_proj_gemm(d)), dy)
    w = tpl.add("bwd", "eh_proj_wgrad", wgrad(eh_proj_gemm(d), d.grad_fusion, d.fp8.on and d.fp8.wgrad),
                dy + regather)
    w = main_grad_add(tpl, d, "eh_proj", w, eh_proj_weights(d))
    tpl.grads.append((w, eh_proj_weights(d)))
    coll = _entry(d, "bwd")
    if coll is not None:
        dx = tpl.add("bwd", K.MTP_EH_IN, coll, (dx,))
    ge, gh = tpl.add("bwd", "mtp_enorm", norm_bwd(d), (dx,)), tpl.add("bwd", "mtp_hnorm", norm_bwd(d), (dx,))
    tpl.grads += [(ge, d.norm_params), (gh, d.norm_params)]
    tpl.marks.update(gh=gh, ge=ge)
    return tpl


def _loss_sum(d: LayerDims) -> Elementwise:
    """The MTP losses added to the main loss (one fp32 value per token each, MTPLossAutoScaler)."""
    return Elementwise("loss_add", 2 * d.tokens * FP32_BYTES, d.tokens * FP32_BYTES)


def head_forward_with_mtp(depths: int, d: LayerDims, head: Template, embed: Template, layer: Template) -> Template:
    """MTP depths 0..depths-1 on the decoder's output "in", then the main head; "out" sums the losses."""
    tpl, proj = Template(), proj_forward(d)
    hidden: int | str = "in"
    losses = []
    for k in range(depths):
        pre = f"{K.MTP_BLOCK}{k}."
        e = append(tpl, embed, pre, {}) + embed.marks["out"]
        p = append(tpl, proj, pre, {"in": hidden, "emb": e}) + proj.marks["out"]
        hidden = append(tpl, layer, pre, {"in": p}) + layer.marks["out"]
        losses.append(append(tpl, head, pre, {"in": hidden}) + head.marks["out"])
    main = append(tpl, head, "", {"in": "in"}) + head.marks["out"]
    tpl.marks["out"] = tpl.add("fwd", "mtp_loss_add", _loss_sum(d), (main, *losses))
    return tpl


def head_backward_with_mtp(depths: int, d: LayerDims, head: Template, mtp_head: Template, embed: Template,
                           layer: Template, own_embedding: bool) -> Template:
    """The main head's backward, then each depth from the last (head with the shared output layer, layer,
    projection, embedding; the embedding's gradient recorded once when the stage holds its own copy);
    "out" is the decoder output's gradient, the main head's plus depth 0's."""
    tpl, proj = Template(), proj_backward(d)
    main = append(tpl, head, "", {"loss": "loss"}) + head.marks["out"]
    later: int | None = None  # depth k + 1's gradient into depth k's output
    for k in reversed(range(depths)):
        pre = f"{K.MTP_BLOCK}{k}."
        g = append(tpl, mtp_head, pre, {"loss": "loss"}) + mtp_head.marks["out"]
        if later is not None:
            g = tpl.add("bwd", "mtp_grad_add", residual_grad_add(d), (g, later))
            tpl.ops[g] = replace(tpl.ops[g], suffix=pre + tpl.ops[g].suffix)  # named within its depth
        g = append(tpl, layer, pre, {"gin": g}) + layer.marks["out"]
        base = append(tpl, proj, pre, {"gin": g})
        append(tpl, embed, pre, {"gin": base + proj.marks["ge"]}, grads=own_embedding and k == 0)
        later = base + proj.marks["gh"]
    tpl.marks["out"] = tpl.add("bwd", "mtp_grad_add", residual_grad_add(d), (main, later))
    return tpl
