"""One block template's share of a stage's step, for the bounds (sim/search/cheap_bound.py, bound.py).

A block (a layer's forward or backward, the embedding, the head, the delayed-FP8 amax block) is stamped
into a rank's op list as one contiguous run of ops with the template's own dependencies
(sim/schedule/stamping.py `stamp`; under parallel.moe_ep_overlap, sim/schedule/ep_overlap.py, a layer's ops
are issued node by node and interleaved with another micro-batch's, see `gaps` below). For each FIFO
stream x (sim/schedule/ops.FIFO_STREAMS) this module gives:

  busy_s[x]  the sum of the priced durations of the block's ops on x (bound.py step 3: an op lasts at least
             its priced cost);
  gap_s[x]   the idle time the block's own dependencies force on x between consecutive ops of x:
             for consecutive ops a, b of x in the block (no op of x between them in list order) and a
             dependency path a -> v1 -> ... -> vk -> b whose ops vi lie between a and b (every path from a to
             b does: deps point to earlier ops, and a path's ops depend on a), start(b) >= end(vk) >=
             end(a) + sum_i dur(vi), and each dur(vi) >= its priced cost (0 for a P2P batch). So
             start(b) >= end(a) + g(a, b), g the longest such path, and the stream idles g(a, b) between
             them. Example: a MoE layer's dispatch all-to-all between the router's permute and the expert
             GEMMs, or an SP all-gather between the norm and the QKV GEMM without TP overlap: communication
             that the schedule's own dependencies cannot overlap on its stream;
  dispatch_s the host's dispatch time of the block's ops (sim/cost/host_dispatch.py).

Chaining: if a and b are consecutive on x in the stamped schedule too, end(b) >= end(a) + g(a, b) + dur(b),
and over a stream's whole op list T >= sum dur + sum g. Consecutive in the block is consecutive in the
stamped schedule when the block is stamped contiguously; under moe_ep_overlap the nodes of two
micro-batches interleave, so the gaps are taken as 0 there (`with_gaps` False), and a layer's dispatch and
combine nodes run on ep_comm (their ops' stream is rewritten as the Emitter does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshsim.sim.cost.host_dispatch import CALLS_PER_DISPATCH
from meshsim.sim.schedule.ep_nodes import COMM_NODES, layer_nodes
from meshsim.sim.schedule.ops import FIFO_STREAMS
from meshsim.sim.schedule.template import Template, TemplateOp


@dataclass(frozen=True)
class BlockCost:
    busy_s: tuple[tuple[str, float], ...]  # (FIFO stream, seconds), streams with ops only
    streams: tuple[str, ...]  # each op's stream as stamped
    dur_s: tuple[float, ...]  # each op's priced duration (0 off the FIFO streams)
    dispatch_s: float
    ops: int


def op_streams(tpl: Template, ep_overlap_layer: bool, backward: bool, delay_wgrad: bool) -> tuple[str, ...]:
    """Each op's stream as stamped: the template's, or under moe_ep_overlap a layer's dispatch and combine
    nodes on ep_comm (sim/schedule/ep_overlap.py Emitter.node)."""
    streams = [t.stream for t in tpl.ops]
    if ep_overlap_layer:
        nodes = layer_nodes(tpl, backward, delay_wgrad).nodes
        for name in COMM_NODES:
            for i in nodes.get(name, ()):
                streams[i] = "ep_comm"
    return tuple(streams)


def _deps(blocks: Sequence[Template]) -> list[tuple[int, ...]]:
    """Each op's dependencies inside the pass, as positions in the concatenated op list: a template's local
    deps, and its external input ("in", "gin", "loss") as the previous block's "out" (the first block's is
    outside the pass)."""
    out: list[tuple[int, ...]] = []
    base, prev_out = 0, None
    for tpl in blocks:
        for t in tpl.ops:
            deps = tuple(base + d for d in t.local_deps)
            out.append(deps + ((prev_out,) if t.ext_deps and prev_out is not None else ()))
        prev_out = base + tpl.marks["out"] if "out" in tpl.marks else None
        base += len(tpl.ops)
    return out


def pass_gaps(blocks: Sequence[Template], streams: Sequence[str], dur: Sequence[float]) -> dict[str, float]:
    """stream -> sum over its consecutive op pairs (a, b) in the pass (blocks stamped one after another,
    each fed by the one before) of the longest dependency path a -> ... -> b through the ops between them
    (module docstring)."""
    deps = _deps(blocks)
    out: dict[str, float] = {}
    last: dict[str, int] = {}
    for b, stream in enumerate(streams):
        if stream not in FIFO_STREAMS:
            continue
        a = last.get(stream)
        last[stream] = b
        if a is None or b == a + 1:
            continue
        reach: dict[int, float] = {a: 0.0}  # op -> longest path from a's end to the op's start
        for j in range(a + 1, b + 1):
            best = -1.0
            for d in deps[j]:
                if d in reach:
                    t = reach[d] + (dur[d] if d != a else 0.0)
                    best = t if t > best else best
            if best >= 0.0:
                reach[j] = best
        if reach.get(b, 0.0) > 0.0:
            out[stream] = out.get(stream, 0.0) + reach[b]
    return out


def block_cost(tpl: Template, streams: Sequence[str], price: Callable[[TemplateOp], float],
               host_dispatch_s: float) -> BlockCost:
    """The block's busy time per FIFO stream, its ops' durations and its host dispatch (module docstring)."""
    dur = tuple(price(t) if s in FIFO_STREAMS else 0.0 for t, s in zip(tpl.ops, streams, strict=True))
    busy: dict[str, float] = {}
    for s, d in zip(streams, dur, strict=True):
        if s in FIFO_STREAMS:
            busy[s] = busy.get(s, 0.0) + d
    per_call_s = host_dispatch_s / CALLS_PER_DISPATCH
    dispatch = sum(per_call_s * t.host_calls for t in tpl.ops)
    return BlockCost(tuple(busy.items()), tuple(streams), dur, dispatch, len(tpl.ops))
