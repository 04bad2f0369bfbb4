"""The steady-state theorem's premises, checked on one simulated run (sim/results/steady_state.py states
the theorem and why these premises suffice). `prove` returns a Proof (the cut, the period, the number of
periods to insert and the stages' op maps) or the first premise that fails, in one line."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.engine.host import HostSyncs, delays_s, host_syncs, last_known
from meshsim.sim.schedule.ops import Schedule
from results_reference.period_state import (
    DONE,
    TODO,
    Cut,
    StageMap,
    choose_cut,
    jobs_repeat,
    mu_key,
    mu_tag,
    phase,
    same_state,
    stage_map,
    transfer_index,
)

REL_TOL = 1e-9  # allowed relative deviation of any simulated time from its periodic image (float round-off)


@dataclass(frozen=True)
class Proof:
    cut: Cut
    periods: int  # n: periods the step has beyond the run
    maps: tuple[StageMap, ...]
    stage_of: Callable[[int], int]
    prevs: tuple[list[int | None], ...]  # per stage: op id -> the op before it on its FIFO stream

    def map_of(self, rank: int) -> StageMap:
        return self.maps[self.stage_of(rank)]


def stream_prev(schedule: Schedule) -> list[int | None]:
    """op id -> the op before it on its FIFO stream (None: first, or a P2P batch)."""
    last: dict[str, int] = {}
    prev: list[int | None] = []
    for op in schedule.ops:
        prev.append(None if op.stream == "pp_comm" else last.get(op.stream))
        if op.stream != "pp_comm":
            last[op.stream] = op.id
    return prev


def prove(schedules: Sequence[Schedule], log: EventLog, lead: int, unit: int, micro_batches: int,
          stage_of: Callable[[int], int], issue: Sequence[Sequence[float]], kappa: float,
          good_cut: Callable[[float], bool] = lambda c: True) -> Proof | str:
    """Every premise of the theorem on this run (module docstring), or the first that fails; the cut is
    one `good_cut` accepts where one is clear of state changes."""
    n_b = schedules[0].micro_batches
    if micro_batches < n_b + unit or (micro_batches - n_b) % unit:
        return f"{micro_batches} micro-batches are not {n_b} plus whole periods of {unit}"
    maps = [stage_map(s, lead, unit) for s in schedules]
    bad = next((m for m in maps if isinstance(m, str)), None)
    if bad is not None:
        return bad
    tol_s = REL_TOL * log.step_time_s
    by = log.by_rank()
    rep, m0 = log.ranks[0], maps[stage_of(log.ranks[0])]
    x, y = by[rep][m0.id_of[(lead, 0)]], by[rep][m0.id_of[(lead + unit, 0)]]
    period_s = y.start_s - x.start_s
    if period_s <= 1e3 * tol_s:
        return "the period is not longer than the tolerance"
    c1 = choose_cut(log, x.start_s, period_s, tol_s, lambda c: good_cut(c) and good_cut(c + period_s))
    if c1 is None:
        return "no time in the first period is clear of state changes there and one period later"
    proof = Proof(Cut(c1, period_s, tol_s, kappa), (micro_batches - n_b) // unit, tuple(maps), stage_of,
                  tuple(stream_prev(s) for s in schedules))
    for check in (_drain_after_cut, _states, _host):
        reason = check(proof, log, issue)
        if reason is not None:
            return reason
    return jobs_repeat(log.jobs, proof.cut, lambda tag: mu_tag(tag, proof.map_of, unit),
                       lambda key: mu_key(key, proof.maps, unit)) or proof


def _unfinished(e: Event, c: float) -> bool:
    return e.end_s > c


def _drain_after_cut(proof: Proof, log: EventLog, issue) -> str | None:
    """Causality: nothing of the drain (ids from end_regular on) has started by c2, and the last period of
    the regular part is still blocked at c1 (each of its ops waits for an unfinished dep or stream
    predecessor), so its images one period later cannot start before c2 either."""
    c1, c2 = proof.cut.c1, proof.cut.c2
    by = log.by_rank()
    last = max(log.events, key=lambda e: e.end_s)
    if last.start_s <= c2:
        return "the run's last op starts before the second cut"
    for rank in log.ranks:
        m, ev, prev = proof.map_of(rank), by[rank], proof.prevs[proof.stage_of(rank)]
        late = next((ev[i] for i in range(m.end_regular, len(m.ops)) if ev[i].start_s < c2), None)
        if late is not None:
            return f"{late.name} (rank {rank}) of the drain starts before the second cut"
        for i in range(m.end_regular - m.period_ops, m.end_regular):
            waits = [*m.ops[i].deps, *([] if prev[i] is None else [prev[i]])]
            if phase(ev[i].start_s, ev[i].end_s, c1) != TODO or not any(_unfinished(ev[d], c1) for d in waits):
                return f"{ev[i].name} (rank {rank}) of the regular part's last period is not blocked at the first cut"
    return None


def _states(proof: Proof, log: EventLog, issue) -> str | None:
    """The state at c2 is mu of the state at c1: every op of the regular part and the op one period later
    are in the same phase with their past times one period apart; older ops are finished."""
    cut = proof.cut
    by, transfers = log.by_rank(), transfer_index(log.transfers)
    for rank in log.ranks:
        m, ev = proof.map_of(rank), by[rank]
        p, start = m.period_ops, m.first_regular
        old = next((ev[i] for i in range(start) if ev[i].end_s > (cut.c1 if i < start - p else cut.c2)), None)
        if old is not None:
            return f"{old.name} (rank {rank}), before the regular part, is not finished by the cuts"
        for i in range(max(0, start - p), m.end_regular - p):
            if not same_state(ev[i], ev[i + p], m.ops[i], cut, transfers, m.unit):
                return f"{ev[i + p].name} (rank {rank}) is not {ev[i].name} one period later at the cuts"
    return None


def _host(proof: Proof, log: EventLog, issue: Sequence[Sequence[float]]) -> str | None:
    """The host clock: op i is issued at issue[i], and one period later at issue[i] + H (H = P x dispatch
    time), not + T. Ops from c1 on that waited for the host (issue later than deps and stream allowed)
    need H = T; otherwise each period moves the host H - T closer, so the least slack must cover n periods.
    A host with syncs: _synced_host."""
    cut, n = proof.cut, proof.periods
    by = log.by_rank()
    for rank in log.ranks:
        stage = proof.stage_of(rank)
        times = issue[stage] if stage < len(issue) else ()
        if not times:
            continue
        m, ev, prev = proof.maps[stage], by[rank], proof.prevs[stage]
        i0 = m.first_regular
        host_s = times[i0 - 1 + m.period_ops] - times[i0 - 1]
        syncs = host_syncs(m.ops, times)
        if syncs is not None:
            reason = _synced_host(syncs, m, ev, cut, host_s)
            if reason is not None:
                return f"rank {rank}: {reason}"
            continue
        slack_s = _least_slack(ev, m.ops, prev, times, cut.c1)
        if slack_s < -cut.tol_s and abs(host_s - cut.period_s) > cut.tol_s:
            return (f"rank {rank} waits for its host after the first cut while the host issues a period in "
                    f"{host_s * 1e6:.4g} us and the GPU runs one in {cut.period_s * 1e6:.4g} us")
        if slack_s >= -cut.tol_s and n * (host_s - cut.period_s) > slack_s + cut.tol_s:
            return (f"rank {rank}: the host issues a period {(host_s - cut.period_s) * 1e6:.3g} us slower "
                    f"than the GPU runs it; its {slack_s * 1e6:.4g} us lead runs out before the step ends")
    return None


def _synced_host(syncs: HostSyncs, m: StageMap, ev: Mapping[int, Event], cut: Cut, host_s: float) -> str | None:
    """A host that waits at syncs issues op j at static_s[j] + D of its last sync (sim/engine/host.py).
    An image sync releases the host one period T later while its static clock is H later, so D grows by
    T - H per period; if it does for every sync from the oldest one an op not started at c1 issues after
    up to the last one known at c1, every issue time still to come at c2 is that at c1 plus T (the static
    part H, D the rest), and the syncs to come keep it so: no slack is needed."""
    c1, end_of = cut.c1, (lambda op_id: ev[op_id].end_s)
    waiting = [syncs.point_of[e.op_id] for e in ev.values() if e.start_s > c1 and e.stream != "pp_comm"]
    if not waiting:
        return None
    if min(waiting) < 0:
        return "an op its host issues before any sync starts after the first cut"
    delays, index = delays_s(syncs, end_of), {op: i for i, op in enumerate(syncs.ops)}
    for i in range(min(waiting), max(min(waiting), last_known(syncs, end_of, c1)) + 1):
        image = index.get(m.mu(syncs.ops[i]))
        if image is None:
            return f"the host's sync at op {syncs.ops[i]} has no image one period later"
        grown_s = delays[image] - delays[i]
        if abs(grown_s - (cut.period_s - host_s)) > cut.tol_s:
            return (f"the host's delay at its sync at op {syncs.ops[i]} grows {grown_s * 1e6:.4g} us in a period, "
                    f"not T - H = {(cut.period_s - host_s) * 1e6:.4g} us")
    return None


def _least_slack(ev: Mapping[int, Event], ops, prev: list[int | None], times: Sequence[float], c1: float) -> float:
    """min over the FIFO ops starting after c1 of (when deps and stream predecessor had finished, which
    the engine waits for before it asks the host) - (when the host issued the op)."""
    least = float("inf")
    for e in ev.values():
        if e.start_s <= c1 or e.stream == "pp_comm":
            continue
        op_id = e.op_id
        ready = max([ev[d].end_s for d in ops[op_id].deps], default=0.0)
        before = prev[op_id]
        if before is not None and ev[before].end_s > ready:
            ready = ev[before].end_s
        if ready - times[op_id] < least:
            least = ready - times[op_id]
    return 0.0 if least == float("inf") else least


__all__ = ["DONE", "REL_TOL", "Proof", "prove", "stream_prev"]
