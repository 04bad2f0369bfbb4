"""The steady-state theorem's premises, checked on one simulated run (sim/results/steady_state.py states
the theorem and why these premises suffice). `prove` returns a Proof (the cut, the period, the number of
periods to insert and the stages' op maps) or the first premise that fails, in one line.

The checks read the run as arrays (sim/results/run_arrays.py: each rank's times by op id from the log's
columns, each stage's deps in CSR form) and decide every op at once with exact comparisons and max / min
reductions; only the few ops running at a cut are looked at one by one. They give the per-event loops'
verdicts, reasons word for word (tests/test_results_arrays.py against tests/results_reference/)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from meshsim.sim.engine.events import EventLog
from meshsim.sim.engine.host import HostSyncs, delays_s, last_known, schedule_syncs
from meshsim.sim.results.period_state import (
    DONE,
    RUNNING,
    TODO,
    Cut,
    StageMap,
    choose_cut,
    jobs_repeat,
    mu_key,
    mu_tag,
    side,
    stage_map,
    transfer_index,
    transfers_repeat,
)
from meshsim.sim.results.run_arrays import RankTimes, StageOps, phases, times_of_rank
from meshsim.sim.schedule.ops import P2P, Collective, Schedule

REL_TOL = 1e-9  # allowed relative deviation of any simulated time from its periodic image (float round-off)


@dataclass(frozen=True)
class Proof:
    cut: Cut
    periods: int  # n: periods the step has beyond the run
    maps: tuple[StageMap, ...]
    stage_of: Callable[[int], int]
    prev_ids: tuple[np.ndarray, ...]  # per stage: op id -> the op before it on its FIFO stream (-1: none)

    @cached_property
    def prevs(self) -> tuple[list[int | None], ...]:
        """prev_ids as lists, None where there is none (StageOps.prev_list), built when first read."""
        return tuple([None if p < 0 else p for p in ids.tolist()] for ids in self.prev_ids)

    def map_of(self, rank: int) -> StageMap:
        return self.maps[self.stage_of(rank)]


def stream_prev(schedule: Schedule) -> list[int | None]:
    """op id -> the op before it on its FIFO stream (None: first, or a P2P batch)."""
    return StageOps.of(schedule).prev_list()


@dataclass(frozen=True, eq=False)
class _Rank:
    """What the checks read of one rank: its stage's StageOps, map and schedule, its times by op id
    (run_arrays.times_of_rank) and its host's issue times; `transfers`: the run's transfer index, shared
    by the ranks and built when first needed (a one-item list)."""

    rank: int
    stage: int
    ops: StageOps
    m: StageMap
    t: RankTimes
    schedule: Schedule
    issue: Sequence[float]
    transfers: list

    @cached_property
    def waits_end(self) -> np.ndarray:
        """Per op: when its deps and stream predecessor had all finished (StageOps.latest_wait_end with
        -inf for an op without deps), read by the causality and the host checks."""
        return self.ops.latest_wait_end(self.t.end, -np.inf)


def prove(schedules: Sequence[Schedule], log: EventLog, lead: int, unit: int, micro_batches: int,
          stage_of: Callable[[int], int], issue: Sequence[Sequence[float]], kappa: float,
          good_cut: Callable[[float], bool] = lambda c: True) -> Proof | str:
    """Every premise of the theorem on this run (module docstring), or the first that fails; the cut is
    one `good_cut` accepts where one is clear of state changes."""
    n_b = schedules[0].micro_batches
    if micro_batches < n_b + unit or (micro_batches - n_b) % unit:
        return f"{micro_batches} micro-batches are not {n_b} plus whole periods of {unit}"
    stages = tuple(StageOps.of(s) for s in schedules)
    maps = []
    for s, st in zip(schedules, stages, strict=True):  # stop at the first stage without a period
        maps.append(stage_map(s, lead, unit, (st.dep_ptr, st.dep_ids)))
        if isinstance(maps[-1], str):
            return maps[-1]
    tol_s = REL_TOL * log.step_time_s
    rep, m0 = log.ranks[0], maps[stage_of(log.ranks[0])]
    starts = times_of_rank(log, rep, len(schedules[stage_of(rep)].ops)).start
    period_s = float(starts[m0.index.id_of((lead + unit, 0))] - starts[m0.index.id_of((lead, 0))])
    x_start_s = float(starts[m0.index.id_of((lead, 0))])
    del starts
    if period_s <= 1e3 * tol_s:
        return "the period is not longer than the tolerance"
    c1 = choose_cut(log, x_start_s, period_s, tol_s, lambda c: good_cut(c) and good_cut(c + period_s))
    if c1 is None:
        return "no time in the first period is clear of state changes there and one period later"
    proof = Proof(Cut(c1, period_s, tol_s, kappa), (micro_batches - n_b) // unit, tuple(maps), stage_of,
                  tuple(st.prev for st in stages))
    reason = _premises(proof, log, stages, schedules, issue)
    if reason is not None:
        return reason
    return jobs_repeat(log.jobs, proof.cut, lambda tag: mu_tag(tag, proof.map_of, unit),
                       lambda key: mu_key(key, proof.maps, unit), log.span_times("jobs")) or proof


def _premises(proof: Proof, log: EventLog, stages: Sequence[StageOps], schedules: Sequence[Schedule],
              issue: Sequence[Sequence[float]]) -> str | None:
    """The per-rank premises, in their order: causality (_drain_after_cut), the ops' states (_states),
    the host (_host); the first that fails, on the first rank it fails on, as checking each over every
    rank in turn gives. Read one rank at a time (one rank's times held at once, not every rank's): a
    rank's verdict on a check reads only that rank, so at each rank only the checks before the earliest
    one failed so far are asked, in order, up to the first that fails there."""
    c2, cols = proof.cut.c2, log.columns()
    if cols.start_s[int(np.argmax(cols.end_s))] <= c2:  # the first event of the latest end, as max() takes
        return "the run's last op starts before the second cut"
    checks = (_drain_after_cut, _states, _host)
    found, asked, transfers = None, len(checks), []
    for rank in log.ranks:
        stage = proof.stage_of(rank)
        here = _Rank(rank, stage, stages[stage], proof.maps[stage],
                     times_of_rank(log, rank, len(schedules[stage].ops)), schedules[stage],
                     issue[stage] if stage < len(issue) else (), transfers)
        for k in range(asked):
            reason = checks[k](proof, log, here)
            if reason is not None:
                found, asked = reason, k
                break
    return found


def _first(mask: np.ndarray) -> int | None:
    """The first index where mask holds, or None."""
    hit = np.flatnonzero(mask)
    return int(hit[0]) if len(hit) else None


def _drain_after_cut(proof: Proof, log: EventLog, r: _Rank) -> str | None:
    """Causality: nothing of the drain (ids from end_regular on) has started by c2, and the last period of
    the regular part is still blocked at c1 (each of its ops waits for an unfinished dep or stream
    predecessor), so its images one period later cannot start before c2 either (one rank; the run's
    last op starting after c2: _premises)."""
    c1, c2 = proof.cut.c1, proof.cut.c2
    rank, m, t = r.rank, r.m, r.t
    late = _first(t.start[m.end_regular:] < c2)
    if late is not None:
        return f"{m.ops[m.end_regular + late].name} (rank {rank}) of the drain starts before the second cut"
    lo, hi = m.end_regular - m.period_ops, m.end_regular
    waited = r.waits_end[lo:hi] > c1  # some dep or predecessor unfinished
    blocked = phases(t.start[lo:hi], t.end[lo:hi], c1) == TODO
    bad = _first(~(blocked & waited))
    if bad is not None:
        return f"{m.ops[lo + bad].name} (rank {rank}) of the regular part's last period is not blocked at the first cut"
    return None


def _states(proof: Proof, log: EventLog, r: _Rank) -> str | None:
    """The state at c2 is mu of the state at c1: every op of the regular part and the op one period later
    are in the same phase with their past times one period apart; older ops are finished (one rank)."""
    cut, rank, m, t = proof.cut, r.rank, r.m, r.t
    p, start = m.period_ops, m.first_regular
    old = _first(t.end[:start] > np.where(np.arange(start) < start - p, cut.c1, cut.c2))
    if old is not None:
        return f"{m.ops[old].name} (rank {rank}), before the regular part, is not finished by the cuts"
    lo, hi = max(0, start - p), m.end_regular - p
    if hi <= lo:
        return None
    pa = phases(t.start[lo:hi], t.end[lo:hi], cut.c1)
    pb = phases(t.start[lo + p:hi + p], t.end[lo + p:hi + p], cut.c2)
    bad = _first(pa != pb)
    for k in np.flatnonzero((pa == RUNNING) & (pb == RUNNING)).tolist():  # few: those running at c1
        if bad is not None and k >= bad:
            break
        if not r.transfers:
            r.transfers.append(transfer_index(log.transfers))
        if not running_same(t, lo + k, lo + k + p, rank, m.ops[lo + k], cut, r.transfers[0], m.unit):
            bad = k
            break
    if bad is not None:
        return f"{m.ops[lo + bad + p].name} (rank {rank}) is not {m.ops[lo + bad].name} one period later at the cuts"
    return None


def running_same(t: RankTimes, a: int, b: int, rank: int, op, cut: Cut, transfers, unit: int) -> bool:
    """period_state.same_state of ops a and b = mu(a) of one rank, both RUNNING at their cuts."""
    start_a, start_b = float(t.start[a]), float(t.start[b])
    if abs(start_b - start_a - cut.period_s) > cut.tol_s:
        return False
    work = op.work
    if isinstance(work, Collective):
        return side(start_a + float(t.wait[a]), start_b + float(t.wait[b]), cut.c1, cut.c2, cut.period_s, cut.tol_s)
    if isinstance(work, P2P):
        return all(transfers_repeat(rank, x, transfers, cut, unit) for x in work.transfers)
    return cut.kappa > 0 or abs(float(t.end[b]) - float(t.end[a]) - cut.period_s) <= cut.tol_s


def _host(proof: Proof, log: EventLog, r: _Rank) -> str | None:
    """The host clock: op i is issued at issue[i], and one period later at issue[i] + H (H = P x dispatch
    time), not + T. Ops from c1 on that waited for the host (issue later than deps and stream allowed)
    need H = T; otherwise each period moves the host H - T closer, so the least slack must cover n periods.
    A host with syncs: _synced_host (one rank)."""
    cut, n, rank, times = proof.cut, proof.periods, r.rank, r.issue
    if not len(times):
        return None
    m, t = r.m, r.t
    i0 = m.first_regular
    host_s = times[i0 - 1 + m.period_ops] - times[i0 - 1]
    syncs = schedule_syncs(r.schedule, times)  # host_syncs(m.ops, times), off the tiled column
    after = (t.start > cut.c1) & ~r.ops.p2p  # the FIFO ops still to start at c1
    if syncs is not None:
        reason = _synced_host(syncs, m, t, after, cut, host_s)
        return None if reason is None else f"rank {rank}: {reason}"
    slack_s = _least_slack(r, after, times)
    if slack_s < -cut.tol_s and abs(host_s - cut.period_s) > cut.tol_s:
        return (f"rank {rank} waits for its host after the first cut while the host issues a period in "
                f"{host_s * 1e6:.4g} us and the GPU runs one in {cut.period_s * 1e6:.4g} us")
    if slack_s >= -cut.tol_s and n * (host_s - cut.period_s) > slack_s + cut.tol_s:
        return (f"rank {rank}: the host issues a period {(host_s - cut.period_s) * 1e6:.3g} us slower "
                f"than the GPU runs it; its {slack_s * 1e6:.4g} us lead runs out before the step ends")
    return None


def _synced_host(syncs: HostSyncs, m: StageMap, t: RankTimes, after: np.ndarray, cut: Cut,
                 host_s: float) -> str | None:
    """A host that waits at syncs issues op j at static_s[j] + D of its last sync (sim/engine/host.py).
    An image sync releases the host one period T later while its static clock is H later, so D grows by
    T - H per period; if it does for every sync from the oldest one an op not started at c1 issues after
    up to the last one known at c1, every issue time still to come at c2 is that at c1 plus T (the static
    part H, D the rest), and the syncs to come keep it so: no slack is needed. (`after`: the FIFO ops
    still to start at c1.)"""
    waiting = np.flatnonzero(after)
    if not len(waiting):
        return None
    oldest = syncs.point_of[int(waiting[0])]  # the min over `waiting`: point_of never decreases along ids
    if oldest < 0:
        return "an op its host issues before any sync starts after the first cut"
    end_of = memoryview(t.end).__getitem__  # the end of an op id as a float, no list of them all
    delays, index = delays_s(syncs, end_of), {op: i for i, op in enumerate(syncs.ops)}
    for i in range(oldest, max(oldest, last_known(syncs, end_of, cut.c1)) + 1):
        image = index.get(m.mu(syncs.ops[i]))
        if image is None:
            return f"the host's sync at op {syncs.ops[i]} has no image one period later"
        grown_s = delays[image] - delays[i]
        if abs(grown_s - (cut.period_s - host_s)) > cut.tol_s:
            return (f"the host's delay at its sync at op {syncs.ops[i]} grows {grown_s * 1e6:.4g} us in a period, "
                    f"not T - H = {(cut.period_s - host_s) * 1e6:.4g} us")
    return None


def _least_slack(r: _Rank, after: np.ndarray, times: Sequence[float]) -> float:
    """min over the FIFO ops starting after c1 (`after`) of (when deps and stream predecessor had finished,
    which the engine waits for before it asks the host) - (when the host issued the op). `ready` is
    latest_wait_end(end, 0.0) read off r.waits_end (its -inf default): the two differ only at an op
    without deps, where the one is its predecessor's end (-inf: none) and the other that end if above
    0.0, else 0.0."""
    if not after.any():
        return 0.0
    ready = ready_from(r.ops, r.waits_end)
    return float(np.min(ready[after] - np.asarray(times, np.float64)[after]))


def ready_from(ops: StageOps, waits_end: np.ndarray) -> np.ndarray:
    """ops.latest_wait_end(end, 0.0) from waits_end = ops.latest_wait_end(end, -inf), bit for bit."""
    ptr = ops.dep_ptr
    return np.where((ptr[1:] == ptr[:-1]) & ~(waits_end > 0.0), 0.0, waits_end)


__all__ = ["DONE", "REL_TOL", "Proof", "prove", "stream_prev"]
