"""Glue: ResolvedScenario -> schedule -> costs (the engine's pricing callables: costers.py) -> engine -> StepResult.

Symmetry (default): every TP peer and DP replica runs the same schedule, so every collective's members
issue it at the same time; one representative rank (global rank 0) is simulated. Each collective is
costed on the scenario's real group (rs.tp_group(0) / rs.dp_group(0)) with `concurrent_groups` = every
other TP (DP) group, which runs the same collective at the same moment, so symmetric contention is in
the cost. Costs are memoized per (op kind, group, nbytes): simulation work grows with the schedule, not
with the number of GPUs.

explicit_ranks=True simulates one whole TP group times min(dp, 2) replicas with real rendezvous; on a
symmetric mesh it must give the same step time (tests/test_engine.py and tests/test_run_cli.py check it).

Compute/communication interference: kappa = comm_interference(rs) (hardware.compute, else the profile's
compute section, else 0) is handed to the engine, which shares each rank's compute resource between
compute ops and overlapping collectives (sim/engine/events.py); 0 leaves the engine's fast path untouched.

Pipeline parallelism (pp > 1): every stage has its own schedule (sim/schedule/pipeline_builder.py) and one
representative rank per stage is simulated (the first rank of the stage; the ranks of a stage are
symmetric across tp and dp), so the cost stays flat in the DP size; explicit_ranks simulates one TP group
times min(dp, 2) replicas of every stage. P2P transfers are costed on their real route with the other
(tp, dp) positions' copies as concurrent flows (sim/cost/collectives/p2p.py).

Collective times: the hardware profile's measured table first (sim/cost/calibrated.py; its time is split
into the analytic latency part, capped at the measured time, and a bandwidth part that contends for
links), else the analytic model (sim/collectives) with hardware.network's algo / protocol / tuning.
"""

from __future__ import annotations

import ctypes  # malloc_trim (release_freed_memory); numpy has already loaded it
import gc
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import cache

from meshsim.scenarios.limits import check_run_ops
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.core.engines import EngineName
from meshsim.sim.cost.flops import hardware_flops_per_step, model_flops_per_step
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.engine import events as engine
from meshsim.sim.engine.event_rows import events_of_rank
from meshsim.sim.results import steady_state
from meshsim.sim.results.breakdown import breakdown
from meshsim.sim.results.costers import (
    CollectiveCoster,
    P2PCoster,
    collective_counts,
    comm_interference,
    compute_fn,
    count_collectives_between,
    host_issue_times,
)
from meshsim.sim.results.path_columns import critical_path_columns
from meshsim.sim.results.step_result import StepResult, assemble, build_result, rows_by_event
from meshsim.sim.schedule.ops import Collective, Schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules


def rank_groups(rs: ResolvedScenario, schedules: Sequence[Schedule], ranks: tuple[int, ...]
                ) -> dict[tuple[str, int], tuple[int, ...]]:
    """(group kind, simulated rank) -> the global ranks of that group (for trace args), over every kind
    the stages' collectives use."""
    kinds = {w.group for s in schedules for w in s.work_table.works if isinstance(w, Collective)}
    return {(kind, rank): tuple(rs.group(kind, rank)) for kind in kinds for rank in ranks}


def simulated_ranks(rs: ResolvedScenario, explicit_ranks: bool) -> tuple[int, ...]:
    """Per pipeline stage: its first rank alone, or one TP group times min(dp, 2) replicas."""
    per_stage = range(ranks_per_stage(rs, explicit_ranks))
    return tuple(stage * rs.stage_size + r for stage in range(rs.pp) for r in per_stage)


def ranks_per_stage(rs: ResolvedScenario, explicit_ranks: bool) -> int:
    """Ranks simulated per pipeline stage (simulated_ranks): each runs its stage's whole schedule."""
    return rs.tp * rs.cp * min(rs.dp, 2) if explicit_ranks else 1


def run_stages(rs: ResolvedScenario, schedules: tuple[Schedule, ...], ranks: tuple[int, ...],
               coster: CollectiveCoster, engine_name: EngineName | None = None,
               issue_s: Sequence[Sequence[float]] | None = None) -> engine.EventLog:
    """The engine over `ranks`, each running its stage's schedule, on the scenario's engine (run.engine)
    unless `engine_name` says otherwise. `issue_s`: each stage's host_issue_times(rs, schedule), when the
    caller has them (the same values: a pure function of the two)."""
    loop = engine_name or rs.scenario.run.engine
    issue = issue_s if issue_s is not None else issue_columns(rs, schedules)
    if rs.pp == 1:
        return engine.run(schedules[0], ranks, compute_fn(rs), coster, rs.group, engine=loop,
                          comm_interference=comm_interference(rs), issue_s=issue[0])
    # each stage's host issues its own ops (it does not wait at blocking P2P here: a lower bound)
    return engine.run(schedules, ranks, compute_fn(rs), coster, rs.group, comm_interference=comm_interference(rs),
                      issue_s=list(issue), stage_of=rs.stage_of, p2p=P2PCoster(rs), engine=loop)


def issue_columns(rs: ResolvedScenario, schedules: Sequence[Schedule]) -> tuple[array, ...]:
    """Each stage's host_issue_times(rs, schedule) as a packed array of doubles: the same values (an item
    reads back as the same float), 8 bytes an op instead of a float object and a list slot (~40 bytes),
    built one stage at a time (a step at today's scale issues ~10^6 ops)."""
    return tuple(array("d", host_issue_times(rs, s)) for s in schedules)


def simulate_with_events(rs: ResolvedScenario, *, explicit_ranks: bool = False, engine_name: EngineName | None = None,
                         state: steady_state.SteadyState | None = None, lean: bool = False
                         ) -> tuple[StepResult, engine.EventLog, Schedule]:
    """The whole step simulated: its result, its event log and stage 0's schedule (the others:
    build_stage_schedules(rs)); `state` is what the result's steady_state says about it (simulate: why
    the step was not extrapolated); `lean`: build_result's."""
    check_run_ops(rs.scenario, rs.micro_batches, source=rs.source, ranks_per_stage=ranks_per_stage(rs, explicit_ranks))
    schedules = build_stage_schedules(rs)
    coster = CollectiveCoster(rs)
    log = run_stages(rs, schedules, simulated_ranks(rs, explicit_ranks), coster, engine_name)
    release_freed_memory()  # the engine's tables
    collectives = [row for s in schedules for row in coster.chosen(s, s.stage * rs.stage_size)]
    result = build_result(rs, schedules, log, memory=memory_per_gpu(rs), model_flops=model_flops_per_step(rs),
                          collectives=collectives, explicit_ranks=explicit_ranks,
                          hardware_flops=hardware_flops_per_step(rs),
                          rank_groups=rank_groups(rs, schedules, log.ranks), steady_state=state, lean=lean)
    return result, log, schedules[0]


def steady_plan(rs: ResolvedScenario) -> steady_state.Plan:
    """Micro-batches of warm-up (lead), drain (tail) and period (unit) of this scenario's schedule
    (sim/results/steady_state.py).

    Without PP: micro-batch 0 opens the step and the last one overlaps the gradient reduction.
    Pipelines: the period is one micro-batch for plain 1F1B and one group of N micro-batches for the
    interleaved schedule (each stage runs E = v N forward entries, and as many backward ones, per period;
    E = 1 for 1F1B). Stage 0 runs w = p - 1 (interleaved: 2 (p - 1) + (v - 1) N, one more with
    parallel.moe_ep_overlap, whose steady steps merge the pair) warm-up forwards, and
    afterwards pairs forward entry k with backward entry k - w, so a period is steady once the backwards
    it is paired with are past the first period: g = ceil(w / E) periods of drain (the cool-down's w
    backwards) and g + 1 periods of lead. 1F1B: lead p, tail p - 1. The plan only places the run's cuts
    and sizes it; whether the state there repeats is what the proof checks."""
    if rs.pp == 1:
        return steady_state.Plan()
    n = (rs.scenario.parallel.microbatch_group_size or rs.pp) if rs.vp > 1 else 1
    warmup = rs.pp - 1 if rs.vp == 1 else 2 * (rs.pp - 1) + (rs.vp - 1) * n + rs.scenario.parallel.moe_ep_overlap
    periods = -(-warmup // (rs.vp * n))
    return steady_state.Plan(lead=(periods + 1) * n, tail=periods * n, unit=n)


def short_steady_plan(rs: ResolvedScenario) -> steady_state.Plan | None:
    """Interleaved pipelines: the plan with one lead period fewer (lead = tail = g periods), or None.

    The first g periods hold stage 0's warm-up forwards and the last g its cool-down backwards, so the
    periods in between run only steady F/B pairs; whether their state has settled already in period g
    depends on the stages' timing, which the proof decides. Used only when steady_plan's run would be
    too long to save time."""
    if rs.pp == 1 or rs.vp == 1:
        return None
    plan = steady_plan(rs)
    return replace(plan, lead=plan.lead - plan.unit)


def plan_and_run(rs: ResolvedScenario, force: bool) -> tuple[steady_state.Plan, int] | None:
    """steady_plan and its run's micro-batches, else short_steady_plan's when that run is short enough."""
    for plan in (steady_plan(rs), short_steady_plan(rs)):
        n_b = plan.run_length(rs.micro_batches, force) if plan is not None else None
        if n_b is not None:
            return plan, n_b
    return None


def _short_run(rs: ResolvedScenario, micro_batches: int, explicit_ranks: bool, coster: CollectiveCoster,
               engine_name: EngineName | None) -> steady_state.Run:
    """The step shortened to `micro_batches`, simulated whole (the run simulate_steady extrapolates)."""
    check_run_ops(rs.scenario, micro_batches, source=rs.source, ranks_per_stage=ranks_per_stage(rs, explicit_ranks),
                  why=" by the steady state's run")
    short = replace(rs, micro_batches=micro_batches)
    schedules = build_stage_schedules(short)
    issue = issue_columns(short, schedules)
    log = run_stages(short, schedules, simulated_ranks(rs, explicit_ranks), coster, engine_name, issue)
    release_freed_memory()  # the engine's tables
    rep = log.of_rank(log.ranks[0])
    path = critical_path_columns(schedules, log)
    split = breakdown(rep, log.step_time_s, pipeline=rs.pp > 1, schedules=schedules)
    counts = Counter({(s.stage, *key): c for s in schedules for key, c in collective_counts(s).items()})
    return steady_state.Run(schedules, log, path, split, counts, issue, comm_interference(rs))


def later_plan(plan: steady_state.Plan) -> steady_state.Plan:
    """The plan with its cuts later in the step (lead 2 lead + 2 unit): for transients the first plan's
    period has not seen settle (overlapped parameter gathers, a host still catching up with its GPU)."""
    return replace(plan, lead=2 * plan.lead + 2 * plan.unit)


def simulate_steady(rs: ResolvedScenario, *, explicit_ranks: bool = False, force: bool = False,
                    engine_name: EngineName | None = None, lean: bool = False) -> tuple[StepResult | None, str]:
    """(The step extrapolated from one short run, "") (sim/results/steady_state.py), or (None, why not): the
    step is too short to gain from it (unless `force`, which only needs one more period than the run) or
    a premise of the proof fails, also with later_plan when the step is at least twice its run."""
    chosen = plan_and_run(rs, force)
    if chosen is None:
        return None, f"{rs.micro_batches} micro-batches are too few to gain from extrapolating"
    plan, n_b = chosen
    coster = CollectiveCoster(rs)
    run = _short_run(rs, n_b, explicit_ranks, coster, engine_name)
    ex = steady_state.extrapolate(run, plan, rs.micro_batches, rs.stage_of, rs.pp > 1, count_collectives_between)
    retry = later_plan(plan)
    n_retry = retry.run_length(rs.micro_batches, force=True)
    if isinstance(ex, str) and n_retry is not None and 2 * n_retry <= rs.micro_batches:
        run = _short_run(rs, n_retry, explicit_ranks, coster, engine_name)
        again = steady_state.extrapolate(run, retry, rs.micro_batches, rs.stage_of, rs.pp > 1, count_collectives_between)
        ex = again if not isinstance(again, str) else f"{ex}; with the cuts {retry.lead - plan.lead} " \
                                                      f"micro-batches later: {again}"
    schedules, ranks = run.schedules, run.log.ranks
    del run  # the run's log, path and issue times: the result reads the extrapolated events and path
    release_freed_memory()  # the proof's temporaries, the run's arrays the events do not share
    if isinstance(ex, str):
        return None, ex
    collectives = [row for stage in range(rs.pp) for row in coster.rows(
        Counter({key[1:]: c for key, c in ex.collective_counts.items() if key[0] == stage}),
        stage * rs.stage_size)]
    by_op = {} if lean else rows_by_event(schedules, collectives, ranks, rs.stage_size)
    return assemble(rs, ex.step_s, events_of_rank(ex.events, ranks[0]), ex.breakdown_s, ex.path,
                    memory=memory_per_gpu(rs), model_flops=model_flops_per_step(rs), collectives=collectives,
                    explicit_ranks=explicit_ranks, simulated_ranks=len(ranks),
                    ops_per_rank=ex.ops_per_rank, events=() if lean else ex.events, steady_state=ex.state,
                    hardware_flops=hardware_flops_per_step(rs), op_collectives=by_op,
                    rank_groups=rank_groups(rs, schedules, ranks), schedules=schedules, lean=lean), ""


def simulate(rs: ResolvedScenario, *, explicit_ranks: bool = False, full: bool = False,
             engine_name: EngineName | None = None, lean: bool = False) -> StepResult:
    """Simulate one training step: extrapolated from its steady state when that is proven exact and
    cheaper (sim/results/steady_state.py), else (or with full=True) every micro-batch; result.steady_state
    says which. Events are kept in `result.events` (the simulated ones only when extrapolated).
    engine_name: the event loop (default: the scenario's run.engine). `lean`: a result without the
    op-by-op critical path, the events and the op -> collective map (a sweep's record: the same figures,
    the critical path's shares and op types included)."""
    reason = "requested (--full)"
    if not full:
        result, reason = simulate_steady(rs, explicit_ranks=explicit_ranks, engine_name=engine_name, lean=lean)
        if result is not None:
            return result
    check_run_ops(rs.scenario, rs.micro_batches, source=rs.source, ranks_per_stage=ranks_per_stage(rs, explicit_ranks),
                  why=f" by the whole step (not extrapolated: {reason})")
    return simulate_with_events(rs, explicit_ranks=explicit_ranks, engine_name=engine_name,
                                state=steady_state.SteadyState("full", reason), lean=lean)[0]


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim(0); elsewhere nothing): between
    the phases of a step (the engine's per-run tables, a proof's temporaries are freed by then) glibc
    keeps freed blocks of the heap as resident memory, and the next phase's arrays, placed in the heap
    once its mmap threshold has grown, do not reuse all of them. Changes no value."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, or none loadable)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


@contextmanager
def gc_frozen(program: bool = False) -> Iterator[None]:
    """Run the block with the cyclic garbage collector off: a step allocates ~10^5 long-lived objects
    (ops, events, segments) and no cycles, so each collection would rescan them all for nothing; the
    collector is back as it was after the block. Nothing is ever unfrozen here (gc.unfreeze thaws every
    frozen object, also those frozen by someone else: the CLI's import-time freeze, a caller's own).
    `program`: the process ends right after the block (the `meshsim` program itself, not a caller in a
    test, notebook or API server), so every object is frozen on the way out: the first collection after
    the block would otherwise rescan each of the block's objects, ~0.3 s for a DeepSeek-V3 step, for
    nothing. Otherwise the block's objects go back to the collector as any others."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if program:
            gc.freeze()
        if was_enabled:
            gc.enable()
