"""The engine's processes: one generator per (rank, FIFO stream) and per P2P batch, and the state they share.

sim/engine/events.py states the rules and validates the inputs; this module carries them out on an event
loop with loop.py's interface (the native Loop, or simpy behind sim/engine/simpy_loop.py). Every label an
event carries is a function of event times and ranks, never of the order in which the loop happens to
process simultaneous events: a collective's `peer` is the member that issued it last, ties going to the
highest rank; a P2P transfer's is the end that posted last, ties likewise. (Event times themselves do not
depend on that order: every rule is a max of times, a sum of a time and a cost, or an integral of rates
that depend only on which jobs are draining.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from meshsim.sim.engine.arbiter import Arbiter
from meshsim.sim.engine.host import HostSyncs, next_delay_s
from meshsim.sim.engine.loop import Signal
from meshsim.sim.schedule.ops import FIFO_STREAMS, Collective, Op, P2PTransfer

CommTiming = tuple[float, float, Mapping[int, float]]
ComputeFn = Callable[[Op, int], float]
CollectiveFn = Callable[[Op, tuple[int, ...]], CommTiming]
GroupFn = Callable[[str, int], tuple[int, ...]]
P2PFn = Callable[[int, int, int], CommTiming]


class Transfer(NamedTuple):
    """One P2P transfer as run: its identity (src, dst, direction, micro-batch, sender's virtual stage),
    when both ends had posted it and when its last byte arrived."""

    src: int
    dst: int
    direction: str
    micro_batch: int
    sender_vstage: int
    start_s: float
    end_s: float


class OpsAt(Sequence):
    """The ops at `positions` (an int array) of `ops`, in that order, as a read-only sequence: a stream's ops
    without a list of them (the compiled core reads `positions`; the Python core iterates the ops)."""

    __slots__ = ("ops", "positions")

    def __init__(self, ops: Sequence[Op], positions: np.ndarray) -> None:
        self.ops, self.positions = ops, positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(map(self.ops.__getitem__, self.positions[i].tolist()))
        return self.ops[self.positions[i]]

    def __iter__(self) -> Iterator[Op]:
        return map(self.ops.__getitem__, self.positions.tolist())


@dataclass(frozen=True)
class Inputs:
    """A validated run (sim/engine/events.py check_inputs): per-stage schedules' streams and who runs what."""

    ranks: tuple[int, ...]
    stage_of: Callable[[int], int]
    group_of: GroupFn
    issue_of: Mapping[int, Sequence[float]]  # rank -> per op id: when its host issues it; absent = at once
    kappa: float  # comm_interference
    per_stream: tuple[Mapping[str, Sequence[Op]], ...]  # per stage: stream -> its ops in order (or OpsAt)
    syncs_of: Mapping[int, HostSyncs] = field(default_factory=dict)  # rank -> its host's syncs (host.py)


@dataclass
class _Rendezvous:
    expected: int
    done: Signal
    arrived: int = 0
    last: int = -1
    last_s: float = -1.0
    start_s: float = 0.0
    last_op: int = -1


@dataclass
class _Posted:
    """A P2P transfer one end has posted; the other end's post starts it."""

    done: Signal
    rank: int
    op_id: int
    posted_s: float
    start_s: float = 0.0  # when the transfer started (both ends posted)
    last: int = -1  # the end that posted last (ties: the higher rank)
    last_op: int = -1


class Processes:
    """Mutable state of one run: finish times, dependency waiters, open rendezvous, the arbiter."""

    def __init__(self, inputs: Inputs, env, compute_s: ComputeFn, collective: CollectiveFn, p2p: P2PFn | None,
                 record: Callable[..., None]):
        self.env = env
        self.inputs = inputs
        self.ranks = frozenset(inputs.ranks)
        self.compute_s, self.collective, self.p2p = compute_s, collective, p2p
        self.group_of, self.stage_of, self.kappa = inputs.group_of, inputs.stage_of, inputs.kappa
        self.arbiter = Arbiter(env)
        self.record = record  # record(rank, op, start_s, end_s, wait_s, peer, peer_op): one finished op
        self.cpu_load = {r: {("cpu", r): 1.0} for r in self.ranks}  # a compute op's load on its rank
        self.comm_cpu: dict[tuple[int, ...], dict] = {}  # group -> kappa on each simulated member
        self.finished: dict[int, dict[int, float]] = {r: {} for r in self.ranks}
        self.waiters: dict[tuple[int, int], Signal] = {}
        self.open: dict[tuple, _Rendezvous] = {}
        self.groups: dict[tuple[str, int], tuple[tuple[int, ...], int]] = {}
        self.posted: dict[tuple, _Posted] = {}
        self.transfers: list[Transfer] = []
        self.delays: dict[int, list[float]] = {r: [] for r in self.ranks}  # rank -> the host's D per sync

    def start(self) -> None:
        """One process per (rank, FIFO stream) with ops, one per P2P batch, in (rank, stream) order."""
        for rank in self.inputs.ranks:
            streams = self.inputs.per_stream[self.stage_of(rank)]
            for stream in FIFO_STREAMS:
                if streams[stream]:
                    self.env.process(self.stream(rank, streams[stream]))
            for op in streams["pp_comm"]:
                self.env.process(self.p2p_batch(rank, op))

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
        self.record(rank, op, start_s, now, wait_s, peer, peer_op)

    def stream(self, rank: int, ops: Sequence[Op]) -> Iterator[Signal]:
        env, done, finish, timeout = self.env, self.finished[rank], self.finish, self.env.timeout
        issue_s, syncs = self.inputs.issue_of.get(rank), self.inputs.syncs_of.get(rank)
        for op in ops:
            for dep in op.deps:
                if dep not in done:
                    yield self.wait_for(rank, dep)
            if issue_s:
                at_s = issue_s[op.id]
                if syncs is not None and syncs.point_of[op.id] >= 0:  # issued after a sync (host.py)
                    at_s += yield from self.host_delay(rank, syncs, syncs.point_of[op.id])
                if at_s > env.now:  # the host has not issued it yet
                    yield timeout(at_s - env.now)
            start_s = env.now
            if isinstance(op.work, Collective):
                group, members = self.group(op.work.group, rank)
                if members == 1:  # no simulated peer to wait for (the collapsed, symmetric case)
                    yield from self.transfer(rank, op, group)
                    finish(rank, op, start_s, 0.0, rank)
                else:
                    rv = yield from self.rendezvous(rank, op, group, members)
                    finish(rank, op, start_s, rv.start_s - start_s, rv.last, rv.last_op)
            else:
                dur_s = self.compute_s(op, rank)
                if dur_s > 0:
                    if self.kappa > 0:  # shares the rank's compute resource with overlapping collectives
                        yield self.arbiter.drain(("compute", rank), dur_s, self.cpu_load[rank], tag=(rank, op.id))
                    else:
                        yield timeout(dur_s)
                finish(rank, op, start_s)

    def host_delay(self, rank: int, syncs: HostSyncs, point: int) -> Iterator[Signal]:
        """The host's delay D after sync `point` (host.py), extended sync by sync in id order as each
        awaited op finishes; returns it (a value of the generator)."""
        known, done = self.delays[rank], self.finished[rank]
        while len(known) <= point:
            i = len(known)
            awaited = syncs.awaited[i]
            if awaited not in done:  # the host blocks here; another stream may extend `known` meanwhile
                yield self.wait_for(rank, awaited)
                continue
            known.append(next_delay_s(known[-1] if i else 0.0, done[awaited], syncs.base_s[i]))
        return known[point]

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
        now = self.env.now
        if mine is None:
            mine = self.posted[key] = _Posted(self.env.event(), rank, op.id, now)
            return mine
        later = now > mine.posted_s or rank > mine.rank  # the end that posted last; ties: the higher rank
        mine.start_s, mine.last, mine.last_op = now, *((rank, op.id) if later else (mine.rank, mine.op_id))
        self.env.process(self.transfer_p2p(mine, key, t.nbytes))
        return mine

    def transfer_p2p(self, posted: _Posted, key: tuple, nbytes: int) -> Iterator[Signal]:
        latency_s, bandwidth_s, link_load = self.p2p(key[0], key[1], nbytes)
        if latency_s > 0:
            yield self.env.timeout(latency_s)
        if bandwidth_s > 0:  # symmetric copies (other tp/dp positions) share one arbiter key
            yield self.arbiter.drain(("p2p", *key[2:]), bandwidth_s, link_load, tag=key)
        self.transfers.append(Transfer(*key, posted.start_s, self.env.now))
        self.env.succeed(posted.done)

    def group(self, kind: str, rank: int) -> tuple[tuple[int, ...], int]:
        """The real group of `rank` and how many of its members are simulated (memoized)."""
        key = (kind, rank)
        hit = self.groups.get(key)
        if hit is None:
            group = self.group_of(kind, rank)
            hit = self.groups[key] = (group, sum(1 for r in group if r in self.ranks))
        return hit

    def transfer(self, rank: int, op: Op, group: tuple[int, ...]) -> Iterator[Signal]:
        """Fixed latency part, then the bandwidth part drained through the arbiter under the op's copy key."""
        latency_s, bandwidth_s, link_load = self.collective(op, group)
        if latency_s > 0:
            yield self.env.timeout(latency_s)
        if bandwidth_s > 0:
            yield self.arbiter.drain(self.copy_key(rank, op), bandwidth_s, link_load, self.comm_load(group),
                                     tag=(rank, op.id))

    def copy_key(self, rank: int, op: Op) -> tuple:
        """The arbiter key shared by the symmetric copies of one collective: (stage, op id), since stages
        number their ops apart (op ids alone collide across stages, and unrelated collectives would then
        drain as one); a collective spanning stages (the tied-embedding all-reduce) by its name."""
        if op.work.group == "embed":
            return ("embed", op.name)
        return (self.stage_of(rank), op.id)

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
        now = self.env.now
        if now > rv.last_s or rank > rv.last:  # the member that issued last; ties: the higher rank
            rv.last, rv.last_op, rv.last_s = rank, op.id, now
        if rv.arrived < rv.expected:
            yield rv.done
            return rv
        rv.start_s = now
        yield from self.transfer(rank, op, group)
        del self.open[key]
        self.env.succeed(rv.done)
        return rv
