"""The critical path of a step extrapolated from one run (sim/results/steady_state.py, "The critical path").

The walk of sim/results/critical_path.py goes back from the last op; each step visits one op (its
segment, preceded by the waits the walk records before it) and picks the op's predecessor from the end
times of its candidates (its deps and stream predecessor; for a P2P batch, the rank's last op finished
before the transfer started). Group the path's segments into those steps: the steps holding the cuts c1
and c2 are z and y. If y is mu(z) one period later, and every step from z on picks its predecessor the
same way one period later (`decisions_repeat`), the step's walk is the run's: the run's walk above c2
shifted by n T, then the run's steps [z, y) n + 1 times (one period each), then the run's walk below c1.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.results.critical_path import TIE_S, Segment
from meshsim.sim.results.path_columns import PathColumns
from meshsim.sim.results.path_columns import inside_an_op as _inside_an_op_columns
from meshsim.sim.results.period_proof import Proof
from meshsim.sim.results.period_settled import settled_steps, stream_prev_ids
from meshsim.sim.schedule.ops import P2P, Schedule


def steps(path: Sequence[Segment] | PathColumns) -> list[tuple[int, int]]:
    """(first, last) segment index of each walk step, in time order: its waits, then its op's segment
    (over PathColumns: the ops' positions, each step from the one after the previous op)."""
    if isinstance(path, PathColumns):
        lasts = np.flatnonzero(path.op_id >= 0)
        firsts = np.concatenate((np.zeros(1, np.int64), lasts[:-1] + 1)) if len(lasts) else lasts
        out = list(zip(firsts.tolist(), lasts.tolist(), strict=True))
        first = int(lasts[-1]) + 1 if len(lasts) else 0
        if first < len(path):
            out.append((first, len(path) - 1))
        return out
    out, first = [], 0
    for i, seg in enumerate(path):
        if seg.op_id is not None:
            out.append((first, i))
            first = i + 1
    if first < len(path):  # trailing waits (none: the walk starts from an op)
        out.append((first, len(path) - 1))
    return out


def _holding(path: Sequence[Segment] | PathColumns, spans: list[tuple[int, int]], c_us: float) -> int | None:
    if isinstance(path, PathColumns):
        starts = path.start_us[np.fromiter(map(itemgetter(0), spans), np.int64, len(spans))].tolist()
        i = bisect_right(starts, c_us) - 1
        if i < 0:
            return None
        b = spans[i][1]
        return i if float(path.start_us[b]) + float(path.dur_us[b]) > c_us else None
    starts = [path[a].start_us for a, _ in spans]
    i = bisect_right(starts, c_us) - 1
    if i < 0:
        return None
    b = spans[i][1]
    return i if path[b].start_us + path[b].dur_us > c_us else None


def inside_an_op(path: Sequence[Segment] | PathColumns) -> Callable[[float], bool]:
    """Whether the critical path at time c (s) runs a compute or collective op's segment (not a wait or a
    P2P transfer): cuts there keep the path checks simple."""
    if isinstance(path, PathColumns):
        return _inside_an_op_columns(path)
    starts = [seg.start_us for seg in path]

    def good(c_s: float) -> bool:
        i = bisect_right(starts, c_s * 1e6) - 1
        return i >= 0 and path[i].op_id is not None and path[i].category in ("compute", "tp_comm", "dp_comm")

    return good


def extend_path(path: Sequence[Segment] | PathColumns, schedules: Sequence[Schedule], log: EventLog, proof: Proof
                ) -> list[Segment] | PathColumns | str:
    """The step's critical path (segments of the period carry count n + 1), or why it is not proven (over
    PathColumns: the same checks on the same values, the result as columns)."""
    cut = proof.cut
    spans = steps(path)
    z, y = _holding(path, spans, cut.c1 * 1e6), _holding(path, spans, cut.c2 * 1e6)
    if z is None or y is None or y <= z:
        return "the critical path has no step at each cut"
    if not _segments_repeat(_segs(path, *spans[z]), _segs(path, *spans[y]), proof):
        return "the critical path crosses the second cut elsewhere than one period after the first"
    reason = decisions_repeat(path, spans[z:], schedules, log, proof)
    if reason is not None:
        return reason
    n, s1, s2 = proof.periods, spans[z][0], spans[y][0]
    shift_us = n * cut.period_s * 1e6
    if isinstance(path, PathColumns):
        return path.with_period(s1, s2, n, shift_us)
    return [*path[:s1], *(Segment(s.name, s.category, s.rank, s.start_us, s.dur_us, s.op_id, n + 1)
                          for s in path[s1:s2]),
            *(Segment(s.name, s.category, s.rank, s.start_us + shift_us, s.dur_us, s.op_id, s.count)
              for s in path[s2:])]


def _segs(path: Sequence[Segment] | PathColumns, first: int, last: int) -> list[_Seg]:
    """What _segments_repeat reads of segments first..last of the path: over PathColumns read off the
    columns as PathColumns.segment reads them, without the names (PathColumns.names would build every
    segment's name, which the extended path, a new PathColumns, builds again for the result)."""
    if isinstance(path, PathColumns):
        return [_Seg(path.categories[int(path.category[k])], int(path.rank[k]), float(path.start_us[k]),
                     float(path.dur_us[k]), _op_at(path, k)) for k in range(first, last + 1)]
    return [_Seg(s.category, s.rank, s.start_us, s.dur_us, s.op_id) for s in path[first:last + 1]]


class _Seg(NamedTuple):
    """The fields of a Segment _segments_repeat compares."""

    category: str
    rank: int
    start_us: float
    dur_us: float
    op_id: int | None


def _op_at(path: PathColumns, k: int) -> int | None:
    """Segment k's op id (None: a wait), as PathColumns.segment reads it."""
    op = int(path.op_id[k])
    return None if op < 0 else op


def _segments_repeat(a: Sequence[_Seg], b: Sequence[_Seg], proof: Proof) -> bool:
    tol_us, shift_us = proof.cut.tol_s * 1e6, proof.cut.period_s * 1e6
    if len(a) != len(b):
        return False
    for sa, sb in zip(a, b, strict=True):
        if sa.category != sb.category or sa.rank != sb.rank or (sa.op_id is None) != (sb.op_id is None):
            return False
        if sa.op_id is not None and proof.map_of(sa.rank).mu(sa.op_id) != sb.op_id:
            return False
        if abs(sb.start_us - sa.start_us - shift_us) > tol_us or abs(sb.dur_us - sa.dur_us) > tol_us:
            return False
    return True


def decisions_repeat(path: Sequence[Segment], spans: Sequence[tuple[int, int]], schedules: Sequence[Schedule],
                     log: EventLog, proof: Proof, skip_settled: bool = True) -> str | None:
    """Each visited op's choice of predecessor is the same one period later (and n periods later, above
    c2): its candidates that finished before c1 end one period apart along their chain of images (the
    others finish after c1, where the theorem makes every time periodic), a tie between candidates is
    broken by op id among ops whose ids all move by P per period (ids from first_regular - P on: their
    images are regular, and so is the drain, renumbered by nP), and a visited op
    of the first period has the image of its stream predecessor as its image's.

    `skip_settled`: steps `settled_steps` marks pass without a look (the loop would pass them with nothing
    checked); False: every step is looked at (the reference, tests/test_period_path_settled.py)."""
    by = log.by_rank()
    c1, c2 = proof.cut.c1, proof.cut.c2
    prev_of: dict[int, _PrevOf] = {}  # per stage: op id -> its stream predecessor (None: none)
    order: dict[int, tuple[list[Event], list[float]]] = {}  # per rank, by end, and the ends (P2P steps)
    settled = settled_steps(path, spans, schedules, log, proof, images=True) if skip_settled else None
    if settled is not None:
        spans = [spans[i] for i in np.flatnonzero(~settled).tolist()]
    columns = isinstance(path, PathColumns)
    for _, last in spans:  # over PathColumns the step's rank and op id off the columns (no names built)
        rank, op_id = (int(path.rank[last]), _op_at(path, last)) if columns else (path[last].rank, path[last].op_id)
        events = by[rank]
        ev = events[op_id]
        stage = proof.stage_of(rank)
        if stage not in prev_of:
            prev_of[stage] = _PrevOf(stream_prev_ids(proof, stage))
        op, prev, m = schedules[stage].ops[op_id], prev_of[stage], proof.maps[stage]
        if isinstance(op.work, P2P):
            if rank not in order:
                order[rank] = by_end(log, rank, events)
            cands = _before(*order[rank], ev, ev.start_s + ev.wait_s)
            if cands and cands[-1].end_s <= c1:
                return f"critical path at {ev.name} (rank {rank}): the rank idles across the first cut"
        else:
            cands = [events[d] for d in op.deps]
            if prev[op.id] is not None:
                cands.append(events[prev[op.id]])
            if ev.start_s < c2:
                later = m.mu(op.id)
                if later is None or not m.first_regular <= later < m.end_regular or _mu(m, prev[op.id]) != prev[later]:
                    return f"critical path at {ev.name} (rank {rank}): its image has another stream predecessor"
        if all(e.end_s >= c1 for e in cands):
            continue  # all periodic, ids from first_regular - P on (older ops are done by c1): same choice
        reason = _choice_repeats(cands, proof, rank, events)
        if reason is not None:
            return f"critical path at {ev.name} (rank {rank}): {reason}"
    return None


class _PrevOf:
    """op id -> its stream predecessor, None where it has none, read off a stage's prev_ids."""

    __slots__ = ("ids",)

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids

    def __getitem__(self, op_id: int) -> int | None:
        p = int(self.ids[op_id])
        return None if p < 0 else p


def by_end(log: EventLog, rank: int, events: Mapping[int, Event]) -> tuple[Sequence[Event], list[float]]:
    """The rank's events (`events`: op id -> event, in completion order) sorted by end, ties in completion
    order (a stable sort), and their ends. Over the compiled core's rows: a stable argsort of the rank's end
    column, its events built only where read; else sorted() on the events (by_end_sorted, the reference)."""
    if not is_rows(log.events):
        return by_end_sorted(events)
    rows = log.rows_of()[rank].order  # the rank's rows in completion order
    ends = log.columns().end_s[rows]
    perm = np.argsort(ends, kind="stable")
    return log.events.take(rows[perm]), ends[perm].tolist()


def by_end_sorted(events: Mapping[int, Event]) -> tuple[list[Event], list[float]]:
    ranked = sorted(events.values(), key=lambda e: e.end_s)
    return ranked, [e.end_s for e in ranked]


def _mu(m, op_id: int | None) -> int | None:
    return None if op_id is None else m.mu(op_id)


def _before(order: list[Event], ends: list[float], ev: Event, t_s: float) -> list[Event]:
    """The rank's ops that finished by t_s, near the last (the walk takes the latest of them): `order` is
    sorted by end (`ends`), so they are the tail of order[:bisect_right(ends, t_s)] without ev, read from
    its end back to the first that ends more than 8 TIE_S before the last."""
    i = bisect_right(ends, t_s)
    out: list[Event] = []
    top = None
    for j in range(i - 1, -1, -1):
        e = order[j]
        if e.op_id == ev.op_id:
            continue
        if top is None:
            top = e.end_s - 8 * TIE_S
        elif e.end_s < top:
            break
        out.append(e)
    out.reverse()
    return out


def _choice_repeats(cands: Sequence[Event], proof: Proof, rank: int, events: dict[int, Event]) -> str | None:
    """The walk takes the candidate ending last, near-ties (within TIE_S) by op id. The choice repeats one
    period later (and j periods later) if no candidate ends near the tie threshold, tied candidates all
    move by one period in id, and, along the chain of images of a candidate that finished before c1, the
    chosen (or tied) ones end exactly one period apart (to TIE_S / 4) and the others at most one period
    apart (an op of no micro-batch is its own image: it does not move), so that none overtakes the choice.
    Candidates finishing after c1 are periodic by the theorem."""
    if not cands:
        return None
    cut, m = proof.cut, proof.map_of(rank)
    top = max(e.end_s for e in cands)
    tied = [e for e in cands if top - e.end_s <= TIE_S / 4]
    if len(tied) > 1 and min(e.op_id for e in tied) < m.first_regular - m.period_ops:
        return "candidates tie, and not all of their ids move by one period"
    if any(TIE_S / 4 < top - e.end_s < 4 * TIE_S for e in cands):
        return "a candidate ends near the tie threshold"
    for e in cands:
        exact, cur = e in tied, e
        while cur.end_s < cut.c1:
            nxt = m.mu(cur.op_id)
            if nxt == cur.op_id and not exact:
                break
            later = None if nxt is None or nxt == cur.op_id else events.get(nxt)
            moved = None if later is None else later.end_s - cur.end_s - cut.period_s
            if moved is None or moved > TIE_S / 4 or exact and moved < -TIE_S / 4:
                return f"candidate {cur.name} does not end one period before its image"
            cur = later
    return None
