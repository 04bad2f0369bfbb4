"""Steady-state extrapolation, proven: a step of M micro-batches from one run of n_b of them.

Between its warm-up and its drain a step's schedule repeats with a period of `unit` micro-batches.
meshsim simulates one run B of n_b = lead + 2 unit + tail micro-batches (`Plan`) and extrapolates the step
only when the checks below prove that the step is B with n = (M - n_b) / unit periods inserted; otherwise
it simulates the whole step, and results.json's "steady_state" says which path gave the figures and why.

Notation. mu maps an op to the op one period later: the op of micro-batch mb + unit with the same ordinal
among its micro-batch's ops, on the same rank. A stage's schedule is regular on ids [first_regular,
end_regular) when each op there is mu of the op P ids before it (P: ops per period): same work (so the
same cost), stream, phase, layer, deps and P2P transfers, each one period later (period_state.stage_map).
Lemma S (the builder's construction: sim/schedule/builder.py stamps the same templates for every
micro-batch, sim/schedule/pipeline.py's steady rounds differ only in their micro-batch): for m >= n_b, the
schedule of m + unit micro-batches is that of m with one more period of regular ops at the end of its
regular part, the drain after it renumbered by one period (tests/test_steady_state.py checks it). R_inf
is the schedule whose regular part never ends.

State. The engine's future after a time c is a function of (a) which ops have finished; (b) for each op
running at c, when it started, when its rendezvous completed, when its compute ends (kappa = 0), when its
P2P transfers started and ended; (c) the work left to each arbiter job draining at c, which the keys and
loads that drained with it since it started fix (rates depend on nothing else); (d) when the host issues
each op not yet started; (e) the inputs of the ops not finished (costs, deps, streams, transfers). Not of
the order in which the loop processes simultaneous events: every rule is a max of times, a time plus a
cost, or an integral of rates of the jobs draining, and the labels are functions of times and ranks
(sim/engine/processes.py). Shifting every time of a state and every issue time by T shifts the future by T.

Checks (sim/results/period_proof.py). T: from the first op of micro-batch `lead` to that of lead + unit on
the first simulated rank; c1 a time in that period at least 4 tol from every time B's state changes at,
and from every such time minus T; c2 = c1 + T.
1. (a, b) Each op of the regular part and its image are in the same phase at c1 and c2, with every past
   time one period apart; the ops before the regular part have finished by c1 (their images by c2).
2. (c) Each arbiter job draining at some time in [w, c1] (w: the first start of a job draining at c1) has
   an image with the same key (mapped) and load objects draining at the same times one period later, and
   no other job drains in [w + T, c2]; so each job draining at c2 has its preimage's work left at c1.
3. (d) Op i is issued at issue[i], its image at issue[i] + H (H = P x the dispatch time), not + T. If an
   op from c1 on waited for its host, H = T. Otherwise, with s the least slack (ready time minus issue
   time) of the ops from c1 on, s >= n (H - T): the host, moving H - T per period, never binds before the
   step ends, and an issue time earlier than the ready time changes nothing (the engine only compares them).
   A host with syncs (sim/engine/host.py) issues op i at issue[i] + D, D fixed by its last sync: then
   instead the D of each sync from the oldest one an op after c1 issues after, up to the last one known at
   c1, and that of its image differ by T - H, so every issue time still to come moves by T per period.
4. (causality) No op of the drain (ids >= end_regular) starts before c2, and each op of the regular part's
   last period waits at c1 for an unfinished dep or stream predecessor.

Theorem. If 1-4 hold, the step's events are B's before c2, n copies of B's [c1, c2) one period apart,
then B's after c2 shifted by nT (micro-batch mb standing for mb + n unit).
Proof. (i) B and R_inf agree before c2: the ops B starts by then are regular (4), with the same inputs in
R_inf (Lemma S), and the ops after the regular part are blocked in both: B's last regular period is
blocked at c1 (4), so by 1 and induction on op ids its images are blocked at c2, and every later op of
R_inf waits, through its stream or the P2P batch posted before it, for an op of the period before.
(ii) Hence R_inf's state at c2 is mu of its state at c1 (1-2 give a-c, Lemma S gives e; d as in 3), so by
determinism and shift invariance its events on [c2, c2 + T) are mu of those on [c1, c2) shifted by T and
its state at c2 + T is mu^2 of the state at c1: by induction every period, the slack in 3 covering the
j-th (s + j (T - H) >= 0 for j <= n). (iii) The step agrees with R_inf before c2 + nT (as in i, its drain
n periods later by Lemma S); its state there is mu^n of B's at c2, the drain renumbered, the host nH later
(3): so its events after c2 + nT are B's after c2, shifted by nT.

Consequences: step(M) = step(B) + nT. A per-step sum that integrates over time a function of which streams
are busy (sim/results/breakdown.py: busy, exposed, bubble, waiting times) is Q(B) + n (Q(B+) - Q(B)), B+
being B with one period inserted (built from B's events). Collective counts and ops per rank gain n
times those of one regular period. The critical path: sim/results/period_path.py.

The theorem is exact in real arithmetic. The engine computes in floating point, where shifted times
round differently, so every comparison allows tol = REL_TOL x step(B); the differential test
(tests/test_steady_state*.py) measures, but does not prove, that this suffices. When a check fails (a
host catching up with its GPU, gathers or interference not yet settled, a straggler, no period), meshsim
tries once more with the cuts later (sim/results/simulate.py later_plan, when the step is at least twice
that run), then simulates the whole step and records the failed check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np

from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.results.breakdown import breakdown
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.results.period_path import extend_path, inside_an_op
from meshsim.sim.results.period_proof import REL_TOL, Proof, prove
from meshsim.sim.schedule.ops import Schedule

__all__ = ["REL_TOL", "Extrapolated", "Plan", "Run", "SteadyState", "expanded", "extrapolate", "linear"]


@dataclass(frozen=True)
class Plan:
    """Micro-batches before the steady state (lead), in the drain (tail), and per period (unit)."""

    lead: int = 1  # micro-batch 0 opens the step (parameter gathers gate its forward)
    tail: int = 1  # the last micro-batch's backward overlaps the DP gradient reduction
    unit: int = 1

    def run_length(self, micro_batches: int, force: bool = False) -> int | None:
        """Micro-batches of the one run (M minus it a whole number of periods), or None when the step is
        too short for it to save time (with `force`: only when no period is left to extrapolate)."""
        n_b = self.lead + 2 * self.unit + self.tail
        n_b += (micro_batches - n_b) % self.unit
        least = n_b + (self.unit if force else max(self.unit, n_b // 4))
        return n_b if micro_batches >= least else None


@dataclass(frozen=True)
class SteadyState:
    """Which path produced a result (results.json "steady_state"): "extrapolated" with its period, or
    "full" with the reason (requested, too short, or the check that failed)."""

    path: str
    reason: str = ""
    micro_batches: int = 0  # of the real step
    simulated_micro_batches: int = 0  # the run
    unit: int = 0  # micro-batches per period
    period_s: float = 0.0
    periods: int = 0  # periods not simulated (n)
    gap_start_s: float = 0.0  # where they start on the shown timeline (the second cut)

    def to_json(self) -> dict:
        if self.path != "extrapolated":
            return {"path": self.path, "reason": self.reason}
        return {"path": self.path, "micro_batches": self.micro_batches,
                "simulated_micro_batches": self.simulated_micro_batches, "unit": self.unit,
                "period_s": self.period_s, "periods": self.periods, "gap_start_s": self.gap_start_s}

    @classmethod
    def from_json(cls, data: Mapping) -> SteadyState:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Run:
    """The simulated run: its schedules (one per pipeline stage), events, critical path, the first rank's
    breakdown, collective counts (per stage), host issue times (per stage) and kappa."""

    schedules: tuple[Schedule, ...]
    log: EventLog
    path: list[Segment]
    breakdown_s: Mapping[str, float]
    counts: Counter
    issue_s: tuple[Sequence[float], ...]
    kappa: float


@dataclass(frozen=True)
class Extrapolated:
    step_s: float
    breakdown_s: dict[str, float]
    path: list[Segment]  # the period's segments carry count = n + 1
    events: Sequence[Event]  # the run's, those after the second cut shifted (stepped_events)
    collective_counts: Counter
    ops_per_rank: int
    state: SteadyState


def extrapolate(run: Run, plan: Plan, micro_batches: int, stage_of: Callable[[int], int] = lambda rank: 0,
                pipeline: bool = False, count: Callable[[Schedule, int, int], Counter] = lambda s, lo, hi: Counter()
                ) -> Extrapolated | str:
    """The step of `micro_batches` from the run (module docstring), or the first check that fails;
    `count(schedule, lo, hi)`: the collectives of its ops lo..hi-1 by key, as the run's `counts` were taken."""
    proof = prove(run.schedules, run.log, plan.lead, plan.unit, micro_batches, stage_of, run.issue_s, run.kappa,
                  inside_an_op(run.path))
    if isinstance(proof, str):
        return proof
    path = extend_path(run.path, run.schedules, run.log, proof)
    if isinstance(path, str):
        return path
    shown = stepped_events(run.log, proof, proof.periods)
    if isinstance(shown, str):
        return shown
    plus = stepped_events(run.log, proof, 1, rank=run.log.ranks[0])
    if isinstance(plus, str):
        return plus
    cut, n, log = proof.cut, proof.periods, run.log
    plus_split = breakdown(plus, log.step_time_s + cut.period_s, pipeline=pipeline, schedules=run.schedules)
    per_period = Counter({(s, *key): c for s, (m, schedule) in enumerate(zip(proof.maps, run.schedules, strict=True))
                          for key, c in count(schedule, m.end_regular - m.period_ops, m.end_regular).items()})
    state = SteadyState("extrapolated", micro_batches=micro_batches,
                        simulated_micro_batches=run.schedules[0].micro_batches, unit=plan.unit,
                        period_s=cut.period_s, periods=n, gap_start_s=cut.c2)
    return Extrapolated(
        step_s=log.step_time_s + n * cut.period_s, breakdown_s=linear(run.breakdown_s, plus_split, n),
        path=path, events=shown,
        collective_counts=Counter({k: run.counts[k] + n * per_period[k] for k in run.counts}),
        ops_per_rank=max(len(m.ops) + n * m.period_ops for m in proof.maps), state=state)


def stepped_events(log: EventLog, proof: Proof, n: int, rank: int | None = None) -> Sequence[Event] | str:
    """The events of the run with n periods inserted at the second cut, as far as the run holds them: ops
    started before c2 keep their times (one still running at c2 ends when its image k periods earlier
    ended, plus kT), later ones move by nT; with n = 1 the inserted period's events (the run's from
    [c1, c2), one period later) are included, so that per-step sums of one more period can be taken.
    `rank`: that rank's events only. Computed on the log's columns; the result is the log's rows retimed
    (EventLog.retimed: arrays over the compiled core's log, tuples over the reference's)."""
    cut, cols = proof.cut, log.columns()
    c1, c2, t = cut.c1, cut.c2, cut.period_s
    rows = np.arange(len(cols), dtype=np.int64) if rank is None else log.rows_of()[rank].order
    start, end = (cols.start_s, cols.end_s) if rank is None else (cols.start_s[rows], cols.end_s[rows])  # read only
    after = start >= c2
    new_start, new_end = start.copy(), end.copy()
    new_start[after] = start[after] + n * t
    new_end[after] = end[after] + n * t
    for k in np.flatnonzero(~after & (end > c2)).tolist():
        row = int(rows[k])
        r = int(cols.rank[row])
        ends = _end_after(int(cols.op_id[row]), float(end[k]), log.rows_of()[r].row_of, cols.end_s,
                          proof.map_of(r), cut, n)
        if ends is None:
            e = log.events[row]
            return f"{e.name} (rank {e.rank}) runs across the second cut and has no image to end with"
        new_end[k] = ends
    if n == 1 and rank is not None:  # the inserted period: a copy one period later before each op of [c1, c2)
        copied = ~after & (start >= c1)
        twice = 1 + copied.astype(np.int64)
        first = np.cumsum(twice) - twice  # where each row's first entry lands
        out_rows, out_start, out_end = np.repeat(rows, twice), np.repeat(new_start, twice), np.repeat(new_end, twice)
        at = first[copied]
        out_start[at], out_end[at] = start[copied] + t, end[copied] + t
        return log.retimed(out_rows, out_start, out_end)
    return log.retimed(rows, new_start, new_end)


def _end_after(op_id: int, end_s: float, row_of: np.ndarray, ends: np.ndarray, m, cut, n: int) -> float | None:
    """When op `op_id`, running at c2 in the run (until end_s), ends in the step: its image k <= n periods
    earlier ended before c2 (where the run is R_inf), plus kT; if none did, its image n periods earlier is
    running at c2 and the step ends it as the run does, plus nT. row_of, ends: the rank's row of each op id
    and the log's end column."""
    cur, cur_end = op_id, end_s
    for k in range(1, n + 1):
        pre = m.mu_inv(cur)
        if pre is None or pre == cur:
            return None
        row = int(row_of[pre])
        if row < 0:
            raise KeyError(pre)
        cur, cur_end = pre, float(ends[row])
        if cur_end <= cut.c2:
            return cur_end + k * cut.period_s
    return cur_end + n * cut.period_s


def linear(q_a: Mapping[str, float], q_b: Mapping[str, float], n: int) -> dict[str, float]:
    """Q(A) + n (Q(B) - Q(A)) for each key."""
    return {k: q_a[k] + n * (v - q_a[k]) for k, v in q_b.items()}


def expanded(path: Iterable[Segment]) -> float:
    """Total microseconds of a path whose segments may stand for `count` periods."""
    return sum(s.dur_us * s.count for s in path)
