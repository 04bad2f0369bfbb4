"""The pipeline's fill and drain, for the lower bound (sim/search/bound.py, its steps 7 and 8).

Earliest starts. On the short schedules of every stage (one simulated rank each), define for each op
est (a lower bound on its start) and end (on its end), in dependency order:
  FIFO op:   est = max(end of its deps, end of the previous op of its stream), end = est + its priced
             duration (bound.py step 3; the host's issue time is left out, which only lowers est);
  P2P batch: est = max(end of its deps); it ends when its last transfer ends, and a transfer starts once
             both ends have posted (sim/engine/processes.py post): end = max(est, est of the partner
             batch of each of its transfers), the partner being the batch of the other stage that posts
             the same (src, dst, direction, micro-batch, sender's virtual stage).
Every engine start is >= est and every end >= end, by induction over the same rules with durations at
least the priced ones. Symmetrically tail(u), the least time from u's end to the end of the step:
  tail(u) = max(0, over FIFO successors v (a dep, or the next op of u's stream): dur(v) + tail(v),
                over P2P batches b that u gates (a dep of b, or of b's partner): tail(b)).

Step 7, fill and drain of one stream of stage s. For ops x <= z of the stream (list order), the engine
runs x..z one after another: T >= est(x) + sum_{x <= y <= z} dur(y) + tail(z). The full step's sum
is busy(s) - before(x) - after(z), before / after summing the stream's ops before x / after z. With the
short schedule this needs premise P' (bound.py step 8): the ops of stage s's list up to the first op of
micro-batch 1 (those of micro-batch 0 and of none), with their dependencies and partners, are the same
in the full step; likewise the ops after the last op of micro-batch m' - 2, renumbered to the last
micro-batch. x is taken only among ops whose every ancestor is of micro-batch 0 or none and that come
before the stage's first op of another micro-batch; z only among ops whose every descendant is of the
last micro-batch or none and that come after its last op of another one. With m' = m the premise is
not needed (it is the full step).

The graph (each op's deps and previous op of its stream, the P2P partners, the fill and drain candidates and
their closures) is read off the schedules' tiled arrays by numpy passes (sim/search/pipeline_arrays.py); a
schedule without tiled arrays takes the long way, op by op (`Pipeline.long_way`, kept as the reference).
The two give the same est, tail, dur, ok and fill_drain to the bit on generated pipelines, on deps that
leave the schedule and on untiled schedules (tests/test_search_pipeline_arrays.py): est and tail are the
same max and + over the same values, whatever topological order each closure yields.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from meshsim.sim.schedule.ops import FIFO_STREAMS, P2P, Op, Schedule
from meshsim.sim.search.pipeline_arrays import PipeGraph, View, graph_from_arrays


def _partners(p2p: Iterable[tuple[int, Op, int]]) -> dict[int, list[int]]:
    """P2P batch -> the batches of the other stages that post its transfers' other ends (global nodes), over
    the (stage, op, node) of every P2P batch in stage and list order."""
    posts: dict[tuple, int] = {}
    for stage, op, node in p2p:
        for t in op.work.transfers:
            src, dst = (stage, t.peer_stage) if t.send else (t.peer_stage, stage)
            posts[(src, dst, t.direction, t.micro_batch, t.sender_vstage, t.send)] = node
    out: dict[int, list[int]] = defaultdict(list)
    for (src, dst, direction, mb, vstage, send), node in posts.items():
        other = posts.get((src, dst, direction, mb, vstage, not send))
        if other is not None:
            out[node].append(other)
    return out


def _graph_long_way(schedules: Sequence[Schedule]) -> PipeGraph:
    """The graph op by op (the reference sim/search/pipeline_arrays.py is checked against)."""
    ops, stage_of, index = [], [], []
    for sched in schedules:
        index.append({op.id: len(ops) + k for k, op in enumerate(sched.ops)})
        ops += sched.ops
        stage_of += [sched.stage] * len(sched.ops)
    n_ops = len(ops)
    ok = all(ids.keys() >= {d for op in sched.ops for d in op.deps} for sched, ids in zip(schedules, index, strict=True))
    if not ok:  # a dep outside the schedule (a short interleaved schedule Megatron would refuse): no graph
        return PipeGraph(ok=False)
    fifo = [op.stream in FIFO_STREAMS for op in ops]
    own: list[list[int]] = [None] * n_ops  # deps and the previous op of the stream
    for sched, ids in zip(schedules, index, strict=True):
        last: dict[str, int] = {}
        for op in sched.ops:
            i = ids[op.id]
            p = [ids[d] for d in op.deps]
            if fifo[i]:
                prev = last.get(op.stream)
                if prev is not None:
                    p.append(prev)
                last[op.stream] = i
            own[i] = p
    partners = _partners((sched.stage, op, ids[op.id]) for sched, ids in zip(schedules, index, strict=True)
                         for op in sched.ops if isinstance(op.work, P2P))
    preds = own.copy()  # a P2P batch's: its own and its partners' (the other ops' lists are shared with own)
    for n, others in partners.items():
        preds[n] = own[n] + [p for o in others for p in own[o]]
    mbs = [op.micro_batch for op in ops]
    last_mb = max((mb for mb in mbs if mb is not None), default=0)
    succs: list[list[int]] = [[] for _ in range(n_ops)]
    for n in range(n_ops):
        for p in preds[n]:
            succs[p].append(n)
    return PipeGraph(True, ops.__getitem__, stage_of.__getitem__, fifo, own, preds, succs, partners,
                     [n for n in range(n_ops) if mbs[n] is None or mbs[n] == 0],
                     [n for n in range(n_ops) if mbs[n] is None or mbs[n] == last_mb], last_mb,
                     partial(_stage_view, schedules, index, last_mb))


def _stage_view(schedules: Sequence[Schedule], index: list[dict[int, int]], last_mb: int, stage: int) -> View:
    """(first op of another micro-batch than 0 / none, last op of another than the last / none, stream ->
    its ops as (position, node)) of a stage's list, op by op."""
    sched, ids = schedules[stage], index[stage]
    first_other, last_other = len(sched.ops), -1
    streams: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, op in enumerate(sched.ops):
        mb = op.micro_batch
        if mb is not None and mb != 0 and first_other > i:
            first_other = i
        if mb is not None and mb != last_mb:
            last_other = i
        streams[op.stream].append((i, ids[op.id]))
    return first_other, last_other, streams


def _closure(nodes: list[int], links: list[list[int]], back: dict[int, set[int]]) -> list[int]:
    """The nodes of `nodes` whose every link (links[n]) is in the result, in an order where links come
    first (Kahn's algorithm restricted to `nodes`; `back`: the reverse links between members of `nodes`)."""
    member = set(nodes)
    need = {n: len(set(links[n])) for n in nodes if all(p in member for p in links[n])}
    queue = deque(n for n, k in need.items() if k == 0)
    order = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for s in back.get(n, ()):
            if s in need:
                need[s] -= 1
                if need[s] == 0:
                    queue.append(s)
    return order


class Pipeline:
    """est on the fill set and tail on the drain set of the short schedules' ops (module docstring); `ok`
    False when an op depends on one that is not in the schedules (bound.py then leaves steps 7-8 out)."""

    def __init__(self, schedules: Sequence[Schedule], duration: Callable[[object, int], float],
                 long_way: bool = False):
        self.schedules, self.views = schedules, {}
        graph = None if long_way else graph_from_arrays(schedules, _partners)
        self.graph = graph = graph if graph is not None else _graph_long_way(schedules)
        self.ok = graph.ok
        if self.ok:
            self._solve(graph, duration)

    @classmethod
    def long_way(cls, schedules: Sequence[Schedule], duration: Callable[[object, int], float]) -> Pipeline:
        """The graph built op by op, whatever arrays the schedules carry (the reference of the array path)."""
        return cls(schedules, duration, long_way=True)

    def _solve(self, g: PipeGraph, duration: Callable[[object, int], float]) -> None:
        """est on the fill set, tail on the drain set (module docstring), each in a topological order."""
        own, preds, succs, partners, fifo = g.own, g.preds, g.succs, g.partners, g.fifo
        self.last_mb = g.last_mb
        if g.orders is not None:
            order_first, order_final = g.orders()
        else:
            in_first, in_final = set(g.first), set(g.final)
            fwd = {p: {n for n in succs[p] if n in in_first} for p in g.first}
            order_first = _closure(g.first, preds, fwd)
            bwd = {n: {p for p in preds[n] if p in in_final} for n in g.final}
            order_final = _closure(g.final, succs, bwd)
        self.dur: dict[int, float] = {}
        for n in (*order_first, *order_final):
            if n not in self.dur:
                self.dur[n] = duration(g.op(n), g.stage_of(n)) if fifo[n] else 0.0
        dur = self.dur
        est, end = {}, {}
        for n in order_first:  # every predecessor of n is in the fill set, before n
            est[n] = max((end[p] for p in own[n]), default=0.0)
            if fifo[n]:
                end[n] = est[n] + dur[n]
            else:  # a partner's est from its deps' ends
                end[n] = max([est[n]] + [end[p] for o in partners.get(n, ()) for p in own[o]])
        tail: dict[int, float] = {}
        for n in order_final:  # every successor of n is in the drain set, before n
            t = 0.0
            for v in succs[n]:
                if n not in own[v]:
                    continue  # a successor through a partner only: counted below
                if fifo[v]:
                    t = max(t, dur[v] + tail[v])
                else:
                    t = max(t, tail[v], *(tail.get(o, 0.0) for o in partners.get(v, ())))
            tail[n] = t
        self.est, self.tail = est, tail
        self.ancestors_first, self.descendants_last = set(order_first), set(order_final)

    def _stage_view(self, stage: int) -> View:
        """The graph's view of a stage's list (PipeGraph.view), once per stage."""
        view = self.views.get(stage)
        if view is None:
            view = self.views[stage] = self.graph.view(stage)
        return view

    def fill_drain(self, stage: int, stream: str) -> tuple[float, float]:
        """(max over x of est(x) - before(x), max over z of tail(z) - after(z)), each at least 0, over the
        allowed x and z of the stream (module docstring)."""
        first_other, last_other, streams = self._stage_view(stage)
        if first_other > last_other:  # one micro-batch: fill and drain regions would overlap
            return 0.0, 0.0
        ops = streams.get(stream, ())
        fill, before = 0.0, 0.0
        for position, n in ops:
            if position >= first_other or n not in self.ancestors_first:
                break
            fill = max(fill, self.est[n] - before)
            before += self.dur[n]
        drain, after = 0.0, 0.0
        for position, n in reversed(ops):
            if position <= last_other or n not in self.descendants_last:
                break
            drain = max(drain, self.tail[n] - after)
            after += self.dur[n]
        return fill, drain
