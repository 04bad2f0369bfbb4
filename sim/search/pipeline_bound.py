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
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence

from meshsim.sim.schedule.ops import FIFO_STREAMS, P2P, Schedule

Node = tuple[int, int]  # (stage, op id)


def _partners(schedules: Sequence[Schedule]) -> dict[Node, list[Node]]:
    """P2P batch -> the batches of the other stages that post its transfers' other ends."""
    posts: dict[tuple, Node] = {}
    for sched in schedules:
        for op in sched.ops:
            if isinstance(op.work, P2P):
                for t in op.work.transfers:
                    src, dst = (sched.stage, t.peer_stage) if t.send else (t.peer_stage, sched.stage)
                    posts[(src, dst, t.direction, t.micro_batch, t.sender_vstage, t.send)] = (sched.stage, op.id)
    out: dict[Node, list[Node]] = defaultdict(list)
    for (src, dst, direction, mb, vstage, send), node in posts.items():
        other = posts.get((src, dst, direction, mb, vstage, not send))
        if other is not None:
            out[node].append(other)
    return out


def _own(schedules: Sequence[Schedule]) -> dict[Node, list[Node]]:
    """Each op's own predecessors: its deps and, on a FIFO stream, the previous op of its stream."""
    own: dict[Node, list[Node]] = {}
    for sched in schedules:
        last: dict[str, int] = {}
        for op in sched.ops:
            p = [(sched.stage, d) for d in op.deps]
            if op.stream in FIFO_STREAMS:
                if op.stream in last:
                    p.append((sched.stage, last[op.stream]))
                last[op.stream] = op.id
            own[(sched.stage, op.id)] = p
    return own


def _graph(own: dict[Node, list[Node]], partners) -> dict[Node, list[Node]]:
    """What must end before each node's bound is known: its own predecessors and, for a P2P batch, its
    partners' own predecessors (which bound its end)."""
    return {n: ps + [p for o in partners.get(n, ()) for p in own[o]] for n, ps in own.items()}


def _order(preds: dict[Node, list[Node]]) -> list[Node] | None:
    """Kahn's topological order; None on a cycle (the bound then skips steps 7 and 8)."""
    succs: dict[Node, list[Node]] = defaultdict(list)
    indeg = {n: 0 for n in preds}
    for n, ps in preds.items():
        for p in set(ps):
            succs[p].append(n)
            indeg[n] += 1
    queue = deque(n for n, d in indeg.items() if d == 0)
    order = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    return order if len(order) == len(preds) else None


class Pipeline:
    """est, end and tail of every op of the short schedules (module docstring)."""

    def __init__(self, schedules: Sequence[Schedule], duration: Callable[[object, int], float]):
        self.schedules = schedules
        self.ops = {(s.stage, op.id): op for s in schedules for op in s.ops}
        partners = _partners(schedules)
        own = _own(schedules)
        preds = _graph(own, partners)
        order = _order(preds)
        self.ok = order is not None
        if not self.ok:
            return
        fifo = {n: op.stream in FIFO_STREAMS for n, op in self.ops.items()}
        self.dur = {n: duration(op, n[0]) if fifo[n] else 0.0 for n, op in self.ops.items()}
        est, end = {}, {}
        for n in order:
            est[n] = max((end[p] for p in own[n]), default=0.0)
            if fifo[n]:
                end[n] = est[n] + self.dur[n]
            else:  # a partner's est from its deps' ends (its preds are this node's preds too: done)
                end[n] = max([est[n]] + [end[p] for o in partners.get(n, ()) for p in own[o]])
        tail: dict[Node, float] = {}
        succ_fifo: dict[Node, list[Node]] = defaultdict(list)
        succ_p2p: dict[Node, list[Node]] = defaultdict(list)
        for n, ps in own.items():
            for p in ps:
                (succ_fifo if fifo[n] else succ_p2p)[p].append(n)
                if not fifo[n]:
                    for o in partners.get(n, ()):
                        succ_p2p[p].append(o)
        for n in reversed(order):
            t = max((self.dur[v] + tail[v] for v in succ_fifo[n]), default=0.0)
            tail[n] = max(t, max((tail[b] for b in succ_p2p[n]), default=0.0))
        self.est, self.tail = est, tail
        self.ancestors_first = self._closed(order, preds, lambda mb: mb in (None, 0))
        last_mb = max((op.micro_batch for op in self.ops.values() if op.micro_batch is not None), default=0)
        succs: dict[Node, list[Node]] = defaultdict(list)
        for n, ps in preds.items():
            for p in ps:
                succs[p].append(n)
        self.descendants_last = self._closed(list(reversed(order)), succs, lambda mb: mb in (None, last_mb))
        self.last_mb = last_mb

    def _closed(self, order, links, good) -> set[Node]:
        """Nodes whose op and every node reachable through `links` are of a `good` micro-batch."""
        out: set[Node] = set()
        for n in order:
            if good(self.ops[n].micro_batch) and all(p in out for p in links.get(n, ())):
                out.add(n)
        return out

    def fill_drain(self, stage: int, stream: str) -> tuple[float, float]:
        """(max over x of est(x) - before(x), max over z of tail(z) - after(z)), each at least 0, over the
        allowed x and z of the stream (module docstring)."""
        sched = self.schedules[stage]
        ops = [op for op in sched.ops if op.stream == stream]
        first_other = next((i for i, op in enumerate(sched.ops) if op.micro_batch not in (None, 0)), len(sched.ops))
        last_other = max((i for i, op in enumerate(sched.ops) if op.micro_batch not in (None, self.last_mb)),
                         default=-1)
        if first_other > last_other:  # one micro-batch: fill and drain regions would overlap
            return 0.0, 0.0
        position = {op.id: i for i, op in enumerate(sched.ops)}
        fill, before = 0.0, 0.0
        for op in ops:
            n = (stage, op.id)
            if position[op.id] >= first_other or n not in self.ancestors_first:
                break
            fill = max(fill, self.est[n] - before)
            before += self.dur[n]
        drain, after = 0.0, 0.0
        for op in reversed(ops):
            n = (stage, op.id)
            if position[op.id] <= last_other or n not in self.descendants_last:
                break
            drain = max(drain, self.tail[n] - after)
            after += self.dur[n]
        return fill, drain
