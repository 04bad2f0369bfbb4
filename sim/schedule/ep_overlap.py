"""Megatron-Core's combined 1F1B without pipelining (parallel.moe_ep_overlap, --overlap-moe-expert-parallel-comm):
the forward of micro-batch i and the backward of micro-batch i - 1 run as one step, layer by layer, so the
expert-parallel all-to-alls of one overlap the other's compute.

Megatron-LM d98e8a64:
- megatron/core/pipeline_parallel/combined_1f1b.py combined_1f1b_schedule_for_no_pipelining (L35-135):
  F0 alone, then (F1 + B0), (F2 + B1), ..., then B(n-1) alone (schedules.py L778 picks it when the flag is
  on and pp = 1);
- megatron/core/models/common/model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.run (L500-630):
  embedding forward, loss / output-layer backward, then forward layer l paired with backward layer L-1-l,
  then layer 0's deferred attention weight gradients, the output layer + loss forward, the embedding backward;
- TransformerLayerSchedulePlan.run (L236-303) issues one pair of layers in this order (comm = the
  communication stream, ep_comm here; comp = the compute stream):
      b.combine (comm), f.pre_dispatch (comp), b.mlp (comp), f.dispatch (comm), b.mlp_dw (comp),
      b.dispatch (comm), f.mlp (comp), f.combine (comm), b.pre_dispatch (comp), b.pre_dispatch_dw (comp,
      not for the layer that ends the backward);
- megatron/core/pipeline_parallel/utils.py ScheduleNode.stream_acquire_context (L323-345): every node of one
  micro-batch's plan waits on, then records, the plan's one CUDA event, so a micro-batch's nodes run one
  after the other whatever their stream; the forward and the backward plan have an event each, so only
  stream order ties them. backward_dw (models/common/utils.py L323-358) neither waits nor records.
Here: a node's first ops depend on the previous node's sinks in the same micro-batch and direction (the
event), stream order is list order (the engine's FIFO rule), and the dispatch / combine nodes' ops all run
on ep_comm (their kernels too: the unpermute and the residual add are in Megatron's combine node). The
nodes and what delay_wgrad_compute moves are in sim/schedule/ep_nodes.py. Costs are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.ep_nodes import COMM_NODES, LayerNodes, layer_nodes
from meshsim.sim.schedule.ops import Op
from meshsim.sim.schedule.template import Template


@dataclass
class Chain:
    """One micro-batch's schedule plan (its forward, then its backward): the sinks of its last node (the
    plan's CUDA event) and the output op of its last block."""

    mb: int
    last: tuple[int, ...] = ()
    out: int | None = None  # the last block's output op (the next block's "in" / "gin" / "loss")
    gate: tuple[int, ...] = ()  # what the plan's next op also waits for (a P2P receive, a blocking batch)


@dataclass(frozen=True)
class Side:
    """One model chunk's plan in a combined step: its chain, its layers (global indices, forward order), and
    whether it runs the embedding (pre_process) and the output layer + loss (post_process)."""

    chain: Chain
    layers: Sequence[int]
    embedding: bool = True
    head: bool = True


@dataclass
class Stamp:
    """One template stamped for one (block, micro-batch): template index -> op id, filled node by node."""

    tpl: Template
    nodes: LayerNodes
    prefix: str
    ext: dict[str, int]
    layer: int | None
    chain: Chain
    ids: dict[int, int] = field(default_factory=dict)


class Emitter:
    """Appends the nodes of stamped templates to `ops` in Megatron's issue order (op id = list position)."""

    def __init__(self, ops: list[Op], delay_wgrad: bool):
        self.ops, self.delay = ops, delay_wgrad
        self._nodes: dict[tuple[int, bool], LayerNodes] = {}
        self.grads: list[tuple[int, int]] | None = None
        self.expert_grads: list[tuple[int, int]] | None = None

    def nodes(self, tpl: Template, backward: bool, split: bool) -> LayerNodes:
        """The template's nodes (`split` False: the whole template is one node, as embedding and head)."""
        key = (id(tpl), backward)
        hit = self._nodes.get(key)
        if hit is None:
            if split:
                hit = layer_nodes(tpl, backward, self.delay)
            else:
                whole = tuple(range(len(tpl.ops)))
                hit = LayerNodes({"all": whole}, {"all": node_sinks_all(tpl)})
            self._nodes[key] = hit
        return hit

    def stamp(self, tpl: Template, chain: Chain, prefix: str, ext_key: str, layer: int | None,
              backward: bool, split: bool = True) -> Stamp:
        ext = {ext_key: chain.out} if chain.out is not None else {}
        return Stamp(tpl, self.nodes(tpl, backward, split), prefix, ext, layer, chain)

    def node(self, s: Stamp, name: str) -> None:
        """Append node `name` of `s`; unless it is a deferred weight-gradient node, it waits on the chain."""
        idxs = s.nodes.nodes.get(name, ())
        if not idxs:
            return
        event = () if name.endswith("_dw") else s.chain.last
        stream = "ep_comm" if name in COMM_NODES else None
        for i in idxs:
            self._append(s, i, event, stream)
        if not name.endswith("_dw"):
            s.chain.last = tuple(s.ids[i] for i in s.nodes.sinks[name])
        out = s.tpl.marks.get("out")
        if out is not None and out in s.ids:
            s.chain.out = s.ids[out]

    def _append(self, s: Stamp, i: int, event: tuple[int, ...], stream: str | None) -> None:
        t = s.tpl.ops[i]
        deps = [s.ids[d] for d in t.local_deps] + [s.ext[e] for e in t.ext_deps]
        deps += [e for e in event + s.chain.gate if e not in deps]
        s.chain.gate = ()
        op_id = len(self.ops)
        s.ids[i] = op_id
        where = stream or t.stream
        wait = None if t.host_wait is None else s.ids[t.host_wait]  # a host sync: on an op of an earlier node
        self.ops.append(Op(op_id, s.prefix + t.suffix, where, where, t.phase, t.work, tuple(deps), s.layer,
                           s.chain.mb, t.host_calls, wait))

    def whole(self, s: Stamp) -> Stamp:
        for name in s.nodes.nodes:
            self.node(s, name)
        return s

    def record_grads(self, s: Stamp) -> None:
        """The last micro-batch's gradient producers, in backward order (as builder._micro_batch records them)."""
        if self.grads is not None:
            self.grads += [(s.ids[i], n) for i, n in s.tpl.grads]
            self.expert_grads += [(s.ids[i], n) for i, n in s.tpl.expert_grads]


def node_sinks_all(tpl: Template) -> tuple[int, ...]:
    used = {d for t in tpl.ops for d in t.local_deps}
    return tuple(i for i in range(len(tpl.ops)) if i not in used)


def layer_pair(em: Emitter, f: Stamp | None, b: Stamp | None, b_ends: bool) -> None:
    """TransformerLayerSchedulePlan.run's issue order for forward layer `f` and backward layer `b`."""
    order = [(b, "combine"), (f, "pre_dispatch"), (b, "mlp"), (f, "dispatch"), (b, "mlp_dw"), (b, "dispatch"),
             (f, "mlp"), (f, "combine"), (b, "pre_dispatch")]
    if not b_ends:
        order.append((b, "pre_dispatch_dw"))
    for s, name in order:
        if s is not None:
            em.node(s, name)


def block_name(layer: int | None, mb: int, block: str = "") -> str:
    return f"{K.layer_block(layer) if layer is not None else block}.mb{mb}."


def combined_step(em: Emitter, t, layers: int, f: Chain | None, b: Chain | None) -> None:
    """Without pipelining every plan holds the whole model (chunk_step)."""
    whole = range(layers)
    chunk_step(em, t, Side(f, whole) if f is not None else None, Side(b, whole) if b is not None else None)


def chunk_step(em: Emitter, t, f: Side | None, b: Side | None, posts: Callable[[], None] | None = None) -> None:
    """TransformerModelChunkSchedulePlan.run (L500-630) for forward plan `f` and backward plan `b` (either may be
    None; the chunks may differ and hold different layer counts): f's embedding, b's output layer + loss
    backward, forward layer i paired with b's i-th layer from the end while both have one (L556-575), then the
    rest of whichever has more alone (L577-594); `posts` (the pipeline's P2P batches, L596-607); b's first
    layer's deferred attention weight gradients (L609-614); f's output layer + loss; b's embedding backward."""
    if f is not None and f.embedding:
        em.whole(em.stamp(t.embed_fwd, f.chain, block_name(None, f.chain.mb, K.EMBED_BLOCK), "in", None, False, False))
    if b is not None and b.head:
        em.record_grads(em.whole(em.stamp(t.head_bwd, b.chain, block_name(None, b.chain.mb, K.HEAD_BLOCK), "loss",
                                          None, True, False)))
    fl = list(f.layers) if f is not None else []
    bl = list(reversed(b.layers)) if b is not None else []
    last_b = None
    for i in range(max(len(fl), len(bl))):
        fs = em.stamp(t.layer_fwd(fl[i]), f.chain, block_name(fl[i], f.chain.mb), "in", fl[i], False) \
            if i < len(fl) else None
        bs = em.stamp(t.layer_bwd(bl[i]), b.chain, block_name(bl[i], b.chain.mb), "gin", bl[i], True) \
            if i < len(bl) else None
        layer_pair(em, fs, bs, b_ends=i == len(bl) - 1)
        if bs is not None and i < len(bl) - 1:
            em.record_grads(bs)
        last_b = bs or last_b
    if posts is not None:
        posts()
    if last_b is not None:  # the first layer's attention weight gradients, deferred past the whole chunk
        em.node(last_b, "pre_dispatch_dw")
        em.record_grads(last_b)
    if f is not None and f.head:
        em.whole(em.stamp(t.head_fwd, f.chain, block_name(None, f.chain.mb, K.HEAD_BLOCK), "in", None, False, False))
    if b is not None and b.embedding:
        em.record_grads(em.whole(em.stamp(t.embed_bwd, b.chain, block_name(None, b.chain.mb, K.EMBED_BLOCK), "gin",
                                          None, True, False)))


def combined_micro_batches(ops: list[Op], t, layers: int, micro_batches: int, delay_wgrad: bool,
                           grads: list[tuple[int, int]], expert_grads: list[tuple[int, int]]) -> None:
    """combined_1f1b_schedule_for_no_pipelining: F0, (F1 + B0), ..., (F(n-1) + B(n-2)), B(n-1); the last
    micro-batch's gradient producers go to `grads` / `expert_grads` (builder.build_schedule's step end)."""
    em = Emitter(ops, delay_wgrad)
    chains = [Chain(mb) for mb in range(micro_batches)]
    for step in range(micro_batches + 1):
        f = chains[step] if step < micro_batches else None
        b = chains[step - 1] if step > 0 else None
        if b is not None and b.mb == micro_batches - 1:
            em.grads, em.expert_grads = grads, expert_grads
        combined_step(em, t, layers, f, b)
