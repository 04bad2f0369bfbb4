"""The search's cheap lower bound, closed form from the block templates: `cheap_bound(rs).step_s`.

Claim: cheap_bound(rs).step_s <= simulate(rs).step_time_s for every resolved scenario rs.

No schedule is built: each stage's blocks (sim/schedule/pipeline_layout.py: its chunks' embedding, layers,
delayed-FP8 amax block and head, forward and backward) are priced once per template
(sim/search/block_cost.py) and multiplied by the micro-batch count m. The argument:

1. As bound.py steps 1-3: T, the simulated step, is the end of the last event of any simulated rank; each
   FIFO stream x of stage s's first rank runs its ops one at a time in list order; each op lasts at least
   its priced cost (the same pure cost functions and groups the engine is handed).
2. Every micro-batch stamps every block of the stage exactly once with the templates priced here: the plain
   builder (sim/schedule/builder.py `_micro_batch`, stamping.py `micro_batch_blocks`), FSDP's
   (sim/schedule/fsdp_ops.py `fsdp_micro_batches`, the same blocks plus gathers, casts and reduce-scatters),
   the pipeline's (sim/schedule/pipeline_builder.py `_Stage.forward/backward`, F and B of every chunk for
   every micro-batch) and the combined 1F1B of moe_ep_overlap (sim/schedule/ep_overlap.py `chunk_step`,
   the same blocks, a layer's dispatch and combine nodes moved to ep_comm: block_cost.op_streams). Ops
   the bound leaves out (the step's end, P2P, FSDP's and the pipeline's extra collectives) only add time.
3. Stream chain: over stream x's ops in list order, T >= sum dur + sum of the forced gaps between
   consecutive ops (block_cost.py), and the blocks of one micro-batch's stamps give m times each block's
   busy_s[x] + gap_s[x] (gaps 0 under moe_ep_overlap). So T >= m * sum_blocks (busy + gap).
4. Host: the optimizer step (op "opt.step", in every builder after every micro-batch op) starts no earlier
   than its static issue time, the cumulative dispatch of every op listed before it (sim/cost/host_dispatch.py;
   0 under cuda_graphs; a sync only delays the host), which includes m times every block's dispatch.
5. Floats: as bound.py step 6 (relative 1e-9 and 2e-15 s per op summed).
6. Combined 1F1B (moe_ep_overlap, where step 3's gaps are 0): each chunk_step window's longest path on
   compute and on ep_comm exceeds its busy time by what its own dependencies force; the excesses E_x add
   to step 3's sum (sim/search/overlap_windows.py states and proves it): T >= m * sum_blocks busy + E_x.

7. Shared block costs (the search's PriceCache): a BlockCost is a pure function of the block's ops (their
   work, streams, host calls and deps: tuple(template.ops), compared by value), the streams op_streams
   gives them, the host's dispatch time, the rank, and the pricer; a PriceCache's pricer prices an op from
   its work and the rank only, with the coster and compute model it keeps per Pricer.key (the hardware and
   topology, the mesh, run.deterministic and run.fp8: bound_types.py). So a cost kept under (Pricer.key,
   rank, dispatch, streams, ops) is the one the layout would compute: equal to the bit. A pass's gaps
   (block_cost.py pass_gaps) read its blocks' ops, streams, durations and "out" marks only: kept under
   the shared costs' identities (alive in the cache) and the marks. tests/test_search.py compares cheap
   and refined bounds with the shared cache against fresh pricing over generated spaces.

What it leaves out (bound.py's refinement adds the first two): the pipeline's fill and drain, the step's
end (gradient reduction, optimizer), gaps across blocks, contention and kappa, host syncs.
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.cost.compute import resolve_tuning
from meshsim.sim.schedule.builder import fp8_amax_templates
from meshsim.sim.schedule.pipeline_layout import ChunkLayout, pipeline_layout
from meshsim.sim.schedule.template import Template
from meshsim.sim.search.block_cost import BlockCost, block_cost, op_streams, pass_gaps
from meshsim.sim.search.bound_types import (
    PER_OP_MARGIN_S,
    RELATIVE_MARGIN,
    Bound,
    PriceCache,
    Pricer,
    StageBound,
)
from meshsim.sim.search.overlap_windows import bound_templates, window_excess

Block = tuple[Template, bool, bool]  # (template, is a decoder layer, backward)


def _chunk_passes(t, ch: ChunkLayout, amax) -> tuple[list[Block], list[Block]]:
    """A chunk's forward blocks and its backward blocks, each in stamping order (pipeline_builder.py
    _Stage.forward / backward; stamping.py micro_batch_blocks for the whole model)."""
    fwd: list[Block] = [(t.embed_fwd, False, False)] if ch.embedding else []
    fwd += [(t.layer_fwd(layer), True, False) for layer in ch.layers]
    fwd += [(amax[0], False, False)] if amax is not None else []
    fwd += [(t.head_fwd, False, False)] if ch.head else []
    bwd: list[Block] = [(t.head_bwd, False, True)] if ch.head else []
    bwd += [(t.layer_bwd(layer), True, True) for layer in reversed(ch.layers)]
    bwd += [(amax[1], False, True)] if amax is not None else []
    bwd += [(t.embed_bwd, False, True)] if ch.embedding else []
    return fwd, bwd


def stage_passes(rs: ResolvedScenario, t=None) -> list[list[list[Block]]]:
    """Per stage, the passes one micro-batch stamps on it (step 2): runs of blocks stamped one after another,
    each block fed by the one before. Without pipelining one micro-batch's blocks are one run
    (builder._micro_batch); under FSDP (gathers, casts and reduce-scatters between blocks) each block is its
    own; with pp > 1 each chunk's forward and its backward (pipeline_builder.py _Stage.compute). `t`: the
    layout's templates (overlap_windows.bound_templates) when the caller has them."""
    m = rs.scenario.model
    t = t or bound_templates(rs)
    if rs.pp == 1:
        fwd, bwd = _chunk_passes(t, ChunkLayout(0, 0, range(m.layers), True, True), t.amax)
        run = fwd + bwd
        return [[[b] for b in run] if rs.scenario.parallel.fsdp else [run]]
    layout = pipeline_layout(rs.scenario.parallel, m.layers)
    return [[run for ch in chunks for run in _chunk_passes(t, ch, fp8_amax_templates(rs, ch.layers) if ch.layers
                                                           else None) if run] for chunks in layout]


def host_dispatch_s(rs: ResolvedScenario) -> float:
    """Seconds per default op dispatch (sim/results/costers.py host_issue_times): 0 under cuda_graphs."""
    if rs.scenario.run.cuda_graphs:
        return 0.0
    return (resolve_tuning(rs.scenario.hardware.compute, rs.profile).host_dispatch_us or 0.0) * 1e-6


class BlockCosts:
    """Per-stage, per-micro-batch sums of the block costs and the passes' gaps (steps 2-4), shared with
    bound.py's refinement. `shared` (a PriceCache) keeps the block costs and the passes' gaps across the
    layouts of a search, by value (step 7)."""

    def __init__(self, rs: ResolvedScenario, price: Pricer | None = None, shared: PriceCache | None = None):
        p = rs.scenario.parallel
        price = price or Pricer(rs)
        dispatch = host_dispatch_s(rs)
        memo: dict[tuple[int, bool, bool, int], BlockCost] = {}
        blocks = shared.blocks if shared is not None and price.key is not None else {}
        passes = shared.passes if shared is not None and price.key is not None else {}
        self.busy, self.gap, self.host, self.ops = [], [], [], []
        t = bound_templates(rs)
        for stage, passes_of_stage in enumerate(stage_passes(rs, t)):
            rank = stage * rs.stage_size
            busy: dict[str, float] = {}
            gap: dict[str, float] = {}
            host = ops = 0.0
            for run in passes_of_stage:
                costs = []
                for tpl, layer, backward in run:
                    key = (id(tpl), layer, backward, rank)
                    c = memo.get(key)
                    if c is None:
                        streams = op_streams(tpl, p.moe_ep_overlap and layer, backward, p.delay_wgrad_compute)
                        value = (price.key, rank, dispatch, streams, tuple(tpl.ops))  # step 7
                        c = blocks.get(value)
                        if c is None:
                            c = blocks[value] = block_cost(tpl, streams, lambda op, r=rank: price(op, r), dispatch)
                        memo[key] = c
                    costs.append(c)
                    for x, s in c.busy_s:
                        busy[x] = busy.get(x, 0.0) + s
                    host += c.dispatch_s
                    ops += c.ops
                if not p.moe_ep_overlap:  # the nodes of two micro-batches interleave: no gaps (block_cost.py)
                    # the blocks' ops (deps), streams and durations (c, kept alive by `blocks`) and outputs
                    key = tuple((id(c), b[0].marks.get("out")) for c, b in zip(costs, run, strict=True))
                    gaps = passes.get(key)
                    if gaps is None:
                        gaps = passes[key] = pass_gaps([b[0] for b in run], [x for c in costs for x in c.streams],
                                                       [d for c in costs for d in c.dur_s])
                    for x, s in gaps.items():
                        gap[x] = gap.get(x, 0.0) + s
            self.busy.append(busy)
            self.gap.append(gap)
            self.host.append(host)
            self.ops.append(ops)
        self.excess = window_excess(rs, price, shared, t)  # step 6: stream -> (E_x, its edge windows' part)


def cheap_bound(rs: ResolvedScenario, costs: BlockCosts | None = None, cache: PriceCache | None = None) -> Bound:
    """The bound of the module docstring (`cache`: the search's shared cost functions)."""
    costs = costs or BlockCosts(rs, cache.pricer(rs) if cache is not None else None, cache)
    m = rs.micro_batches
    stages, worst_s, ops = [], 0.0, 0
    for stage, (busy, gap, host) in enumerate(zip(costs.busy, costs.gap, costs.host, strict=True)):
        excess = costs.excess[stage]
        chain = tuple((x, m * (t + gap.get(x, 0.0)) + excess.get(x, (0.0, 0.0))[0]) for x, t in busy.items())
        sb = StageBound(stage, chain, m * host)
        stages.append(sb)
        if sb.worst[1] > worst_s:
            worst_s, ops = sb.worst[1], int(m * costs.ops[stage]) + 1
    step_s = max(0.0, worst_s * (1.0 - RELATIVE_MARGIN) - PER_OP_MARGIN_S * ops)
    return Bound(step_s, tuple(stages), 0, m, level="cheap")
