"""Discrete-event engine: orders a Schedule's ops in time on the simulated ranks.

`check_inputs` validates a run's inputs; `run` drives the processes (sim/engine/processes.py) on an event
loop with loop.py's interface, meshsim's own (`engine="python"`, alias "native") or simpy's (`"simpy"`,
sim/engine/simpy_loop.py), or all of it on the compiled core (`"compiled"`, the default: sim/engine/_core.pyx
over compiled.py's arrays; the Python core when the extension is not built), which give bit-identical logs. It never computes a cost: the caller supplies `compute_s(op, rank)` for compute ops and
`collective(op, group) -> (latency_s, bandwidth_s, link_load)` for collectives (`group` = the global
ranks of the op's real TP or DP group, from `group_of`).

Rules (schedule.py): each simulated rank has FIFO streams (compute, tp_comm, dp_comm, ep_comm); a stream runs its
ops FIFO in schedule order, an op starting once its stream is free, all its deps have finished and the
host has issued it (`issue_s`, given by the caller: sim/cost/host_dispatch.py; after an op with a
`host_wait`, later, as the host waited for the GPU there: sim/engine/host.py).
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
Symmetric copies of one collective (explicit ranks) drain under one arbiter key, (stage, op id): op ids
alone would merge unrelated collectives of two stages.

Deterministic: processes are created in (rank, stream) order and the loop runs simultaneous events in
the order they were triggered (simpy's rule); event times do not depend on that order, and neither do the
labels (a collective's `peer` is the member that issued it last, ties to the highest rank). The log also
keeps every P2P transfer and every arbiter job (`EventLog.transfers`, `.jobs`: what the steady-state
proof, sim/results/period_proof.py, reads).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import attrgetter, is_not
from typing import NamedTuple

import numpy as np

from meshsim.sim.core.engines import DEFAULT_ENGINE, EngineName
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.engine import compiled
from meshsim.sim.engine.arbiter import Job
from meshsim.sim.engine.event_columns import EventColumns, columns_of
from meshsim.sim.engine.event_rows import RankRows, is_rows, rank_events, rank_rows, retimed
from meshsim.sim.engine.host import schedule_syncs
from meshsim.sim.engine.job_rows import JobRows
from meshsim.sim.engine.processes import (
    CollectiveFn,
    CommTiming,
    ComputeFn,
    GroupFn,
    Inputs,
    OpsAt,
    P2PFn,
    Processes,
    Transfer,
)
from meshsim.sim.engine.simpy_loop import make_loop, resolve_engine
from meshsim.sim.schedule.ops import (
    P2P,
    STREAMS,
    Collective,
    Elementwise,
    Op,
    OptimizerStep,
    Schedule,
    ScheduleArrays,
)

__all__ = ["CollectiveFn", "CommTiming", "ComputeFn", "Event", "EventLog", "GroupFn", "Job", "P2PFn", "Transfer",
           "check_inputs", "run", "symmetric_groups", "work_bytes"]


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


_START_S, _END_S = attrgetter("start_s"), attrgetter("end_s")


@dataclass(frozen=True)
class EventLog:
    """What a run did: its events in completion order, every P2P transfer and every arbiter job.

    `events` is a tuple of Event (the Python and simpy engines, the reference) or, from the compiled core,
    an EventRows (sim/engine/event_rows.py): the arrays the core recorded, each Event built when read,
    equal field for field to the reference's. `columns()` is the arrays either way (built from the tuples
    once, or the core's own); `by_rank()` / `of_rank()` read the arrays without building the whole list."""

    events: Sequence[Event]  # in completion order
    ranks: tuple[int, ...]
    step_time_s: float
    _index: dict = field(default_factory=dict, compare=False, repr=False)
    # what the events summarise, for sim/results/steady_state.py: every P2P transfer and every arbiter job
    transfers: tuple[Transfer, ...] = field(default=(), compare=False, repr=False)
    jobs: Sequence[Job] = field(default=(), compare=False, repr=False)  # compiled core: a JobRows
    _columns: list = field(default_factory=list, compare=False, repr=False)

    def columns(self) -> EventColumns:
        """The events as arrays, row i = events[i] (sim/engine/event_columns.py): the compiled core's own,
        else built from the tuples on first use, then shared."""
        if is_rows(self.events):
            return self.events.columns
        if not self._columns:
            self._columns.append(columns_of(self.events))
        return self._columns[0]

    def span_times(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        """(start_s, end_s) of every one of `which` ("transfers" or "jobs") as float64 arrays, in order
        (built on first use, then shared)."""
        key = ("span_times", which)
        if key not in self._index:
            spans = getattr(self, which)
            if isinstance(spans, JobRows):  # its columns: the values the records carry
                self._index[key] = (spans.start_s, spans.end_s)
            else:
                self._index[key] = (np.fromiter(map(_START_S, spans), np.float64, len(spans)),
                                    np.fromiter(map(_END_S, spans), np.float64, len(spans)))
        return self._index[key]

    def rows_of(self) -> dict[int, RankRows]:
        """rank -> its rows in completion order and the row of each op id (event_rows.rank_rows; built on
        first use, then shared)."""
        index = self._index
        if "rows" not in index:
            index["rows"] = rank_rows(self.columns(), self.ranks)
        return index["rows"]

    def get(self, rank: int, op_id: int) -> Event:
        """The event of op `op_id` on `rank` (index built on first use)."""
        return self.by_rank()[rank][op_id]

    def by_rank(self) -> dict[int, Mapping[int, Event]]:
        """rank -> op id -> its event, in completion order (built on first use, then shared; over the
        compiled core's arrays a mapping that builds each event when read)."""
        index = self._index
        if "by_rank" not in index:
            if is_rows(self.events):
                index["by_rank"] = {r: rank_events(self.events, rows) for r, rows in self.rows_of().items()}
            else:
                by: dict[int, dict[int, Event]] = {r: {} for r in self.ranks}
                for e in self.events:
                    by[e.rank][e.op_id] = e
                index["by_rank"] = by
        return index["by_rank"]

    def of_rank(self, rank: int) -> Sequence[Event]:
        """The events of `rank`, in completion order (over the compiled core's arrays: an EventRows)."""
        if is_rows(self.events):
            return self.events.take(self.rows_of()[rank].order)
        return [e for e in self.events if e.rank == rank]

    def retimed(self, rows: np.ndarray, start_s: np.ndarray, end_s: np.ndarray) -> Sequence[Event]:
        """The events of rows `rows` (in that order, repeats allowed) with start and end times `start_s`,
        `end_s` (one per row), the other fields unchanged (event_rows.retimed)."""
        return retimed(self.events, rows, start_s, end_s)


def symmetric_groups(tp: int, dp: int, kv_replicas: int = 1, cp: int = 1) -> GroupFn:
    """TP innermost (scenarios/resolved.py): the TP group of rank r is number r // tp; its DP group holds
    the ranks congruent to r mod tp; its KV group the block of kv_replicas consecutive ranks around it."""

    def group_of(kind: str, rank: int) -> tuple[int, ...]:
        return mesh_group(kind, rank, tp, dp, kv_replicas, cp=cp)

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


_ID, _DEPS, _STREAM, _WAIT, _CALLS = (attrgetter(a) for a in ("id", "deps", "stream", "host_wait", "host_calls"))


def _valid_ops(ops: Sequence[Op], tiled: ScheduleArrays | None = None) -> bool:
    """_first_problem finds nothing, decided by whole-schedule passes (sets and C-level maps, not a
    Python loop per op): each test is the per-op test of _first_problem over every op at once. `tiled`:
    the schedule's tiled arrays, which the test then reads instead of the ops (_valid_arrays)."""
    if tiled is not None:
        return _valid_arrays(tiled)
    if not set(map(_STREAM, ops)).issubset(STREAMS) or (ops and min(map(_CALLS, ops)) < 0):
        return False
    ids = list(map(_ID, ops))
    known = set(ids)
    if len(known) != len(ops) or not known.issuperset(chain.from_iterable(map(_DEPS, ops))):
        return False
    waits = list(map(_WAIT, ops))
    waiting = compress(zip(waits, ids, strict=True), map(is_not, waits, repeat(None)))
    return all(0 <= wait < op_id for wait, op_id in waiting)


def _valid_arrays(a: ScheduleArrays) -> bool:
    """_valid_ops over a schedule's tiled arrays, without reading an op: ids are positions (so distinct)
    and every stream is known (the tiling holds no other op: sim/schedule/tiling.py), so what is left is
    read off the columns: host calls not negative, every dep in [0, n), every host wait (-1: none) before
    its op's position."""
    n = len(a.kind)
    if n and a.host_calls.min() < 0:
        return False
    if len(a.dep_idx) and not (a.dep_idx.min() >= 0 and a.dep_idx.max() < n):
        return False
    return not np.any(a.host_wait >= np.arange(n, dtype=np.intc))


def _first_problem(ops: Sequence[Op]) -> None:
    """The first invalid op, in schedule order, as a ValueError naming it."""
    ids = {op.id for op in ops}
    if len(ids) != len(ops):
        raise ValueError("schedule has duplicate op ids")
    for op in ops:
        missing = [d for d in op.deps if d not in ids]
        if missing:
            raise ValueError(f"op {op.id} ({op.name}) depends on unknown op ids {missing}")
        if op.stream not in STREAMS:
            raise ValueError(f"op {op.id} ({op.name}) has unknown stream {op.stream!r}")
        if op.host_wait is not None and not 0 <= op.host_wait < op.id:
            raise ValueError(f"op {op.id} ({op.name}): its host waits for op {op.host_wait}, not an earlier op")
        if op.host_calls < 0:
            raise ValueError(f"op {op.id} ({op.name}) has {op.host_calls} host calls")


def _check(schedule: Schedule, ranks: Sequence[int], group_of: GroupFn) -> None:
    if not _valid_ops(schedule.ops, schedule.tiled_arrays):
        _first_problem(schedule.ops)
    kinds = {w.group for w in schedule.work_table.works if isinstance(w, Collective)}  # asked once per work
    for rank in ranks:
        for kind in kinds:
            if rank not in group_of(kind, rank):
                raise ValueError(f"group_of({kind!r}, {rank}) does not contain rank {rank}")


def _by_stream(schedule: Schedule) -> dict[str, Sequence[Op]]:
    """{stream: schedule.by_stream(stream)} for every stream, in one pass (streams checked by _check); from
    the tiled stream column where the schedule has one (ids are positions: each stream's ops as an OpsAt
    view, no list of them), else op by op."""
    arrays = schedule.tiled_arrays
    if arrays is not None:
        return {s: OpsAt(schedule.ops, np.flatnonzero(arrays.stream == i)) for i, s in enumerate(STREAMS)}
    out: dict[str, list[Op]] = {s: [] for s in STREAMS}
    for op in schedule.ops:
        out[op.stream].append(op)
    return out


def check_inputs(schedule: Schedule | Sequence[Schedule], ranks: Sequence[int], group_of: GroupFn | None = None,
                 comm_interference: float = 0.0, issue_s: Sequence[float] | Sequence[Sequence[float]] = (),
                 stage_of: Callable[[int], int] | None = None, p2p: P2PFn | None = None) -> Inputs:
    """run()'s arguments checked (ValueError naming the problem) and put in the form the processes use."""
    if not 0.0 <= comm_interference <= 1.0:
        raise ValueError(f"comm_interference must be in [0, 1], got {comm_interference}")
    ranks = tuple(sorted(ranks))
    stages = (schedule,) if isinstance(schedule, Schedule) else tuple(schedule)
    if len(stages) > 1 and (stage_of is None or p2p is None):
        raise ValueError("one schedule per stage needs stage_of and a p2p coster")
    stage_of = stage_of or (lambda rank: 0)
    group_of = group_of or symmetric_groups(stages[0].tp, stages[0].dp, stages[0].kv_replicas, cp=stages[0].cp)
    for stage, sched in enumerate(stages):
        _check(sched, [r for r in ranks if stage_of(r) == stage], group_of)
    per_stage_issue = ([issue_s] if isinstance(schedule, Schedule) else list(issue_s)) if len(issue_s) else []
    for sched, times in zip(stages, per_stage_issue, strict=False):
        if times and len(times) != len(sched.ops):
            raise ValueError(f"issue_s has {len(times)} entries for {len(sched.ops)} ops")
    issue_of = {r: per_stage_issue[stage_of(r)] for r in ranks if per_stage_issue and per_stage_issue[stage_of(r)]}
    per_stream = tuple(_by_stream(sched) for sched in stages)
    syncs = [schedule_syncs(sched, times) for sched, times in zip(stages, per_stage_issue, strict=False)]
    syncs_of = {r: syncs[stage_of(r)] for r in issue_of if syncs[stage_of(r)] is not None}
    return Inputs(ranks, stage_of, group_of, issue_of, comm_interference, per_stream, syncs_of)


def run(schedule: Schedule | Sequence[Schedule], ranks: Sequence[int], compute_s: ComputeFn,
        collective: CollectiveFn, group_of: GroupFn | None = None, comm_interference: float = 0.0,
        issue_s: Sequence[float] | Sequence[Sequence[float]] = (), *, stage_of: Callable[[int], int] | None = None,
        p2p: P2PFn | None = None, engine: EngineName = DEFAULT_ENGINE) -> EventLog:
    """Simulate `schedule` on every rank in `ranks` (each runs the same schedule), or with one schedule per
    pipeline stage, rank r runs schedule[stage_of(r)]; return the event log. comm_interference: kappa in
    [0, 1], the compute-resource load of a collective's bandwidth part. issue_s: per op id, the earliest
    start the host allows (sim/cost/host_dispatch.py; one sequence per stage with several schedules);
    () = no host limit. p2p: the P2P transfer coster. engine: the event loop (sim/engine/simpy_loop.py)."""
    inputs = check_inputs(schedule, ranks, group_of, comm_interference, issue_s, stage_of, p2p)
    engine = resolve_engine(engine)
    if engine == "compiled":
        events_, latest_s, transfers, jobs, finished = compiled.run(
            inputs, (schedule,) if isinstance(schedule, Schedule) else tuple(schedule), compute_s, collective, p2p, Event,
            work_bytes)
        _check_all_ran(inputs, finished, len(events_))
        return EventLog(events_, inputs.ranks, latest_s,
                        transfers=tuple(transfers), jobs=jobs)  # a JobRows: records built when read
    events: list[Event] = []
    append = events.append

    sizes: dict[int, tuple[object, int, float]] = {}  # id(work) -> (the work, kept alive; bytes, flops)

    def record(rank: int, op: Op, start_s: float, end_s: float, wait_s: float, peer: int | None,
               peer_op: int | None) -> None:
        size = sizes.get(id(op.work))  # ops stamped from one template share their work object
        if size is None or size[0] is not op.work:
            size = sizes[id(op.work)] = (op.work, work_bytes(op), op.flops)
        append(_new_tuple(Event, (rank, op.id, op.name, op.stream, op.category, op.phase, op.layer, op.micro_batch,
                                  start_s, end_s, wait_s, size[1], size[2], peer, peer_op)))

    procs = Processes(inputs, make_loop(engine), compute_s, collective, p2p, record)
    procs.start()
    procs.env.run()
    _check_all_ran(inputs, procs.finished.__getitem__, len(events))
    return EventLog(tuple(events), inputs.ranks, max((e.end_s for e in events), default=0.0),
                    transfers=tuple(procs.transfers), jobs=tuple(procs.arbiter.records))


def _check_all_ran(inputs: Inputs, finished: Callable[[int], Container[int]], ran: int) -> None:
    counts = [sum(map(len, streams.values())) for streams in inputs.per_stream]
    expected = sum(counts[inputs.stage_of(r)] for r in inputs.ranks)
    if ran != expected:
        ops_of = [[op for ops in streams.values() for op in ops] for streams in inputs.per_stream]
        stuck = sorted({(r, op.id, op.name) for r in inputs.ranks for op in ops_of[inputs.stage_of(r)]
                        if op.id not in finished(r)})[:3]
        raise ValueError(f"deadlock: {expected - ran} ops never ran, e.g. {stuck} "
                         "(a dependency on a later op of the same stream, or a collective some peer never issues)")
