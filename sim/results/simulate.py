"""Glue: ResolvedScenario -> schedule -> costs -> engine -> StepResult.

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

import gc
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.core.engines import EngineName
from meshsim.sim.core.limits import check_simulated_work
from meshsim.sim.cost.calibrated import table_collective_time_s
from meshsim.sim.cost.collectives import collective_cost
from meshsim.sim.cost.collectives.flex import flex_arguments
from meshsim.sim.cost.collectives.p2p import p2p_cost
from meshsim.sim.cost.compute import ComputeModel, resolve_tuning
from meshsim.sim.cost.flops import hardware_flops_per_step, model_flops_per_step
from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.engine import events as engine
from meshsim.sim.results import steady_state
from meshsim.sim.results.breakdown import breakdown
from meshsim.sim.results.critical_path import critical_path
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.results.step_result import StepResult, assemble, build_result, rows_by_event
from meshsim.sim.schedule.ops import Collective, Op, Schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules


def network_tuning(rs: ResolvedScenario):
    """hardware.network, with fields the scenario leaves unset taken from the profile's network section."""
    mine = rs.scenario.hardware.network
    if rs.profile is None:
        return mine
    theirs = rs.profile.network.model_dump(exclude_unset=True)
    return mine.model_copy(update={k: v for k, v in theirs.items() if k not in mine.model_fields_set})


class CollectiveCoster:
    """collective(op, group) -> (latency_s, bandwidth_s, link_load), memoized per (op, group, nbytes)."""

    def __init__(self, rs: ResolvedScenario):
        self.rs = rs
        self.tuning = network_tuning(rs)
        self.memo: dict[tuple[str, tuple[int, ...], int, str], tuple[engine.CommTiming, CollectiveRow]] = {}

    def __call__(self, op: Op, group: tuple[int, ...]) -> engine.CommTiming:
        return self.cost(op.work, group)[0]

    def cost(self, work: Collective, group: tuple[int, ...]) -> tuple[engine.CommTiming, CollectiveRow]:
        key = (work.op, group, work.nbytes, work.kernel)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._compute(work, group)
        return hit

    def _concurrent(self, kind: str, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(g for g in self.rs.all_groups(kind, group[0]) if g != group)

    def _compute(self, work: Collective, group: tuple[int, ...]) -> tuple[engine.CommTiming, CollectiveRow]:
        row = CollectiveRow(work.op, work.group, len(group), work.nbytes, work.kernel)
        if len(group) < 2 or work.nbytes == 0:
            return (0.0, 0.0, {}), replace(row, algo="none", protocol="none", source="trivial")

        # the scenario's algo/protocol are preferences (tuning): applied where they can serve the op
        c = collective_cost(self.rs.topology, work.op, group, work.nbytes,
                            concurrent_groups=self._concurrent(work.group, group), tuning=self.tuning,
                            **flex_arguments(work.kernel))
        latency_s, bandwidth_s, source = c.latency_s, c.time_s - c.latency_s, "model"
        measured_s = self._measured_s(work, len(group))
        if measured_s is not None:
            latency_s = min(c.latency_s, measured_s)
            bandwidth_s, source = measured_s - latency_s, "calibrated"
        total_s = latency_s + bandwidth_s
        algbw = work.nbytes / total_s / 1e9 if total_s > 0 else 0.0
        row = replace(row, algo=c.algo, protocol=c.protocol, time_us=total_s * 1e6, algbw_gbps=algbw,
                      busbw_gbps=c.busbw_gbps * (c.time_s / total_s) if total_s > 0 else 0.0, source=source)
        return (latency_s, max(0.0, bandwidth_s), dict(c.link_load)), row

    def _measured_s(self, work: Collective, ranks: int) -> float | None:
        if self.rs.profile is None or not self.rs.profile.collective_table:
            return None

        return table_collective_time_s(self.rs.profile, work.op, ranks, work.nbytes)

    def chosen(self, schedule: Schedule, rank: int = 0) -> list[CollectiveRow]:
        """One row per distinct collective of the representative rank, with its count per step."""
        return self.rows(collective_counts(schedule), rank)

    def rows(self, counts: Mapping[tuple, int], rank: int = 0) -> list[CollectiveRow]:
        """One row per (op, group, nbytes[, kernel]) with its count per step."""
        group_of = self.rs.group  # rank -> its real TP, DP or KV group
        rows = []
        for key, n in sorted(counts.items()):
            kind, gname, nbytes = key[:3]
            kernel = key[3] if len(key) > 3 else "nccl"
            _, row = self.cost(Collective(kind, gname, nbytes, kernel=kernel), group_of(gname, rank))
            rows.append(replace(row, count=n))
        return rows


def collective_key(work: Collective) -> tuple:
    """(op, group, nbytes), plus the kernel for the flex dispatcher's fused kernels."""
    base = (work.op, work.group, work.nbytes)
    return base if work.kernel == "nccl" else (*base, work.kernel)


def collective_counts(schedule: Schedule) -> Counter:
    """collective_key -> how many times the schedule issues it."""
    return count_collectives(schedule.ops)


def count_collectives(ops: Iterable[Op]) -> Counter:
    """collective_key -> how many of `ops` are that collective."""
    return Counter(collective_key(op.work) for op in ops if isinstance(op.work, Collective))


class P2PCoster:
    """p2p(src, dst, nbytes) -> (latency_s, bandwidth_s, link_load), memoized; concurrent copies: the same
    transfer between every other (tp, dp) position of the two stages."""

    def __init__(self, rs: ResolvedScenario):
        self.rs = rs
        self.tuning = network_tuning(rs)
        self.memo: dict[tuple[int, int, int], engine.CommTiming] = {}

    def __call__(self, src: int, dst: int, nbytes: int) -> engine.CommTiming:
        key = (src, dst, nbytes)
        hit = self.memo.get(key)
        if hit is None:
            size = self.rs.stage_size
            src0, dst0 = src - src % size, dst - dst % size
            copies = [(src0 + i, dst0 + i) for i in range(size)]
            c = p2p_cost(self.rs.topology, src, dst, nbytes, concurrent=copies, tuning=self.tuning)
            hit = self.memo[key] = (c.latency_s, c.bandwidth_s, dict(c.link_load))
        return hit


def compute_fn(rs: ResolvedScenario) -> engine.ComputeFn:
    """compute_s(op, rank) from the compute model (sim/cost/compute.py), memoized per work item (by value in
    the model, and by identity here: the same object, the same time)."""
    model = ComputeModel(rs.gpu, rs.scenario.hardware.compute, rs.profile,  # memoizes per work itself
                         fill_uninitialized=rs.scenario.run.deterministic)

    memo: dict[int, tuple[object, float]] = {}  # id(work) -> (the work, kept alive so its id stays its own; time)

    def compute_s(op: Op, rank: int) -> float:
        work = op.work  # ops stamped from one template share their work: look it up by identity, not by hash
        hit = memo.get(id(work))
        if hit is None or hit[0] is not work:
            hit = memo[id(work)] = (work, model.time_s(work))
        return hit[1]

    return compute_s


def comm_interference(rs: ResolvedScenario) -> float:
    """kappa (sim/engine/events.py): hardware.compute.comm_interference, else the profile's compute section's
    (what `meshsim calibrate` measured), else 0.0 (no interference)."""
    return resolve_tuning(rs.scenario.hardware.compute, rs.profile).comm_interference or 0.0


def host_issue_times(rs: ResolvedScenario, schedule: Schedule) -> tuple[float, ...]:
    """When the host issues each op (sim/cost/host_dispatch.py): hardware.compute.host_dispatch_us, else the
    profile's, else the default, per op; none under run.cuda_graphs."""
    if rs.scenario.run.cuda_graphs:
        return ()
    us = resolve_tuning(rs.scenario.hardware.compute, rs.profile).host_dispatch_us or 0.0
    return issue_times_s(schedule, us * 1e-6)


def rank_groups(rs: ResolvedScenario, schedules: Sequence[Schedule], ranks: tuple[int, ...]
                ) -> dict[tuple[str, int], tuple[int, ...]]:
    """(group kind, simulated rank) -> the global ranks of that group (for trace args), over every kind
    the stages' collectives use."""
    kinds = {op.work.group for s in schedules for op in s.ops if isinstance(op.work, Collective)}
    return {(kind, rank): tuple(rs.group(kind, rank)) for kind in kinds for rank in ranks}


def simulated_ranks(rs: ResolvedScenario, explicit_ranks: bool) -> tuple[int, ...]:
    """Per pipeline stage: its first rank alone, or one TP group times min(dp, 2) replicas."""
    per_stage = range(rs.tp * rs.cp * min(rs.dp, 2)) if explicit_ranks else range(1)
    return tuple(stage * rs.stage_size + r for stage in range(rs.pp) for r in per_stage)


def run_stages(rs: ResolvedScenario, schedules: tuple[Schedule, ...], ranks: tuple[int, ...],
               coster: CollectiveCoster, engine_name: EngineName | None = None) -> engine.EventLog:
    """The engine over `ranks`, each running its stage's schedule, on the scenario's engine (run.engine)
    unless `engine_name` says otherwise."""
    loop = engine_name or rs.scenario.run.engine
    if rs.pp == 1:
        return engine.run(schedules[0], ranks, compute_fn(rs), coster, rs.group, engine=loop,
                          comm_interference=comm_interference(rs), issue_s=host_issue_times(rs, schedules[0]))
    # each stage's host issues its own ops (it does not wait at blocking P2P here: a lower bound)
    return engine.run(schedules, ranks, compute_fn(rs), coster, rs.group, comm_interference=comm_interference(rs),
                      issue_s=[host_issue_times(rs, s) for s in schedules], stage_of=rs.stage_of, p2p=P2PCoster(rs),
                      engine=loop)


def simulate_with_events(rs: ResolvedScenario, *, explicit_ranks: bool = False, engine_name: EngineName | None = None,
                         state: steady_state.SteadyState | None = None
                         ) -> tuple[StepResult, engine.EventLog, Schedule]:
    """The whole step simulated: its result, its event log and stage 0's schedule (the others:
    build_stage_schedules(rs)); `state` is what the result's steady_state says about it (simulate: why
    the step was not extrapolated)."""
    check_simulated_work(rs.scenario.model.layers, rs.micro_batches, source=rs.source, pp=rs.pp)
    schedules = build_stage_schedules(rs)
    coster = CollectiveCoster(rs)
    log = run_stages(rs, schedules, simulated_ranks(rs, explicit_ranks), coster, engine_name)
    collectives = [row for s in schedules for row in coster.chosen(s, s.stage * rs.stage_size)]
    result = build_result(rs, schedules, log, memory=memory_per_gpu(rs), model_flops=model_flops_per_step(rs),
                          collectives=collectives, explicit_ranks=explicit_ranks,
                          hardware_flops=hardware_flops_per_step(rs),
                          rank_groups=rank_groups(rs, schedules, log.ranks), steady_state=state)
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
    check_simulated_work(rs.scenario.model.layers, micro_batches, source=rs.source, pp=rs.pp,
                         why=" by the steady state's run")
    short = replace(rs, micro_batches=micro_batches)
    schedules = build_stage_schedules(short)
    log = run_stages(short, schedules, simulated_ranks(rs, explicit_ranks), coster, engine_name)
    rep = log.of_rank(log.ranks[0])
    path = critical_path(schedules, log)
    split = breakdown(rep, log.step_time_s, pipeline=rs.pp > 1)
    counts = Counter({(s.stage, *key): c for s in schedules for key, c in collective_counts(s).items()})
    issue = tuple(host_issue_times(short, s) for s in schedules)
    return steady_state.Run(schedules, log, path, split, counts, issue, comm_interference(rs))


def later_plan(plan: steady_state.Plan) -> steady_state.Plan:
    """The plan with its cuts later in the step (lead 2 lead + 2 unit): for transients the first plan's
    period has not seen settle (overlapped parameter gathers, a host still catching up with its GPU)."""
    return replace(plan, lead=2 * plan.lead + 2 * plan.unit)


def simulate_steady(rs: ResolvedScenario, *, explicit_ranks: bool = False, force: bool = False,
                    engine_name: EngineName | None = None) -> tuple[StepResult | None, str]:
    """(The step extrapolated from one short run, "") (sim/results/steady_state.py), or (None, why not): the
    step is too short to gain from it (unless `force`, which only needs one more period than the run) or
    a premise of the proof fails, also with later_plan when the step is at least twice its run."""
    chosen = plan_and_run(rs, force)
    if chosen is None:
        return None, f"{rs.micro_batches} micro-batches are too few to gain from extrapolating"
    plan, n_b = chosen
    coster = CollectiveCoster(rs)
    run = _short_run(rs, n_b, explicit_ranks, coster, engine_name)
    ex = steady_state.extrapolate(run, plan, rs.micro_batches, rs.stage_of, rs.pp > 1, count_collectives)
    retry = later_plan(plan)
    n_retry = retry.run_length(rs.micro_batches, force=True)
    if isinstance(ex, str) and n_retry is not None and 2 * n_retry <= rs.micro_batches:
        run = _short_run(rs, n_retry, explicit_ranks, coster, engine_name)
        again = steady_state.extrapolate(run, retry, rs.micro_batches, rs.stage_of, rs.pp > 1, count_collectives)
        ex = again if not isinstance(again, str) else f"{ex}; with the cuts {retry.lead - plan.lead} " \
                                                      f"micro-batches later: {again}"
    if isinstance(ex, str):
        return None, ex
    collectives = [row for stage in range(rs.pp) for row in coster.rows(
        Counter({key[1:]: c for key, c in ex.collective_counts.items() if key[0] == stage}),
        stage * rs.stage_size)]
    ranks = run.log.ranks
    return assemble(rs, ex.step_s, [e for e in ex.events if e.rank == ranks[0]], ex.breakdown_s, ex.path,
                    memory=memory_per_gpu(rs), model_flops=model_flops_per_step(rs), collectives=collectives,
                    explicit_ranks=explicit_ranks, simulated_ranks=len(ranks),
                    ops_per_rank=ex.ops_per_rank, events=ex.events, steady_state=ex.state,
                    hardware_flops=hardware_flops_per_step(rs),
                    op_collectives=rows_by_event(run.schedules, collectives, ranks, rs.stage_size),
                    rank_groups=rank_groups(rs, run.schedules, ranks)), ""


def simulate(rs: ResolvedScenario, *, explicit_ranks: bool = False, full: bool = False,
             engine_name: EngineName | None = None) -> StepResult:
    """Simulate one training step: extrapolated from its steady state when that is proven exact and
    cheaper (sim/results/steady_state.py), else (or with full=True) every micro-batch; result.steady_state
    says which. Events are kept in `result.events` (the simulated ones only when extrapolated).
    engine_name: the event loop (default: the scenario's run.engine)."""
    reason = "requested (--full)"
    if not full:
        result, reason = simulate_steady(rs, explicit_ranks=explicit_ranks, engine_name=engine_name)
        if result is not None:
            return result
    check_simulated_work(rs.scenario.model.layers, rs.micro_batches, source=rs.source,
                         why=f" by the whole step (not extrapolated: {reason})")
    return simulate_with_events(rs, explicit_ranks=explicit_ranks, engine_name=engine_name,
                                state=steady_state.SteadyState("full", reason))[0]


@contextmanager
def gc_frozen(keep: bool = False) -> Iterator[None]:
    """Run the block with the cyclic garbage collector off: a step allocates ~10^5 long-lived objects
    (ops, events, segments) and no cycles, so each collection would rescan them all for nothing. Objects
    from before are frozen (never rescanned); collection resumes after the block. `keep`: the objects
    made in the block are frozen too (a command that ends after it: the first collection after the
    block would otherwise rescan every one of them, ~0.3 s for a DeepSeek-V3 step, for nothing)."""
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if keep:
            gc.freeze()
        if was_enabled:
            gc.enable()
        if not keep:
            gc.unfreeze()
