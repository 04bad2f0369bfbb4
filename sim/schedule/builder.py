"""Assemble one training step on one rank: `build_schedule(rs) -> Schedule`.

Order (gradient accumulation, no pipelining): for each micro-batch, embedding -> layers 0..L-1 forward
-> head forward (output layer + cross-entropy) -> head backward -> layers L-1..0 backward -> embedding
backward; then the step end (SP gradient all-reduce, DP buckets, optimizer step, parameter gather;
sim/schedule/dp_ops.py). Each block's ops are built once as a template (layer_ops.py, head_ops.py) and
stamped per (layer, micro-batch) with ids offset and names prefixed "L{layer}.mb{mb}." (layers),
"embed.mb{mb}.", "head.mb{mb}."; op ids equal list positions and every dep points to an earlier op.
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.dp_ops import DpConfig, bucket_bytes, make_buckets, step_end_ops
from meshsim.sim.schedule.head_ops import embedding_backward, embedding_forward, head_backward, head_forward
from meshsim.sim.schedule.layer_ops import Template, backward_template, forward_template
from meshsim.sim.schedule.ops import Op, Schedule
from meshsim.sim.schedule.param_gather import fill_param_gathers, reserved_gathers
from meshsim.sim.schedule.run_settings import grad_reduce_bytes
from meshsim.sim.schedule.shapes import LayerDims, layer_dims


def stamp(tpl: Template, ops: list[Op], prefix: str, ext: dict[str, int], layer: int | None,
          mb: int) -> int:
    """Append `tpl`'s ops to `ops` (ids from len(ops)); returns the base id."""
    base = len(ops)
    append = ops.append
    for i, t in enumerate(tpl.ops):
        if t.ext_deps:
            deps = tuple([base + d for d in t.local_deps] + [ext[e] for e in t.ext_deps])
        else:
            deps = tuple([base + d for d in t.local_deps])
        append(Op(base + i, prefix + t.suffix, t.stream, t.category, t.phase, t.work, deps, layer, mb))
    return base


class Templates:
    def __init__(self, d: LayerDims, tied: bool):
        self.fwd, self.bwd = forward_template(d), backward_template(d)
        self.embed_fwd, self.embed_bwd = embedding_forward(d), embedding_backward(d)
        self.head_fwd, self.head_bwd = head_forward(d), head_backward(d, tied)


def _micro_batch(ops: list[Op], t: Templates, layers: int, mb: int,
                 grads: list[tuple[int, int]] | None) -> None:
    """Stamp one micro-batch's forward and backward; record gradient producers into `grads` if given."""
    base = stamp(t.embed_fwd, ops, f"{K.EMBED_BLOCK}.mb{mb}.", {}, None, mb)
    x = base + t.embed_fwd.marks["out"]
    for layer in range(layers):
        x = stamp(t.fwd, ops, f"{K.layer_block(layer)}.mb{mb}.", {"in": x}, layer, mb) + t.fwd.marks["out"]
    base = stamp(t.head_fwd, ops, f"{K.HEAD_BLOCK}.mb{mb}.", {"in": x}, None, mb)
    blocks = [(t.head_bwd, f"{K.HEAD_BLOCK}.mb{mb}.", None)]
    blocks += [(t.bwd, f"{K.layer_block(layer)}.mb{mb}.", layer) for layer in reversed(range(layers))]
    blocks.append((t.embed_bwd, f"{K.EMBED_BLOCK}.mb{mb}.", None))
    g = base + t.head_fwd.marks["out"]
    ext = "loss"
    for tpl, prefix, layer in blocks:
        base = stamp(tpl, ops, prefix, {ext: g}, layer, mb)
        g, ext = base + tpl.marks["out"], "gin"
        if grads is not None:
            grads += [(base + i, n) for i, n in tpl.grads]


def _grad_params(t: Templates, layers: int) -> list[int]:
    """Parameter counts of one micro-batch's gradient producers in backward order (as _micro_batch
    records them): the head, the layers last to first, the embedding."""
    per_layer = [n for _, n in t.bwd.grads]
    return [n for _, n in t.head_bwd.grads] + per_layer * layers + [n for _, n in t.embed_bwd.grads]


def dp_bucket_bytes(rs: ResolvedScenario) -> int:
    """DP gradient bucket size (sim/schedule/dp_ops.bucket_bytes)."""
    return bucket_bytes(rs.scenario.parallel.dp_bucket_mib, rs.dp)


def dp_config(rs: ResolvedScenario, d: LayerDims, params: int) -> DpConfig:
    p, layers = rs.scenario.parallel, rs.scenario.model.layers
    sp_params = layers * d.sp_params_per_layer + d.norm_params if d.sp else 0
    # replicated KV head (kv_heads < tp): this rank's K and V projections, [h, head_dim] each, + biases
    kv_params = layers * 2 * d.head_dim * (d.hidden + (1 if d.bias else 0)) if rs.kv_replicas > 1 else 0
    return DpConfig(dp=rs.dp, distributed_optimizer=p.distributed_optimizer, overlap=p.dp_overlap,
                    gather_overlap=p.param_gather_overlapped,
                    bucket_bytes=dp_bucket_bytes(rs), sp_grad_params=sp_params, params=params,
                    kv_grad_params=kv_params, grad_bytes=grad_reduce_bytes(rs.scenario))


def build_schedule(rs: ResolvedScenario) -> Schedule:
    """The ops one rank runs in a training step (all ranks of a symmetric TP x DP mesh run the same)."""
    d = layer_dims(rs)
    model = rs.scenario.model
    t = Templates(d, model.tied_embeddings)
    p = rs.scenario.parallel
    overlap_gather = rs.dp > 1 and p.distributed_optimizer and p.param_gather_overlapped  # sim/schedule/param_gather.py
    bucket_bytes = dp_bucket_bytes(rs)
    reserved = reserved_gathers(_grad_params(t, model.layers), bucket_bytes) if overlap_gather else 0
    ops: list[Op] = [None] * reserved  # slots for the gathers that open the step
    grads: list[tuple[int, int]] = []
    for mb in range(rs.micro_batches):
        _micro_batch(ops, t, model.layers, mb, grads if mb == rs.micro_batches - 1 else None)
    params = sum(n for _, n in grads)
    ops += step_end_ops(len(ops), grads, len(ops) - 1, dp_config(rs, d, params))
    if overlap_gather:
        ops = fill_param_gathers(ops, make_buckets(grads, bucket_bytes))
    meta = {"chunks": d.chunks, "params_per_rank": params, "padded_vocab": d.vocab * d.tp,
            "grad_producers": len(grads)}
    return Schedule(tuple(ops), rs.tp, rs.dp, rs.micro_batches, meta, kv_replicas=rs.kv_replicas)
