"""Combined-1F1B windows (parallel.moe_ep_overlap), for the bounds: the time a combined step's own
dependencies force on a stream beyond its busy time. cheap_bound.py step 6 and bound.py step 10 add it.

Under moe_ep_overlap the builders stamp every compute step as one Megatron schedule plan run
(sim/schedule/ep_overlap.py chunk_step): without pipelining F0, (F1 + B0), ..., (F(m-1) + B(m-2)), B(m-1)
(combined_micro_batches); with pp > 1 each item of stage_order is a warm-up forward or a cool-down
backward run alone, or a steady Combined(f, b) (sim/schedule/pipeline_builder.py build_stage,
pipeline_combined.py combined_compute). block_cost.py's forced gaps are 0 there (two micro-batches' nodes
interleave), which leaves the bound at the busier stream's busy time, while the step runs, e.g., a forward's
expert GEMMs only after its dispatch all-to-all, which waits for the same forward's pre-dispatch node.

The argument, for one stage (its first rank) and a FIFO stream x in {compute, ep_comm}:

1. A window is the ops one chunk_step call appends. They are appended contiguously (op id = list
   position), except the P2P batches a steady step posts inside it (pp_comm, not FIFO) and the TP
   all-gathers of P2P scatter-gather (tp_comm), which is why x is only compute or ep_comm: the window's
   x-ops are consecutive on x in the stage's list, and windows follow each other in stage_order.
2. Scratch: chunk_step run on a fresh Emitter with fresh chains, whose output is fed by one placeholder op
   (the real run's received batch or earlier block), stamps the same templates in the same order, so the
   same ops (same work, hence the same priced durations on the rank), each with a subset of its real
   dependencies: the chains' events from earlier steps, the P2P gates and the received inputs are what
   the scratch lacks. Stream order inside the window is the real one (step 1).
3. Longest path: on the scratch window, let L_x be the longest path from the start of the window's first
   x-op to the end of its last x-op, over edges u -> v that hold in the engine: v depends on u, or v is
   a later op on u's FIFO stream inside the window (the stream runs in list order: an op between them
   starts after u ends and ends before v starts); a path's length is the sum of its ops' priced
   durations (0 off the FIFO streams). Every engine start is >= the end of each dep and of the previous op
   of its FIFO stream (bound.py steps 2-3), and each duration is >= its priced cost, so in the full step
   end(last x-op) >= start(first x-op) + L_x. L_x >= busy_x(window) (the path through the x-ops in order).
4. Chain: the stream x runs its ops in list order, so T >= sum of the durations of x-ops outside windows
   + sum over windows of L_x = (the stream's total busy) + E_x, E_x = sum over the stage's windows of
   L_x - busy_x(window) >= 0. Any lower bound on the stream's total busy (bound.py step 5, cheap_bound.py
   step 3: every block of every micro-batch is in some window) plus E_x is <= T.
5. With fill and drain (bound.py step 7): for x-ops x0 <= z0 of the step-7 chain, the windows whose x-ops
   all lie in [x0, z0] give their L_x in place of their busy time, so T >= fill + busy + drain + E_x -
   E_edge, E_edge the excess of the windows that may not: those with an op before the stage's first op of
   a micro-batch other than 0 (x0 comes before it) or after its last op of one other than the last.
   In stage_order they are the steps up to the first one with another micro-batch than 0, and from the
   last one with another than the last (bound.py step 8's premise P' makes the short schedule's fill
   and drain the full step's; the edge windows are counted on the full step's order).
Windows repeat: a window is determined by its (forward chunk or None, backward chunk or None), so L_x is
computed once per kind and multiplied by its count in the full step's stage_order (no short schedule:
no premise P). A path from the first x-op needs nothing before it, so ops it cannot reach (e.g. a pair's
backward combine, issued before the forward's pre-dispatch node) do not count.
6. Computed once (window_excess; window_excess_long_way is the long way, kept as the reference). The scratch
   ops' streams, deps and works are a function of delay_wgrad and the templates chunk_step stamps, by
   value, in order (window_key: f's embedding, layers and head, b's head, layers from the last, embedding):
   chunk_step and the Emitter read nothing else that reaches an op's stream, deps or work (names, layer
   and micro-batch numbers do not), the chains start fresh and the placeholder is op 0. Which ops
   longest_paths reaches from the first x-op, and through which predecessors, depends on the deps and
   streams only (an op is reached iff a predecessor is; durations are >= 0), so it is walked once per
   window_key (WindowPaths), and the lengths are the same maxima and sums of the same durations in the
   same order: equal to the bit. A duration is price(op, rank), a function of the op's work and the rank
   for a PriceCache's Pricer, whose prices are equal for equal Pricer.key (cheap_bound.py step 7): the
   lengths are kept under (Pricer.key, rank, window_key). tests/test_search_windows.py compares
   window_excess, with one PriceCache over generated layouts, with the long way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.schedule.builder import step_templates
from meshsim.sim.schedule.ep_overlap import Chain, Emitter, Side, chunk_step
from meshsim.sim.schedule.ops import FIFO_STREAMS, Op
from meshsim.sim.schedule.pipeline import Combined, Compute, PipelineShape, stage_order
from meshsim.sim.schedule.pipeline_builder import pipeline_shape
from meshsim.sim.schedule.pipeline_layout import ChunkLayout, pipeline_layout
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.sim.search.window_paths import (
    WINDOW_STREAMS,
    Canonical,
    WindowKey,
    path_lengths,
    window_key,
    window_paths,
)


def window_counts(rs: ResolvedScenario, stage: int) -> tuple[Counter, Counter]:
    """(forward chunk, backward chunk) -> how many chunk_step calls of that kind stage `stage` makes; and the
    same for the edge windows of step 5 (a window in both edges is counted twice)."""
    if rs.pp == 1:  # combined_micro_batches: F0, (F + B) m - 1 times, B(m-1)
        m = rs.micro_batches
        return (Counter({(0, None): 1, (None, 0): 1, (0, 0): m - 1}),
                Counter({(0, None): 1, (None, 0): 1, (0, 0): min(2, m - 1)}))
    return _pipeline_counts(pipeline_shape(rs), stage)


def _micro_batches(step) -> set[int]:
    return {step.f.micro_batch, step.b.micro_batch} if isinstance(step, Combined) else {step.micro_batch}


@lru_cache(maxsize=4096)
def _pipeline_counts(shape: PipelineShape, stage: int) -> tuple[Counter, Counter]:
    """window_counts of a pipelined stage: a pure function of the pipeline's shape (layouts share it)."""
    steps = [step for step in stage_order(shape, stage) if isinstance(step, Combined | Compute)]
    keys = [(s.f.chunk, s.b.chunk) if isinstance(s, Combined) else (s.chunk, None) if s.kind == "F"
            else (None, s.chunk) for s in steps]
    first = next((i for i, s in enumerate(steps) if _micro_batches(s) - {0}), len(steps) - 1)
    last = next((i for i in reversed(range(len(steps))) if _micro_batches(steps[i]) - {shape.m - 1}), 0)
    return Counter(keys), Counter(keys[: first + 1]) + Counter(keys[last:])


def _scratch(t, chunks: list[ChunkLayout], key: WindowKey, delay_wgrad: bool) -> list[Op]:
    """The ops of one chunk_step of kind `key` on fresh chains fed by a placeholder op (step 2)."""
    ops: list[Op] = [Op(0, "window.input", "pp_comm", "pp_comm", "fwd", None, ())]
    em = Emitter(ops, delay_wgrad)

    def side(chunk: int | None, mb: int) -> Side | None:
        if chunk is None:
            return None
        ch = chunks[chunk]
        return Side(Chain(mb, out=0), ch.layers, ch.embedding, ch.head)

    chunk_step(em, t, side(key[0], 1), side(key[1], 0))
    return ops


def longest_paths(ops: list[Op], dur: Callable[[Op], float]) -> dict[str, tuple[float, float]]:
    """stream x -> (L_x, busy_x) on a window's ops (step 3), for the window streams with ops."""
    out = {}
    for x in WINDOW_STREAMS:
        mine = [op.id for op in ops if op.stream == x]
        if not mine:
            continue
        first, last = mine[0], mine[-1]
        reach: dict[int, float] = {first: 0.0}  # op -> longest path from first's start to the op's start
        prev: dict[str, int] = {x: first}
        for op in ops[first + 1: last + 1]:
            preds = list(op.deps)
            if op.stream in FIFO_STREAMS:
                p = prev.get(op.stream)
                if p is not None:
                    preds.append(p)
            best = -1.0
            for p in preds:
                r = reach.get(p)
                if r is not None:
                    best = max(best, r + dur(ops[p]))
            if best >= 0.0:  # an op the path cannot reach keeps its stream's last reached op as the next
                reach[op.id] = best  # one's predecessor: it starts after that op ends (FIFO), and ends later
                if op.stream in FIFO_STREAMS:
                    prev[op.stream] = op.id
        busy = sum(dur(ops[i]) for i in mine)
        out[x] = (reach[last] + dur(ops[last]), busy)
    return out


def bound_templates(rs: ResolvedScenario):
    """The layout's step_templates as the builders make them: tied embeddings only without pipelining."""
    d, model = layer_dims(rs), rs.scenario.model
    return step_templates(rs, d, model.tied_embeddings if rs.pp == 1 else False)


def _stage_layout(rs: ResolvedScenario) -> list[list[ChunkLayout]]:
    """layout[stage][chunk] of the combined steps (without pipelining one chunk holds the whole model)."""
    model = rs.scenario.model
    if rs.pp == 1:
        return [[ChunkLayout(0, 0, range(model.layers), True, True)]]
    return pipeline_layout(rs.scenario.parallel, model.layers)


def window_excess(rs: ResolvedScenario, price: Callable[[Op, int], float], shared=None, t=None
                  ) -> list[dict[str, tuple[float, float]]]:
    """Per stage, stream -> (E_x of step 4, the part of it in the edge windows of step 5); empty without
    moe_ep_overlap. Each window kind's paths are walked once per value (step 6), and its lengths priced once
    per (Pricer.key, rank) when `price` is a PriceCache's; `shared` (a PriceCache) keeps both for a search;
    `t` the layout's step_templates when the caller has them."""
    p = rs.scenario.parallel
    if not p.moe_ep_overlap:
        return [{} for _ in range(rs.pp)]
    t, layout = t or bound_templates(rs), _stage_layout(rs)
    key_of_price = getattr(price, "key", None)
    paths_memo = shared.windows if shared is not None else {}
    lengths_memo = shared.window_lengths if shared is not None and key_of_price is not None else {}
    canon = Canonical(shared.templates if shared is not None else {})
    out = []
    for stage, chunks in enumerate(layout):
        rank = stage * rs.stage_size
        excess: dict[str, tuple[float, float]] = {}
        counts, edges = window_counts(rs, stage)
        for key, n in counts.items():
            value = window_key(t, chunks, key, p.delay_wgrad_compute, canon)
            lengths = lengths_memo.get((key_of_price, rank, value))
            if lengths is None:
                paths = paths_memo.get(value)
                if paths is None:
                    paths = paths_memo[value] = window_paths(_scratch(t, chunks, key, p.delay_wgrad_compute))
                lengths = path_lengths(paths, lambda op, r=rank: price(op, r))
                if key_of_price is not None:
                    lengths_memo[(key_of_price, rank, value)] = lengths
            for x, (length, busy) in lengths.items():
                e = max(0.0, length - busy)
                total, edge = excess.get(x, (0.0, 0.0))
                excess[x] = (total + n * e, edge + edges.get(key, 0) * e)
        out.append(excess)
    return out


def window_excess_long_way(rs: ResolvedScenario, price: Callable[[Op, int], float]
                           ) -> list[dict[str, tuple[float, float]]]:
    """window_excess with a scratch window and longest_paths per window and stage, nothing kept (the reference
    tests/test_search_windows.py compares it with)."""
    p = rs.scenario.parallel
    if not p.moe_ep_overlap:
        return [{} for _ in range(rs.pp)]
    t, layout = bound_templates(rs), _stage_layout(rs)
    out = []
    for stage, chunks in enumerate(layout):
        rank = stage * rs.stage_size

        def dur(op: Op, r=rank) -> float:
            return price(op, r) if op.stream in FIFO_STREAMS else 0.0

        excess: dict[str, tuple[float, float]] = {}
        counts, edges = window_counts(rs, stage)
        for key, n in counts.items():
            for x, (length, busy) in longest_paths(_scratch(t, chunks, key, p.delay_wgrad_compute), dur).items():
                e = max(0.0, length - busy)
                total, edge = excess.get(x, (0.0, 0.0))
                excess[x] = (total + n * e, edge + edges.get(key, 0) * e)
        out.append(excess)
    return out
