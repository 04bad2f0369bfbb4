"""The engine's state at a cut through one run, and whether it repeats one period later.

sim/results/steady_state.py states the theorem these checks serve and why they suffice; here each check
is one function that returns None when it holds and a one-line reason when it does not. Notation: mu maps
an op to the op one period later (micro-batch + unit, same ordinal among its micro-batch's ops); P is a
stage's ops per period, so that mu(op i) = op i + P throughout the regular part of its schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter

import numpy as np

from meshsim.sim.engine.events import Event, EventLog, Job, Transfer
from meshsim.sim.results.period_keys import Key, KeyIndex, key_index, later, regular_mask
from meshsim.sim.schedule.ops import P2P, Collective, Op, Schedule

_START, _END = attrgetter("start_s"), attrgetter("end_s")


@dataclass(frozen=True, eq=False)
class StageMap:
    """One stage's ops by key, mu on them, and its regular part: ids [first_regular, end_regular) hold ops
    equal to mu of the op P before them (same work, stream, layer, phase, deps and transfers, each one
    period later), and nothing before end_regular belongs to the drain. `keys` and `id_of` (key -> the
    last id holding it) are built on first use; mu reads an array of later keys' ids (period_keys.KeyIndex)."""

    ops: tuple[Op, ...]
    index: KeyIndex
    unit: int
    period_ops: int  # P
    first_regular: int
    end_regular: int
    mu_ids: memoryview  # per op: the id of later(its key, unit), -1: none (KeyIndex.later_ids, np.intc; read as ints)

    @property
    def keys(self) -> list[Key]:
        return self.index.parts[0]

    @cached_property
    def id_of(self) -> dict[Key, int]:
        return dict(zip(self.keys, range(len(self.keys)), strict=True))

    def mu(self, op_id: int) -> int | None:
        if self.index.no_mb[op_id]:
            return op_id
        later_id = self.mu_ids[op_id]
        return None if later_id < 0 else later_id

    def mu_inv(self, op_id: int) -> int | None:
        key = self.index.key(op_id)
        return op_id if key[0] is None else self.index.id_of(later(key, -self.unit))


def stage_map(schedule: Schedule, lead: int, unit: int, deps: tuple[np.ndarray, np.ndarray] | None = None
              ) -> StageMap | str:
    """The stage's StageMap, or why its schedule has no period where the plan says: its regular part is the
    run of ops around the first op of micro-batch lead + unit that each repeat the op P before them
    (period_keys.regular_mask; `deps`: period_keys.dep_csr of its ops, when the caller has it)."""
    index = key_index(schedule)
    first, second = index.id_of((lead, 0)), index.id_of((lead + unit, 0))
    if first is None or second is None:
        return f"stage {schedule.stage} has no micro-batch {lead + unit}"
    p, ops, n = second - first, schedule.ops, len(schedule.ops)
    mu = index.later_ids(unit)
    tiled = schedule.tiled_arrays
    ok = regular_mask(ops, index, p, unit, deps, tiled, mu, schedule.fields if tiled is not None else None,
                      schedule.work_table if tiled is not None else None)
    stops = np.flatnonzero(~ok[second:])
    end = second + int(stops[0]) if len(stops) else n
    breaks = np.flatnonzero(~ok[p:second])  # the run reaches back to p at most
    start = p + int(breaks[-1]) + 1 if len(breaks) else min(p, second)
    if end - start < p:
        return f"stage {schedule.stage}: fewer than one period of ops repeats one period later"
    return StageMap(ops, index, unit, p, start, end, memoryview(np.ascontiguousarray(mu)))


def mu_tag(tag: tuple, maps: Callable[[int], StageMap], unit: int) -> tuple | None:
    """An arbiter job's tag one period later: (rank, op id) of a collective or compute op, or a P2P
    transfer's (src, dst, direction, micro-batch, sender's virtual stage)."""
    if len(tag) == 2:
        op = maps(tag[0]).mu(tag[1])
        return None if op is None else (tag[0], op)
    return (*tag[:3], tag[3] + unit, tag[4])


def mu_key(key: tuple, stage_maps: Sequence[StageMap], unit: int) -> tuple | None:
    """An arbiter key one period later: (stage, op id) of a collective, ("p2p", direction, micro-batch,
    sender's virtual stage); the others (the tied-embedding all-reduce, a rank's compute) are their own."""
    if key[0] == "p2p":
        return (*key[:2], key[2] + unit, key[3])
    if isinstance(key[0], int):
        op = stage_maps[key[0]].mu(key[1])
        return None if op is None else (key[0], op)
    return key


def change_times(log: EventLog, lo: float, hi: float) -> np.ndarray:
    """Every time the run's state changes at within [lo, hi], each at least once, unsorted: each event's
    start, rendezvous end (start + wait) and end, each P2P transfer's and arbiter job's start and end, of
    those that overlap [lo, hi] (from the log's columns). A rendezvous end start + wait with wait == 0 is the
    start itself (x + 0.0 == x), so it is not repeated (tests/results_reference/period_state.py's
    time_values is the sorted list with repeats; tests/test_proof_cut.py compares the two)."""
    cols = log.columns()
    near = (cols.end_s >= lo) & (cols.start_s <= hi)
    start, wait = cols.start_s[near], cols.wait_s[near]
    waited = wait != 0
    parts = [start, start[waited] + wait[waited], cols.end_s[near]]
    del near, wait, waited
    for which in ("transfers", "jobs"):
        if getattr(log, which):
            s_, e_ = log.span_times(which)
            keep = (e_ >= lo) & (s_ <= hi)
            parts += [s_[keep], e_[keep]]
    vals = np.concatenate(parts)
    del parts, start
    return vals[(vals >= lo) & (vals <= hi)]


_SCANNED = 16  # candidates whose neighbours one period later are found by a scan; the rest after one sort


def choose_cut(log: EventLog, lo: float, period_s: float, tol_s: float,
               good: Callable[[float], bool] = lambda c: True) -> float | None:
    """A time c in [lo, lo + T) at least 4 tol from every state change, with c + T too: the middle of the
    widest gap between changes that `good` accepts, else of the widest gap (None if none is wide enough).
    Gaps are taken widest first, ties by the later middle (as sorting (width, middle) pairs in reverse).

    Only the changes before lo + T are sorted (the gaps); `near` (the distance from c + T to the change
    just before it and the one at or after it, as bisect_left on all of them sorted finds them) is found
    for the first _SCANNED candidates by a max and a min over the unsorted changes, and for any later
    ones after sorting them all; the candidates come widest first (_widest_first), not all sorted."""
    vals = change_times(log, lo, lo + 2 * period_s + tol_s)
    inside = np.append(np.sort(vals[vals < lo + period_s]), lo + period_s)
    before = np.concatenate(([lo], inside[:-1]))
    widths, mids = inside - before, (before + inside) / 2
    del inside, before
    wide = np.flatnonzero(widths >= 8 * tol_s)  # the loop stopped at the first narrower gap
    widths, mids = widths[wide], mids[wide]
    del wide
    fallback, everything = None, None
    for k, c in enumerate(_widest_first(widths, mids)):
        if k < _SCANNED:
            near = _near_scan(vals, c, period_s)
        else:
            everything = np.sort(vals) if everything is None else everything
            near = _near_sorted(everything, c, period_s)
        if not near > 4 * tol_s:
            continue
        if good(c):
            return c
        fallback = c if fallback is None else fallback
    return fallback


def _widest_first(widths: np.ndarray, mids: np.ndarray) -> Iterator[float]:
    """mids[np.lexsort((mids, widths))[::-1]], one at a time, without sorting them all: a block of the
    widest (every gap at least as wide as the block's narrowest, so the block is a prefix of that order,
    its own lexsort its order) is sorted when reached, then the next, each twice as long."""
    left, size = np.arange(len(widths)), _SCANNED
    while len(left):
        if len(left) > size:
            floor = np.partition(widths[left], len(left) - size)[len(left) - size]
            block = left[widths[left] >= floor]
            left = left[widths[left] < floor]
        else:
            block, left = left, left[:0]
        yield from mids[block[np.lexsort((mids[block], widths[block]))[::-1]]].tolist()
        size *= 2


def _near_scan(vals: np.ndarray, c: float, period_s: float) -> float:
    """min(|v - c - T|) over v the last change before c + T and the first at or after it (period_s where
    there is none): the neighbours bisect_left finds in the sorted changes, found by a max and a min."""
    shifted = c + period_s
    below = vals < shifted
    out = period_s if not len(vals) else np.inf
    if below.any():
        out = min(out, abs(float(vals[below].max()) - c - period_s))
    if not below.all():
        out = min(out, abs(float(vals[~below].min()) - c - period_s))
    return out


def _near_sorted(vals: np.ndarray, c: float, period_s: float) -> float:
    """_near_scan on the changes sorted (bisect_left)."""
    if not len(vals):
        return period_s
    i = int(np.searchsorted(vals, c + period_s, side="left"))
    left = abs(float(vals[i - 1]) - c - period_s) if i > 0 else np.inf
    right = abs(float(vals[i]) - c - period_s) if i < len(vals) else np.inf
    return min(left, right)


DONE, RUNNING, TODO = 0, 1, 2


def phase(t_start: float, t_end: float, c: float) -> int:
    return DONE if t_end < c else TODO if t_start > c else RUNNING


def side(a: float, b: float, c1: float, c2: float, period_s: float, tol_s: float) -> bool:
    """a (of run time) and b are on the same side of their cuts, and one period apart when before them."""
    if (a < c1) != (b < c2):
        return False
    return a > c1 or abs(b - a - period_s) <= tol_s


@dataclass(frozen=True)
class Cut:
    c1: float
    period_s: float
    tol_s: float
    kappa: float  # compute ops are arbiter jobs when > 0

    @property
    def c2(self) -> float:
        return self.c1 + self.period_s


def transfer_index(transfers: Sequence[Transfer]) -> dict[tuple, Transfer]:
    """(rank, direction, micro-batch, sender's virtual stage) -> the transfer, for both of its ends."""
    index = {}
    for tr in transfers:
        index[(tr.src, *tr[2:5])] = index[(tr.dst, *tr[2:5])] = tr
    return index


def same_state(ea: Event, eb: Event, op: Op, cut: Cut, transfers: Mapping[tuple, Transfer], unit: int) -> bool:
    """Op ea (at c1) and its image eb (at c2) are in the same phase, with every past time one period apart:
    start; a collective's rendezvous end; a compute op's end (fixed at its start when kappa = 0); each P2P
    transfer's start and end. What is still to come (a collective's draining, a transfer's) the arbiter
    check compares."""
    c1, c2, t, tol = cut.c1, cut.c2, cut.period_s, cut.tol_s
    pa = phase(ea.start_s, ea.end_s, c1)
    if pa != phase(eb.start_s, eb.end_s, c2):
        return False
    if pa != RUNNING:
        return True
    if abs(eb.start_s - ea.start_s - t) > tol:
        return False
    work = op.work
    if isinstance(work, Collective):
        return side(ea.start_s + ea.wait_s, eb.start_s + eb.wait_s, c1, c2, t, tol)
    if isinstance(work, P2P):
        return all(transfers_repeat(ea.rank, x, transfers, cut, unit) for x in work.transfers)
    return cut.kappa > 0 or abs(eb.end_s - ea.end_s - t) <= tol


def transfers_repeat(rank: int, x, transfers: Mapping[tuple, Transfer], cut: Cut, unit: int) -> bool:
    a = transfers.get((rank, x.direction, x.micro_batch, x.sender_vstage))
    b = transfers.get((rank, x.direction, x.micro_batch + unit, x.sender_vstage))
    return (a is not None and b is not None and side(a.start_s, b.start_s, cut.c1, cut.c2, cut.period_s, cut.tol_s)
            and side(a.end_s, b.end_s, cut.c1, cut.c2, cut.period_s, cut.tol_s))


def jobs_repeat(jobs: Sequence[Job], cut: Cut, tag_later: Callable[[tuple], tuple | None],
                key_later: Callable[[tuple], tuple | None],
                times: tuple[np.ndarray, np.ndarray] | None = None) -> str | None:
    """The arbiter's jobs draining at c1 got the same rates as their images at c2: every job that drained
    at some time in [w, c1] (w: when the first job draining at c1 started) has an image one period later
    with the same key (mapped), the same load objects and its interval clipped to [w, c1] shifted by T,
    and no other job drained in [w + T, c2]. Rates depend only on the keys and loads draining at each
    instant, so the work left to each job at c1 equals its image's at c2."""
    c1, c2, t, tol = cut.c1, cut.c2, cut.period_s, cut.tol_s
    start, end = times if times is not None else (np.fromiter(map(_START, jobs), np.float64, len(jobs)),
                                                   np.fromiter(map(_END, jobs), np.float64, len(jobs)))
    draining = start[(start < c1) & (c1 < end)]  # the comparisons and the min are exact: the loops' values
    w = float(draining.min()) if len(draining) else c1
    first = _jobs_at(jobs, np.flatnonzero((start < c1) & (end > w)))
    second = {j.tag: j for j in _jobs_at(jobs, np.flatnonzero((start < c2) & (end > w + t)))}
    if len(first) != len(second):
        return f"{len(first)} arbiter jobs overlap the first cut's window, {len(second)} the second's"
    for a in first:
        b = second.get(tag_later(a.tag))
        if b is None or b.key != key_later(a.key) or b.load is not a.load and b.load != a.load \
                or b.own is not a.own and b.own != a.own:
            return f"arbiter job {a.tag} has no image one period later"
        if abs(max(b.start_s, w + t) - max(a.start_s, w) - t) > tol or \
                abs(min(b.end_s, c2) - min(a.end_s, c1) - t) > tol:
            return f"arbiter job {a.tag} drains at other times one period later"
    return None


def _jobs_at(jobs: Sequence[Job], at: np.ndarray) -> list[Job]:
    """[jobs[i] for i in at] (`at` ascending): over the compiled core's JobRows, which builds records on
    reading, the span from the first to the last is built at once when `at` fills most of it (the same
    records: JobRows.build of any span gives each job's values, its load and own objects shared)."""
    if not len(at):
        return []
    lo, hi = int(at[0]), int(at[-1]) + 1
    build = getattr(jobs, "build", None)
    if build is None or hi - lo > 2 * len(at) + 64:
        return list(map(jobs.__getitem__, at.tolist()))
    span = build(lo, hi)
    return list(map(span.__getitem__, (at - lo).tolist()))
