"""One run as arrays for the checks that read it whole (the steady-state proof, the critical path): each
stage's static ops (deps in CSR form, stream predecessor, P2P batches) and each rank's times indexed by
op id, from the event log's columns (sim/engine/event_columns.py), not from its per-event tuples.

Every array here holds the same IEEE doubles as the events they come from, and every reduction used on
them (max, min, a comparison) is exact whatever its order, so the checks over them give the answers of
the per-event loops they replace (tests/test_results_arrays.py compares the two). Op ids and CSR offsets
are held as np.intc (int32) where they fit (`index_array`: checked, else int64): the same integers, half the
memory of int64 (a step at today's scale holds ~10^5 ops per stage, each column once per stage).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from meshsim.sim.engine.events import EventLog
from meshsim.sim.results.period_keys import dep_csr, index_array
from meshsim.sim.schedule.ops import STREAMS, Schedule

_STREAM = attrgetter("stream")


@dataclass(frozen=True, eq=False)
class StageOps:
    """A stage's ops (ids are list positions): deps of op i are dep_ids[dep_ptr[i]:dep_ptr[i + 1]];
    prev[i] the op before it on its FIFO stream (-1: first, or a P2P batch); p2p[i] whether it is a P2P
    batch (stream "pp_comm", not FIFO)."""

    dep_ptr: np.ndarray
    dep_ids: np.ndarray
    prev: np.ndarray
    p2p: np.ndarray

    @classmethod
    def of(cls, schedule: Schedule) -> StageOps:
        tiled = schedule.tiled_arrays  # ids are positions: the tiled columns are the ones read off the ops
        if tiled is not None:  # shared, not copied (read only); index_array keeps their np.intc
            return cls(index_array(tiled.dep_ptr), index_array(tiled.dep_idx), tiled_stream_prev(tiled.stream),
                       tiled.stream == _PP)
        ops = schedule.ops
        streams = list(map(_STREAM, ops))
        ptr, flat = dep_csr(ops)
        prev, last = [], {}
        for i, stream in enumerate(streams):  # ids are positions: op i's id is i
            if stream == "pp_comm":
                prev.append(-1)
            else:
                prev.append(last.get(stream, -1))
                last[stream] = i
        p2p = np.fromiter((s == "pp_comm" for s in streams), bool, len(ops))
        return cls(index_array(ptr), index_array(flat), index_array(np.array(prev, np.int64)), p2p)

    def prev_list(self) -> list[int | None]:
        """op id -> the op before it on its FIFO stream, None where there is none (Proof.prevs)."""
        return [None if p < 0 else p for p in self.prev.tolist()]

    def latest_wait_end(self, end: np.ndarray, deps_default: float) -> np.ndarray:
        """Per op: the latest end among its deps (`deps_default` when it has none), then its stream
        predecessor's if that is later: when the engine had finished waiting for them."""
        out = np.full(len(self.prev), deps_default)
        ptr = self.dep_ptr
        some = ptr[1:] > ptr[:-1]
        if len(self.dep_ids):
            out[some] = np.maximum.reduceat(end[self.dep_ids], ptr[:-1][some])
        has = self.prev >= 0
        before = np.where(has, end[np.where(has, self.prev, 0)], -np.inf)
        return np.where(before > out, before, out)


_INTC = np.iinfo(np.intc)


def distinct_ints(values) -> list[int]:
    """np.unique(values).tolist() for an int array, by sort and compare (np.unique imports numpy.ma)."""
    ordered = np.sort(np.asarray(values).ravel())
    keep = np.empty(len(ordered), bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep].tolist()


def tiled_stream_prev(stream: np.ndarray) -> np.ndarray:
    """Per op (ScheduleArrays.stream: its stream's index in STREAMS, ids = positions): the op before it on its
    FIFO stream, -1 for the first and for P2P batches (pp_comm is not FIFO); StageOps.of's loop over the ops.
    np.intc where every id fits (index_array)."""
    prev = np.full(len(stream), -1, np.intc if len(stream) <= _INTC.max else np.int64)
    for i in range(len(STREAMS)):
        if i != _PP:
            at = np.flatnonzero(stream == i)
            prev[at[1:]] = at[:-1]
    return prev


_PP = STREAMS.index("pp_comm")


@dataclass(frozen=True, eq=False)
class RankTimes:
    """One rank's events indexed by op id; `pos` is each op's row in the log's columns (EventLog.rows_of's
    row_of, shared: not a copy)."""

    start: np.ndarray
    end: np.ndarray
    wait: np.ndarray
    pos: np.ndarray


def rank_times(log: EventLog, ops_of: Sequence[int]) -> dict[int, RankTimes]:
    """rank -> its RankTimes, for each of log.ranks (`ops_of[k]`: the op count of log.ranks[k]'s
    schedule, every one of which has exactly one event). A caller that reads one rank at a time takes
    times_of_rank instead and holds one rank's times at once."""
    return {rank: times_of_rank(log, rank, n) for rank, n in zip(log.ranks, ops_of, strict=True)}


def times_of_rank(log: EventLog, rank: int, n: int) -> RankTimes:
    """One rank's RankTimes (`n`: the op count of its schedule, every op of which has exactly one event),
    gathered through the log's own op id -> row index (EventLog.rows_of, built once and shared): the
    rank's rows are one per op id in [0, n) exactly when there are n of them, none has a negative id and
    row_of (its length the largest id + 1) is n long with a row for every id."""
    cols, rows = log.columns(), log.rows_of()[rank]
    order, row_of = rows.order, rows.row_of
    if len(order) != n or (n and (int(cols.op_id[order].min()) < 0 or len(row_of) != n or int(row_of.min()) < 0)):
        raise ValueError(f"rank {rank}: its events are not one per op of its schedule ({len(order)} for {n} ops)")
    return RankTimes(cols.start_s[row_of], cols.end_s[row_of], cols.wait_s[row_of], row_of)


def phases(start: np.ndarray, end: np.ndarray, c: float) -> np.ndarray:
    """period_state.phase of each op at c: DONE (0) if it ended before c, TODO (2) if it starts after,
    else RUNNING (1)."""
    return np.where(end < c, 0, np.where(start > c, 2, 1))
