"""Discrete-event engine: orders a Schedule's ops in time on the simulated ranks.

It never computes a cost: the caller supplies `compute_s(op, rank)` for compute ops and
`collective(op, group) -> (latency_s, bandwidth_s, link_load)` for collectives (`group` = the global
ranks of the op's real TP or DP group, from `group_of`).

Rules (schedule.py): each simulated rank has three streams (compute, tp_comm, dp_comm); a stream runs its
ops FIFO in schedule order, an op starting once its stream is free, all its deps have finished and the
host has issued it (`issue_s`, given by the caller: sim/cost/host_dispatch.py).
A collective starts when every simulated member of its group has issued it: early ranks wait, as NCCL
kernels spin on their stream (the wait is recorded as `wait_s` and the stream is busy meanwhile). Then
its latency part elapses (fixed), then its bandwidth part drains at the rate the arbiter grants.

What overlap slows:
- comm vs comm: concurrent collectives whose link loads overlap share those links max-min fairly
  (sim/engine/arbiter.py); collectives on disjoint links do not slow each other. Contention between symmetric
  copies of one collective on other groups is in the cost itself (`concurrent_groups`).
- comm vs compute: each simulated rank has a compute resource ("cpu", rank) of capacity 1 (SMs and HBM
  on a GPU, cores on a CPU; the name is only a key). A running compute op loads its rank's with 1, a
  collective's bandwidth part loads each simulated member's with kappa = `comm_interference`
  (hardware.compute.comm_interference, measured by `meshsim calibrate`; default 0). The arbiter shares
  it max-min fairly like a link, so a compute op and a collective overlapping on one rank both progress
  at 1/(1+kappa), each alone at full speed: one compute op of g seconds overlapping one bandwidth part
  of c seconds, started together, ends at max(g, c) + kappa min(g, c) (sim/engine/arbiter.py derives it).
  The latency part and a rendezvous wait load nothing. kappa = 0 (the default, the GPU assumption:
  NCCL kernels take a few SMs and we have no measurement) keeps compute ops plain timeouts that never
  touch the arbiter, so results are bit-identical to the model without interference.

Pipeline parallelism: each simulated rank runs its stage's Schedule (`run(schedules, ..., stage_of=)`).
P2P batches (stream "pp_comm", sim/schedule.P2P) are not FIFO: each starts once its deps are done and
posts its transfers. A transfer runs when both ends have posted it (sender and receiver, matched by
(direction, micro-batch, sender's virtual stage) between the two ranks): its latency part, then its
bandwidth part through the arbiter, with `p2p(src, dst, nbytes) -> (latency_s, bandwidth_s, link_load)`
from the caller. A batch ends when its last transfer ends; the time it waited for the peer that posted
last is its `wait_s` (a pipeline bubble when compute waits for it). A collective whose group spans
stages (the tied-embedding all-reduce) meets its peers by op name, since stages number ops apart.

Deterministic: processes are created in (rank, stream) order and the loop (sim/engine/loop.py, simpy's
ordering) runs simultaneous events in the order they were triggered, so ties are broken by rank, then by
schedule order (op id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.engine.arbiter import Arbiter
from meshsim.sim.engine.loop import Loop, Signal
from meshsim.sim.schedule.ops import (
    FIFO_STREAMS,
    P2P,
    STREAMS,
    Collective,
    Elementwise,
    Op,
    OptimizerStep,
    P2PTransfer,
    Schedule,
)

CommTiming = tuple[float, float, Mapping[int, float]]
ComputeFn = Callable[[Op, int], float]
CollectiveFn = Callable[[Op, tuple[int, ...]], CommTiming]
GroupFn = Callable[[str, int], tuple[int, ...]]
P2PFn = Callable[[int, int, int], CommTiming]


class Event(NamedTuple):
    """One op as run on one rank (immutable). Collectives: [start_s, start_s + wait_s) is the rendezvous
    wait. A NamedTuple rather than a dataclass: the engine makes one per (rank, op), and tuples are
    several times cheaper to build."""

    rank: int
    op_id: int
    name: str
    stream: str
    category: str
    phase: str
    layer: int | None
    micro_batch: int | None
    start_s: float
    end_s: float
    wait_s: float = 0.0
    bytes: int = 0
    flops: float = 0.0
    peer: int | None = None  # collectives: the simulated rank that issued last (ended the wait)
    peer_op: int | None = None  # that rank's op id (differs from op_id across pipeline stages)

    @property
    def dur_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class EventLog:
    events: tuple[Event, ...]  # in completion order
    ranks: tuple[int, ...]
    step_time_s: float
    _index: dict = field(default_factory=dict, compare=False, repr=False)

    def get(self, rank: int, op_id: int) -> Event:
        """The event of op `op_id` on `rank` (index built on first use)."""
        return self.by_rank()[rank][op_id]

    def by_rank(self) -> dict[int, dict[int, Event]]:
        """rank -> op id -> its event (built on first use, then shared)."""
        index = self._index
        if not index:
            for rank_ in self.ranks:
                index[rank_] = {}
            for e in self.events:
                index[e.rank][e.op_id] = e
        return index

    def of_rank(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]


def symmetric_groups(tp: int, dp: int, kv_replicas: int = 1) -> GroupFn:
    """TP innermost (scenarios/resolved.py): the TP group of rank r is number r // tp; its DP group holds
    the ranks congruent to r mod tp; its KV group the block of kv_replicas consecutive ranks around it."""

    def group_of(kind: str, rank: int) -> tuple[int, ...]:
        return mesh_group(kind, rank, tp, dp, kv_replicas)

    return group_of


def work_bytes(op: Op) -> int:
    """Bytes the op's work names explicitly (for hover text and traces)."""
    work = op.work
    if isinstance(work, Collective):
        return work.nbytes
    if isinstance(work, Elementwise):
        return work.bytes_read + work.bytes_written
    if isinstance(work, OptimizerStep):
        return work.params * work.bytes_per_param
    if isinstance(work, P2P):
        return work.nbytes
    return 0


_new_tuple = tuple.__new__  # Event(...) without NamedTuple's keyword-handling __new__: one call less per event


@dataclass
class _Rendezvous:
    expected: int
    done: Signal
    arrived: int = 0
    last: int = -1
    start_s: float = 0.0
    last_op: int = -1


@dataclass
class _Posted:
    """A P2P transfer one end has posted; the other end's post starts it."""

    done: Signal
    rank: int
    op_id: int
    start_s: float = 0.0  # when the transfer started (both ends posted)
    last: int = -1  # the rank that posted last
    last_op: int = -1


class _Sim:
    """Mutable state of one run: finish times, dependency waiters, open rendezvous, the arbiter."""

    def __init__(self, ranks: Sequence[int], compute_s: ComputeFn, collective: CollectiveFn,
                 group_of: GroupFn, comm_interference: float = 0.0, issue_s: Mapping[int, Sequence[float]] | None = None,
                 p2p: P2PFn | None = None):
        self.env = Loop()
        self.ranks = frozenset(ranks)
        self.compute_s, self.collective, self.group_of = compute_s, collective, group_of
        self.arbiter = Arbiter(self.env)
        self.kappa = comm_interference
        self.issue_of = issue_s or {}  # rank -> per op id: when the host has issued it; absent = at once
        self.cpu_load = {r: {("cpu", r): 1.0} for r in ranks}  # a compute op's load on its rank
        self.comm_cpu: dict[tuple[int, ...], dict] = {}  # group -> kappa on each simulated member
        self.finished: dict[int, dict[int, float]] = {r: {} for r in ranks}
        self.waiters: dict[tuple[int, int], Signal] = {}
        self.open: dict[tuple[int, tuple[int, ...]], _Rendezvous] = {}
        self.groups: dict[tuple[str, int], tuple[tuple[int, ...], int]] = {}
        self.events: list[Event] = []
        self.p2p = p2p
        self.posted: dict[tuple, _Posted] = {}

    def wait_for(self, rank: int, op_id: int) -> Signal:
        key = (rank, op_id)
        ev = self.waiters.get(key)
        if ev is None:
            ev = self.waiters[key] = self.env.event()
        return ev

    def finish(self, rank: int, op: Op, start_s: float, wait_s: float = 0.0, peer: int | None = None,
               peer_op: int | None = None) -> None:
        now, op_id = self.env.now, op.id
        self.finished[rank][op_id] = now
        ev = self.waiters.pop((rank, op_id), None)
        if ev is not None:
            self.env.succeed(ev)
        self.events.append(_new_tuple(Event, (rank, op_id, op.name, op.stream, op.category, op.phase, op.layer,
                                              op.micro_batch, start_s, now, wait_s, work_bytes(op), op.flops, peer,
                                              peer_op)))

    def stream(self, rank: int, ops: Sequence[Op]) -> Iterator[Signal]:
        env, done, finish, timeout = self.env, self.finished[rank], self.finish, self.env.timeout
        issue_s = self.issue_of.get(rank)
        for op in ops:
            for dep in op.deps:
                if dep not in done:
                    yield self.wait_for(rank, dep)
            if issue_s and issue_s[op.id] > env.now:  # the host has not issued it yet
                yield timeout(issue_s[op.id] - env.now)
            start_s = env.now
            if isinstance(op.work, Collective):
                group, members = self.group(op.work.group, rank)
                if members == 1:  # no simulated peer to wait for (the collapsed, symmetric case)
                    yield from self.transfer(op, group)
                    finish(rank, op, start_s, 0.0, rank)
                else:
                    rv = yield from self.rendezvous(rank, op, group, members)
                    finish(rank, op, start_s, rv.start_s - start_s, rv.last, rv.last_op)
            else:
                dur_s = self.compute_s(op, rank)
                if dur_s > 0:
                    if self.kappa > 0:  # shares the rank's compute resource with overlapping collectives
                        yield self.arbiter.drain(("compute", rank), dur_s, self.cpu_load[rank])
                    else:
                        yield timeout(dur_s)
                finish(rank, op, start_s)

    def p2p_batch(self, rank: int, op: Op) -> Iterator[Signal]:
        """One P2P batch: wait for its deps, post every transfer, end when the last one ends."""
        done = self.finished[rank]
        for dep in op.deps:
            if dep not in done:
                yield self.wait_for(rank, dep)
        start_s = self.env.now
        posts = [self.post(rank, op, t) for t in op.work.transfers]
        yield self.env.all_of([p.done for p in posts])
        last = max(posts, key=lambda p: (p.start_s, p.last))
        self.finish(rank, op, start_s, last.start_s - start_s, last.last, last.last_op)

    def post(self, rank: int, op: Op, t: P2PTransfer) -> _Posted:
        """Post one end of a transfer; the second end to post runs it (latency, then bandwidth)."""
        other = self.group("pp", rank)[0][t.peer_stage]  # memoized: one lookup per transfer
        if other not in self.ranks:
            raise ValueError(f"op {op.id} ({op.name}) on rank {rank}: P2P peer rank {other} is not simulated")
        src, dst = (rank, other) if t.send else (other, rank)
        key = (src, dst, t.direction, t.micro_batch, t.sender_vstage)
        mine = self.posted.pop(key, None)
        if mine is None:
            mine = self.posted[key] = _Posted(self.env.event(), rank, op.id)
            return mine
        mine.start_s, mine.last, mine.last_op = self.env.now, rank, op.id
        self.env.process(self.transfer_p2p(mine, src, dst, t))
        return mine

    def transfer_p2p(self, posted: _Posted, src: int, dst: int, t: P2PTransfer) -> Iterator[Signal]:
        latency_s, bandwidth_s, link_load = self.p2p(src, dst, t.nbytes)
        if latency_s > 0:
            yield self.env.timeout(latency_s)
        if bandwidth_s > 0:  # symmetric copies (other tp/dp positions) share one arbiter key
            yield self.arbiter.drain(("p2p", t.direction, t.micro_batch, t.sender_vstage), bandwidth_s, link_load)
        self.env.succeed(posted.done)

    def group(self, kind: str, rank: int) -> tuple[tuple[int, ...], int]:
        """The real group of `rank` and how many of its members are simulated (memoized)."""
        key = (kind, rank)
        hit = self.groups.get(key)
        if hit is None:
            group = self.group_of(kind, rank)
            hit = self.groups[key] = (group, sum(1 for r in group if r in self.ranks))
        return hit

    def transfer(self, op: Op, group: tuple[int, ...]) -> Iterator[Signal]:
        """Fixed latency part, then the bandwidth part drained through the arbiter."""
        latency_s, bandwidth_s, link_load = self.collective(op, group)
        if latency_s > 0:
            yield self.env.timeout(latency_s)
        if bandwidth_s > 0:
            yield self.arbiter.drain(op.id, bandwidth_s, link_load, self.comm_load(group))

    def comm_load(self, group: tuple[int, ...]) -> dict | None:
        """kappa on the compute resource of each simulated member of `group` (None when kappa = 0)."""
        if self.kappa <= 0:
            return None
        load = self.comm_cpu.get(group)
        if load is None:
            load = self.comm_cpu[group] = {("cpu", r): self.kappa for r in group if r in self.ranks}
        return load

    def rendezvous(self, rank: int, op: Op, group: tuple[int, ...], members: int) -> Iterator[Signal]:
        """Wait until every simulated member has issued the collective; the last one runs it."""
        key = (op.name if op.work.group == "embed" else op.id, group)  # stages number their ops apart
        rv = self.open.get(key)
        if rv is None:
            rv = self.open[key] = _Rendezvous(members, self.env.event())
        rv.arrived += 1
        rv.last, rv.last_op = rank, op.id
        if rv.arrived < rv.expected:
            yield rv.done
            return rv
        rv.start_s = self.env.now
        yield from self.transfer(op, group)
        del self.open[key]
        self.env.succeed(rv.done)
        return rv


def _check(schedule: Schedule, ranks: Sequence[int], group_of: GroupFn) -> None:
    ids = {op.id for op in schedule.ops}
    if len(ids) != len(schedule.ops):
        raise ValueError("schedule has duplicate op ids")
    for op in schedule.ops:
        missing = [d for d in op.deps if d not in ids]
        if missing:
            raise ValueError(f"op {op.id} ({op.name}) depends on unknown op ids {missing}")
        if op.stream not in STREAMS:
            raise ValueError(f"op {op.id} ({op.name}) has unknown stream {op.stream!r}")
    for rank in ranks:
        for kind in {op.work.group for op in schedule.ops if isinstance(op.work, Collective)}:
            if rank not in group_of(kind, rank):
                raise ValueError(f"group_of({kind!r}, {rank}) does not contain rank {rank}")


def run(schedule: Schedule | Sequence[Schedule], ranks: Sequence[int], compute_s: ComputeFn,
        collective: CollectiveFn, group_of: GroupFn | None = None, comm_interference: float = 0.0,
        issue_s: Sequence[float] | Sequence[Sequence[float]] = (), *, stage_of: Callable[[int], int] | None = None,
        p2p: P2PFn | None = None) -> EventLog:
    """Simulate `schedule` on every rank in `ranks` (each runs the same schedule), or with one schedule per
    pipeline stage, rank r runs schedule[stage_of(r)]; return the event log. comm_interference: kappa in
    [0, 1], the compute-resource load of a collective's bandwidth part. issue_s: per op id, the earliest
    start the host allows (sim/cost/host_dispatch.py; one sequence per stage with several schedules);
    () = no host limit. p2p: the P2P transfer coster."""
    if not 0.0 <= comm_interference <= 1.0:
        raise ValueError(f"comm_interference must be in [0, 1], got {comm_interference}")
    ranks = tuple(sorted(ranks))
    stages = (schedule,) if isinstance(schedule, Schedule) else tuple(schedule)
    if len(stages) > 1 and (stage_of is None or p2p is None):
        raise ValueError("one schedule per stage needs stage_of and a p2p coster")
    stage_of = stage_of or (lambda rank: 0)
    first = stages[0]
    group_of = group_of or symmetric_groups(first.tp, first.dp, first.kv_replicas)
    for stage, sched in enumerate(stages):
        _check(sched, [r for r in ranks if stage_of(r) == stage], group_of)
    per_stage_issue = ([issue_s] if isinstance(schedule, Schedule) else list(issue_s)) if len(issue_s) else []
    for sched, times in zip(stages, per_stage_issue, strict=False):
        if times and len(times) != len(sched.ops):
            raise ValueError(f"issue_s has {len(times)} entries for {len(sched.ops)} ops")
    issue_of = {r: per_stage_issue[stage_of(r)] for r in ranks if per_stage_issue and per_stage_issue[stage_of(r)]}
    sim = _Sim(ranks, compute_s, collective, group_of, comm_interference, issue_of, p2p)
    per_stream = [{s: sched.by_stream(s) for s in STREAMS} for sched in stages]
    for rank in ranks:
        streams = per_stream[stage_of(rank)]
        for stream in FIFO_STREAMS:
            if streams[stream]:
                sim.env.process(sim.stream(rank, streams[stream]))
        for op in streams["pp_comm"]:
            sim.env.process(sim.p2p_batch(rank, op))
    sim.env.run()
    expected = sum(len(stages[stage_of(r)].ops) for r in ranks)
    if len(sim.events) != expected:
        stuck = sorted({(r, op.id, op.name) for r in ranks for op in stages[stage_of(r)].ops
                        if op.id not in sim.finished[r]})[:3]
        raise ValueError(f"deadlock: {expected - len(sim.events)} ops never ran, e.g. {stuck} "
                         "(a dependency on a later op of the same stream, or a collective some peer never issues)")
    step_s = max((e.end_s for e in sim.events), default=0.0)
    return EventLog(tuple(sim.events), ranks, step_s)
