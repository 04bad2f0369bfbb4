"""Exact steady-state extrapolation: a step of M micro-batches from two short simulations.

In the middle of a step, consecutive micro-batches (pipelines: consecutive groups of `unit` of them,
per stage) repeat the same events shifted by a period T. So meshsim simulates the warm-up, a few periods
and the drain twice, with n_a and n_b = n_a + unit micro-batches (runs A and B), and checks, event by
event, that B is A with one period inserted:

- every event of A's first `split` micro-batches (and every event of no micro-batch that is not
  shifted) starts and ends at the same time in B;
- every later event of A (micro-batch i >= split -> i + unit in B, and the drain's no-micro-batch ops)
  starts and ends exactly T = step(B) - step(A) later in B;
- inside B, the periods that are simulated twice match: micro-batch i + unit = micro-batch i + T for
  lead <= i < split;
- both critical paths: B's = A's prefix, one period X, then A's suffix shifted by T (the same ops, or
  their symmetric copies on another simulated rank, with the same times).

All comparisons use the tolerance REL_TOL x step(B) on times. When every check holds, the state at a
period boundary repeats, so each further period adds exactly the same events shifted by T, and for any
per-step sum Q (step time, busy time of each stream, each critical-path category, collective counts)

    Q(M) = Q(B) + n (Q(B) - Q(A)),   n = (M - n_b) / unit periods not simulated;

the critical path is A's prefix, X repeated n + 1 times ("period x count"), then the suffix shifted by
n T. When a check fails (interference, stragglers, a schedule with no period), the caller simulates
the whole step instead. The event log kept for the trace and timeline is B's, its events after the
inserted period shifted by n T, with the gap summarised (`SteadyState`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.schedule.ops import Schedule

REL_TOL = 1e-9  # allowed relative deviation of any simulated time from its periodic image


@dataclass(frozen=True)
class Plan:
    """Micro-batches before the steady state (lead), in the drain (tail), and per period (unit)."""

    lead: int = 1  # micro-batch 0 opens the step (parameter gathers gate its forward)
    tail: int = 1  # the last micro-batch's backward overlaps the DP gradient reduction
    unit: int = 1

    def runs(self, micro_batches: int, force: bool = False) -> tuple[int, int] | None:
        """(n_a, n_b) micro-batches of the two short runs (M - n_b a whole number of periods), or None when
        they would cost as much as the whole step (with `force`: only when M <= n_b)."""
        n_a = self.lead + self.unit + self.tail
        n_a += (micro_batches - n_a - self.unit) % self.unit
        n_b = n_a + self.unit
        return (n_a, n_b) if micro_batches > (n_b if force else n_a + n_b) else None

    def split(self) -> int:
        """Run A's micro-batches below this index keep their times in B; the rest move one period later."""
        return self.lead + self.unit


@dataclass(frozen=True)
class SteadyState:
    """How a result was extrapolated (results.json "steady_state")."""

    micro_batches: int  # of the real step
    simulated_micro_batches: int  # run B
    unit: int  # micro-batches per period
    period_s: float
    periods: int  # periods not simulated (n)
    gap_start_s: float  # where the extrapolated periods start on B's shifted timeline

    def to_dict(self) -> dict:
        return {"micro_batches": self.micro_batches, "simulated_micro_batches": self.simulated_micro_batches,
                "unit": self.unit, "period_s": self.period_s, "periods": self.periods,
                "gap_start_s": self.gap_start_s}


@dataclass(frozen=True)
class Run:
    """One short simulation: its schedules (one per pipeline stage), events, critical path, the
    representative rank's breakdown and the collective counts (per stage, summed)."""

    schedules: tuple[Schedule, ...]
    log: EventLog
    path: list[Segment]
    breakdown_s: Mapping[str, float]
    counts: Counter


@dataclass(frozen=True)
class Extrapolated:
    step_s: float
    breakdown_s: dict[str, float]
    path: list[Segment]  # the period's segments carry count = n + 1
    events: tuple[Event, ...]  # run B's, shifted
    collective_counts: Counter
    ops_per_rank: int
    state: SteadyState


def op_keys(schedule: Schedule) -> dict[int, tuple[int | None, int]]:
    """op id -> (micro-batch, ordinal among the ops of that micro-batch in schedule order)."""
    seen: Counter = Counter()
    keys = {}
    for op in schedule.ops:
        keys[op.id] = (op.micro_batch, seen[op.micro_batch])
        seen[op.micro_batch] += 1
    return keys


class _Mismatch(Exception):
    """An op of one run has no counterpart in the other (the schedules are not one period apart)."""


class _Mapping:
    """Maps run A's ops onto run B's (micro-batch i >= split -> i + unit) and B's onto its own next period,
    per pipeline stage (each simulated rank runs its stage's schedule; `stage_of(rank)`)."""

    def __init__(self, scheds_a: Sequence[Schedule], scheds_b: Sequence[Schedule], plan: Plan,
                 stage_of: Callable[[int], int]):
        self.keys_a = [op_keys(s) for s in scheds_a]
        self.keys_b = [op_keys(s) for s in scheds_b]
        self.id_b = [{key: op_id for op_id, key in keys.items()} for keys in self.keys_b]
        self.stage_of = stage_of if len(scheds_a) > 1 else (lambda rank: 0)
        self.split, self.unit, self.lead = plan.split(), plan.unit, plan.lead

    def _b(self, stage: int, key: tuple[int | None, int]) -> int:
        op_id = self.id_b[stage].get(key)
        if op_id is None:
            raise _Mismatch(key)
        return op_id

    def a_to_b(self, rank: int, op_id: int) -> tuple[int, bool | None]:
        """(B's op id, late?) for A's op; late is None for ops of no micro-batch (either is allowed)."""
        stage = self.stage_of(rank)
        mb, k = self.keys_a[stage][op_id]
        if mb is None:
            return self._b(stage, (None, k)), None
        late = mb >= self.split
        return self._b(stage, (mb + self.unit if late else mb, k)), late

    def images(self, rank: int, op_id: int) -> set[int]:
        """B's ops that the event checks show at A's op's times (or one period later): the same op, its
        a_to_b image, and, from the lead on, the op one period later (a pipeline round pairs micro-batches
        w apart, so a critical path crosses periods between a micro-batch's forward and backward)."""
        stage = self.stage_of(rank)
        mb, k = self.keys_a[stage][op_id]
        ids = self.id_b[stage]
        keys = [(mb, k)] + ([(mb + self.unit, k)] if mb is not None and mb >= self.lead else [])
        return {ids[key] for key in keys if key in ids} | {self.a_to_b(rank, op_id)[0]}

    def next_period(self, rank: int, op_id: int) -> int | None:
        """B's op one period later, for ops of the doubly simulated periods (lead <= mb < split)."""
        stage = self.stage_of(rank)
        mb, k = self.keys_b[stage][op_id]
        if mb is None or not self.lead <= mb < self.split:
            return None
        return self._b(stage, (mb + self.unit, k))


def _same(a: Event, b: Event, shift_s: float, tol_s: float) -> bool:
    return (abs(b.start_s - a.start_s - shift_s) <= tol_s and abs(b.end_s - a.end_s - shift_s) <= tol_s
            and abs(b.wait_s - a.wait_s) <= tol_s)


def late_ops(log_a: EventLog, log_b: EventLog, m: _Mapping, period_s: float, tol_s: float
             ) -> set[tuple[int, int]] | None:
    """(rank, B op id) of B's events that A has one period earlier; None if any event breaks the pattern."""
    by_b = {(e.rank, e.op_id): e for e in log_b.events}
    late: set[tuple[int, int]] = set()
    for ea in log_a.events:
        op_b, is_late = m.a_to_b(ea.rank, ea.op_id)
        eb = by_b.get((ea.rank, op_b))
        if eb is None:
            return None
        if is_late is None:
            is_late = _same(ea, eb, period_s, tol_s) and not _same(ea, eb, 0.0, tol_s)
        if not _same(ea, eb, period_s if is_late else 0.0, tol_s):
            return None
        if is_late:
            late.add((ea.rank, op_b))
    return late if _repeats(log_b, by_b, m, period_s, tol_s) else None


def _repeats(log_b: EventLog, by_b: Mapping[tuple[int, int], Event], m: _Mapping, period_s: float | None,
             tol_s: float) -> bool:
    """The periods B simulates twice repeat with period T (None: T is the first pair's shift of start)."""
    for eb in log_b.events:
        nxt = m.next_period(eb.rank, eb.op_id)
        if nxt is None:
            continue
        other = by_b.get((eb.rank, nxt))
        if other is None:
            return False
        if period_s is None:
            period_s = other.start_s - eb.start_s
        if not _same(eb, other, period_s, tol_s):
            return False
    return period_s is not None


def repeats_inside(run: Run, plan: Plan, stage_of: Callable[[int], int] = lambda rank: 0) -> bool:
    """From one run alone: its micro-batches lead <= i < lead + unit recur in i + unit, every event shifted
    by one common period. A necessary condition of `extrapolate` with this run as B (which also checks
    the period against the other run), so a plan whose lead is too short is rejected before run A."""
    try:
        m = _Mapping(run.schedules, run.schedules, plan, stage_of)
        by_op = {(e.rank, e.op_id): e for e in run.log.events}
        return _repeats(run.log, by_op, m, None, REL_TOL * run.log.step_time_s)
    except _Mismatch:
        return False


def _seg_same(sa: Segment, sb: Segment, m: _Mapping, shift_us: float, tol_us: float) -> bool:
    """Same op (one of its images, or a wait), category, stage and times. The rank itself is not compared:
    with explicit ranks the path may pass through any of the symmetric copies of an op that finish together,
    a tie broken by round-off."""
    if sa.category != sb.category:
        return False
    if m.stage_of(sa.rank) != m.stage_of(sb.rank) or (sa.op_id is None) != (sb.op_id is None):
        return False
    if sa.op_id is not None and sb.op_id not in m.images(sa.rank, sa.op_id):
        return False
    return abs(sb.start_us - sa.start_us - shift_us) <= tol_us and abs(sb.dur_us - sa.dur_us) <= tol_us


def period_of_path(path_a: Sequence[Segment], path_b: Sequence[Segment], m: _Mapping, period_s: float,
                   tol_s: float) -> tuple[int, int] | None:
    """(i, j): path_b = path_a[:i] + path_b[i:j] (one period) + path_a[i:] shifted by T; None if not."""
    tol_us, shift_us = tol_s * 1e6, period_s * 1e6
    i = 0
    while i < len(path_a) and _seg_same(path_a[i], path_b[i], m, 0.0, tol_us):
        i += 1
    j = len(path_b) - (len(path_a) - i)
    if j < i or not all(_seg_same(sa, sb, m, shift_us, tol_us) for sa, sb in zip(path_a[i:], path_b[j:], strict=True)):
        return None
    if abs(sum(s.dur_us for s in path_b[i:j]) - shift_us) > tol_us * max(1, j - i):
        return None
    return i, j


def _shifted(seg: Segment, dt_s: float, count: int = 1) -> Segment:
    return Segment(seg.name, seg.category, seg.rank, seg.start_us + dt_s * 1e6, seg.dur_us, seg.op_id, count)


def extrapolate(run_a: Run, run_b: Run, plan: Plan, micro_batches: int,
                stage_of: Callable[[int], int] = lambda rank: 0) -> Extrapolated | None:
    """The step of `micro_batches` from runs A and B (module docstring), or None if a check fails.
    `stage_of(rank)` picks a simulated rank's schedule among the runs' per-stage schedules."""
    try:
        return _extrapolate(run_a, run_b, plan, micro_batches, stage_of)
    except _Mismatch:
        return None


def _extrapolate(run_a: Run, run_b: Run, plan: Plan, micro_batches: int,
                 stage_of: Callable[[int], int]) -> Extrapolated | None:
    log_a, path_a, log_b, path_b = run_a.log, run_a.path, run_b.log, run_b.path
    n_b = run_b.schedules[0].micro_batches
    period_s = log_b.step_time_s - log_a.step_time_s
    tol_s = REL_TOL * log_b.step_time_s
    n = (micro_batches - n_b) // plan.unit
    if period_s <= tol_s or n < 0 or (micro_batches - n_b) % plan.unit or len(log_a.ranks) != len(log_b.ranks):
        return None
    m = _Mapping(run_a.schedules, run_b.schedules, plan, stage_of)
    late = late_ops(log_a, log_b, m, period_s, tol_s)
    cut = period_of_path(path_a, path_b, m, period_s, tol_s) if late is not None else None
    if cut is None:
        return None
    i, j = cut
    shift_s = n * period_s
    path = [*path_b[:i], *(_shifted(s, 0.0, n + 1) for s in path_b[i:j]), *(_shifted(s, shift_s) for s in path_b[j:])]
    step_s = log_b.step_time_s + shift_s
    if abs(sum(s.dur_us * s.count for s in path) * 1e-6 - step_s) > tol_s * (n + 1) * max(1, len(path)):
        return None
    events = tuple(e._replace(start_s=e.start_s + shift_s, end_s=e.end_s + shift_s)
                   if (e.rank, e.op_id) in late else e for e in log_b.events)
    gap_s = min((e.start_s for e in log_b.events if (e.rank, e.op_id) in late), default=log_b.step_time_s)
    ca, cb = run_a.counts, run_b.counts
    return Extrapolated(
        step_s=step_s, breakdown_s=linear(run_a.breakdown_s, run_b.breakdown_s, n), path=path, events=events,
        collective_counts=Counter({k: cb[k] + n * (cb[k] - ca.get(k, 0)) for k in cb}),
        ops_per_rank=max(len(sb.ops) + n * (len(sb.ops) - len(sa.ops))
                         for sa, sb in zip(run_a.schedules, run_b.schedules, strict=True)),
        state=SteadyState(micro_batches, n_b, plan.unit, period_s, n, gap_s))


def linear(q_a: Mapping[str, float], q_b: Mapping[str, float], n: int) -> dict[str, float]:
    """Q(B) + n (Q(B) - Q(A)) for each key."""
    return {k: v + n * (v - q_a[k]) for k, v in q_b.items()}


def expanded(path: Iterable[Mapping]) -> float:
    """Total microseconds of a path whose segments may stand for `count` periods."""
    return sum(s["dur_us"] * s.get("count", 1) for s in path)
