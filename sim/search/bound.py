"""A lower bound on a layout's simulated step, computed without the engine: `lower_bound(rs).step_s`.

Claim: lower_bound(rs).step_s <= simulate(rs).step_time_s for every resolved scenario rs.

The argument (exact arithmetic first; the float margin is step 6):

1. simulate(rs) is the engine's time T of the whole step: its steady-state extrapolation is proven
   equal to the full run (sim/results/steady_state.py), and it falls back to the full run otherwise.
   T is the end of the last event of any simulated rank.
2. The engine (sim/engine/processes.py `stream`) runs every FIFO stream (compute, tp_comm, dp_comm,
   ep_comm, cp_comm; sim/schedule/ops.FIFO_STREAMS) of a simulated rank one op at a time, in list order:
   an op starts no earlier than the previous op of its stream ended, and the first no earlier than 0.
   So for every stage s (its first rank, which the engine simulates) and every FIFO stream x,
   T >= busy(s, x) = the sum over the stream's ops of their durations.
3. A duration is at least its priced cost. A compute op lasts compute_s(op, rank) (a timeout when kappa =
   0; with kappa > 0 that many standalone seconds drained through the arbiter at a rate r <= 1,
   sim/engine/arbiter.py). A collective lasts its rendezvous wait (>= 0) plus latency_s (a timeout) plus
   bandwidth_s drained at r <= 1: at least latency_s + bandwidth_s. Both prices come from the same pure
   functions the engine is handed (sim/results/costers.py compute_fn, CollectiveCoster, on the same
   groups rs.group(kind, rank)), so busy(s, x) >= the sum of the priced costs.
4. The host: a FIFO op starts no earlier than its host issued it, and the issue time is at least the
   static clock, the cumulative dispatch time of every op before it in list order (sim/cost/host_dispatch.py;
   a sync only delays the host, sim/engine/host.py). So T >= host(s) = the static clock of stage s's last
   FIFO op (0 under cuda_graphs or without a host model), and >= the same sum over FIFO ops only, which
   the bound takes: how a step pairs its P2P batches (warm-up, steady, cool-down) varies with m, so their
   dispatch per micro-batch is not the same in a short schedule (the generated test found it).
5. The full step from a short schedule. With m micro-batches, busy(s, x) = O + sum_{k<m} W(k), where W(k)
   sums the ops stamped for micro-batch k (op.micro_batch == k) and O the ops of no micro-batch (the
   optimizer, the gradient reduction, the step's closing ops); host(s) splits the same way when every
   micro-batch op comes before the last FIFO op. Premise P, the builder's: every micro-batch's ops are
   stamped from the same block templates (sim/schedule/stamping.py, pipeline_builder.py), they differ
   only by whether the micro-batch is the first, an interior or the last one, and the ops of no
   micro-batch do not depend on m. The bound builds a schedule of m' = min(m, max(3, pp, ...)) micro-batches,
   which holds all three kinds (a count the schedule accepts: short_micro_batches), and takes O' + m min_{k<m'} W'(k) <= O + sum_k W(k). When m' = m the sum
   is the full step's and P is not used. P is what tests/test_search_bound.py's generated differential
   test (dense, MoE, CP, FP8, host-bound, pipelined) checks, with the bound against the engine.
6. Floats: the engine adds times in floats and its arbiter counts under 1e-15 s as done
   (arbiter._EPS_S). The bound is scaled by (1 - 1e-9) and lowered by 2e-15 s per op it sums, far above
   the rounding of sums of at most 10^7 terms.

7. Fill and drain (sim/search/pipeline_bound.py states and proves it): before a stream's first ops can
   start, the ops they wait for on other stages must run (the pipeline's fill), and after its last ops
   the ops that wait for them must (the drain); est and tail, computed on the short schedules with the
   same durations, bound both, and T >= fill + busy(s, x) + drain for every stage and stream.
8. Premise P' of step 7: the ops up to the first op of micro-batch 1, and those after the last op of
   micro-batch m' - 2, are the same in the full step (renumbered to its last micro-batch); not needed
   when m' = m.

9. Forced gaps (sim/search/block_cost.py): inside a block, consecutive ops of a stream x that a dependency
   path through other streams' ops links idle x for that path's priced length; over the full step the
   stamped blocks give m G(s, x) of them, G the per-micro-batch sum (cheap_bound.py steps 2-3; 0 under
   moe_ep_overlap). The chain of step 7 from x to z then also holds the gaps of the pairs inside [x, z]:
   all but those left of x (inside micro-batch 0's blocks: at most G) and right of z (inside the last
   micro-batch's: at most G). So T >= busy + m G + max(0, fill - G) + max(0, drain - G) as well.

10. Combined 1F1B windows (moe_ep_overlap; sim/search/overlap_windows.py states and proves it): on compute
   and ep_comm, T >= busy(s, x) + E_x, E_x the sum over the stage's chunk_step windows of their longest
   path's excess over their busy time on x; busy(s, x) from step 5; and with step 7's fill and drain,
   T >= fill + busy(s, x) + drain + E_x - E_edge, E_edge the excess of the windows at the step's two ends.

So lower_bound = max over stages and FIFO streams of the largest of fill + busy + drain, step 9's and
step 10's figures, and over stages of host, is <= T. It is the search's refined level; cheap_bound.py is the cheap one.

What it leaves out, and is loose by: the bubbles inside the steady phase of a pipeline, communication
exposed by dependencies across blocks (inside a block steps 9 and 10 hold it: the gaps, and under EP
overlap the combined step's longest path), contention and kappa's slow-down, host syncs. A bound that is provably valid and loose only prunes less.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.results.costers import host_issue_times
from meshsim.sim.schedule.ops import FIFO_STREAMS, Op, Schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.search.bound_types import (
    PER_OP_MARGIN_S,
    RELATIVE_MARGIN,
    Bound,
    PriceCache,
    Pricer,
    StageBound,
)
from meshsim.sim.search.cheap_bound import BlockCosts
from meshsim.sim.search.pipeline_bound import Pipeline

KINDS_OF_MICRO_BATCH = 3  # step 5: first, interior, last


def short_micro_batches(rs: ResolvedScenario) -> int:
    """m' = min(m, the least count >= max(3, pp) that the schedule accepts): the first, an interior and the
    last micro-batch (step 5). Interleaved (vp > 1), Megatron accepts m' micro-batches when N <= m' and
    m' mod N is 0 or >= pp, N the group size (default pp; scenarios/pipeline_checks.py
    check_interleaved_micro_batches): at pp 2, 3 is refused and 4 taken; with a group size N above 3, N.
    Otherwise the short schedule would miss dependencies (and step 7 be left out) or fail to build."""
    short = max(KINDS_OF_MICRO_BATCH, rs.pp)
    if rs.vp > 1:
        n = rs.scenario.parallel.microbatch_group_size or rs.pp
        short = max(short, n)
        while short % n and short % n < rs.pp:
            short += 1
    return min(rs.micro_batches, short)


def _full_step_sum(per_mb: dict[int, float], other: float, m: int, m_short: int) -> float:
    """O + sum_k W(k) when the schedule is the full one, else O' + m min_k W'(k) (step 5)."""
    if not per_mb:
        return other
    if m_short == m:
        return other + sum(per_mb.values())
    return other + m * min(per_mb.get(k, 0.0) for k in range(m_short))


def _stream_busy(ops: list[Op], rank: int, price: Pricer, m: int, m_short: int) -> tuple[dict, int]:
    """stream -> its full-step busy time (steps 2, 3, 5) over a stage's `ops`; and how many ops the sums
    stand for."""
    per_mb: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    other: dict[str, float] = defaultdict(float)
    n = 0
    for op in ops:
        if op.stream not in FIFO_STREAMS:
            continue
        d = price(op, rank)
        if op.micro_batch is None:
            other[op.stream] += d
            n += 1
        else:
            per_mb[op.stream][op.micro_batch] += d
            n += m / m_short
    busy = {x: _full_step_sum(per_mb.get(x, {}), other.get(x, 0.0), m, m_short)
            for x in FIFO_STREAMS if x in other or x in per_mb}
    return busy, int(n) + 1


def _host_clock(rs: ResolvedScenario, schedule: Schedule, ops: list[Op], m: int, m_short: int) -> float:
    """The static host clock of the last FIFO op, full step (steps 4, 5); 0 without a host model or when
    an op of a micro-batch comes after the last FIFO op (the split of step 5 does not hold)."""
    issue = host_issue_times(rs, schedule)
    if not issue:
        return 0.0
    last = max((i for i, op in enumerate(ops) if op.stream in FIFO_STREAMS), default=-1)
    if last < 0 or any(op.micro_batch is not None for op in ops[last + 1:]):
        return 0.0
    per_mb: dict[int, float] = defaultdict(float)
    other = 0.0
    for i, op in enumerate(ops[: last + 1]):
        if op.stream not in FIFO_STREAMS:  # P2P batches: how a step pairs them varies with m; left out (>= 0)
            continue
        dispatch_s = issue[i] - (issue[i - 1] if i else 0.0)
        if op.micro_batch is None:
            other += dispatch_s
        else:
            per_mb[op.micro_batch] += dispatch_s
    return _full_step_sum(per_mb, other, m, m_short)


def _with_fill_drain(busy_s: float, gap_s: float, m: int, fill_drain: tuple[float, float]) -> float:
    """The larger of steps 7 and 9 for one stage and stream."""
    fill, drain = fill_drain
    return max(busy_s + fill + drain, busy_s + m * gap_s + max(0.0, fill - gap_s) + max(0.0, drain - gap_s))


def _stream_term(busy_s: float, gap_s: float, m: int, fill_drain: tuple[float, float],
                 excess: tuple[float, float]) -> float:
    """The largest of steps 7, 9 and 10 for one stage and stream."""
    total, edge = excess
    fill, drain = fill_drain
    return max(_with_fill_drain(busy_s, gap_s, m, fill_drain), busy_s + total, busy_s + total - edge + fill + drain)


def lower_bound(rs: ResolvedScenario, costs: BlockCosts | None = None, cache: PriceCache | None = None) -> Bound:
    """The bound of the module docstring for the layout `rs` describes (`costs`: the cheap level's, reused;
    `cache`: the search's shared cost functions)."""
    m, m_short = rs.micro_batches, short_micro_batches(rs)
    short = rs if m_short == m else replace(rs, micro_batches=m_short)
    price = cache.pricer(rs) if cache is not None else Pricer(rs)
    costs = costs or BlockCosts(rs, price, cache)
    stages, worst_s, ops = [], 0.0, 0
    schedules = build_stage_schedules(short)
    pipe = Pipeline(schedules, lambda op, stage: price(op, stage * rs.stage_size))
    for schedule in schedules:
        rank = schedule.stage * rs.stage_size
        records = list(schedule.ops)  # read once: each pass over a stamped stage makes its records again
        busy, n_ops = _stream_busy(records, rank, price, m, m_short)
        gap = costs.gap[schedule.stage]
        excess = costs.excess[schedule.stage]
        busy = {x: _stream_term(t, gap.get(x, 0.0), m, pipe.fill_drain(schedule.stage, x) if pipe.ok else (0.0, 0.0),
                                excess.get(x, (0.0, 0.0)))
                for x, t in busy.items()}
        host_s = max(_host_clock(short, schedule, records, m, m_short), m * costs.host[schedule.stage])
        stage = StageBound(schedule.stage, tuple(busy.items()), host_s)
        stages.append(stage)
        if stage.worst[1] > worst_s:
            worst_s, ops = stage.worst[1], n_ops + int(m * costs.ops[schedule.stage])
    step_s = max(0.0, worst_s * (1.0 - RELATIVE_MARGIN) - PER_OP_MARGIN_S * ops)
    return Bound(step_s, tuple(stages), m_short, m)
