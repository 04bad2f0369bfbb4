"""Screening and cheap bounding of every layout, in `jobs` forked worker processes.

Each layout is screened (sim/search/screen.py) and, when legal and fitting, given its cheap bound
(sim/search/cheap_bound.py) and its accuracy group's error band, exactly as one process would: the same
functions of the same inputs, so the outcome does not depend on `jobs` (tests/test_search.py compares
them). Workers are forked (they inherit the scenario, the variants and the file snapshot) and take the
layouts in tasks, a memory class (sim/search/memory_memo.py memory_key) in one task, so its memory is priced
once; they send back refusals, out-of-memory marks and (bound, band) pairs, not resolved scenarios: the
parent resolves again only the layouts it refines (bound.py) and those are few.

A task holds the layouts of one pipeline group (tp, cp, pp, vp, micro-batch: `shape_group`), split only
when a group is larger than a share of the space (`tasks`): what each worker process keeps for itself
(the combined-1F1B window counts per pipeline shape, whose stage order is O(micro-batches) to build, the
costers of a mesh, the block costs) is then made by one process, not by every one. Which process screens
a layout changes no outcome, only what it costs.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from meshsim.sim.core.userio import FileSnapshot
from meshsim.sim.results.error_band import ErrorBand, band_for
from meshsim.sim.search.bound_types import Bound, PriceCache
from meshsim.sim.search.cheap_bound import cheap_bound
from meshsim.sim.search.memory_memo import MemoryMemo, memory_key
from meshsim.sim.search.screen import Candidate, Refusal, Variants, screen
from meshsim.sim.search.space import Layout

CHUNK = 256  # the least a pipeline group is cut into (tasks): a mesh's prices shared in one process
UNSCREENED = "unscreened"  # the outcome of a layout the --budget left unscreened
Outcome = Refusal | tuple[Bound | None, ErrorBand] | str | None  # None: out of memory; bound None: stored already

_WORK: dict = {}  # the forked workers' inputs (set in the parent before the pool forks)


def screen_one(layout: Layout, variants: Variants, files: FileSnapshot | None, stored: set[str],
               cache: PriceCache, memo: MemoryMemo | None = None) -> tuple[Outcome, Candidate | None]:
    """(the outcome, the candidate when legal) of one layout; a stored cheap bound is not recomputed."""
    outcome = screen(layout, variants, files, memo)
    if isinstance(outcome, Refusal):
        return outcome, None
    if not isinstance(outcome, Candidate):
        return None, None
    bound = None if layout.key in stored else cheap_bound(outcome.rs, cache=cache)
    return (bound, band_for(outcome.rs.scenario)), outcome


def _chunk(indices: Sequence[int]) -> list[tuple[int, Outcome]]:
    w = _WORK
    return [(i, screen_one(w["todo"][i], w["variants"], w["files"], w["stored"], w["cache"], w["memo"])[0])
            for i in indices]


def shape_group(layout: Layout) -> tuple:
    """What decides a layout's micro-batch count and pipeline shape besides the scenario (dp from tp, cp and
    pp; the micro-batch size): layouts of one group share their window counts (overlap_windows.py)."""
    p = layout.point
    return p.tp, p.cp, p.pp, p.vp, p.micro_batch


def _mesh_first(members: list[int], todo: Sequence[Layout]) -> tuple:
    """A class's place: its pipeline group, then its mesh (the layouts that share window counts, costers and
    block costs, which each worker process keeps for itself, come in the same task), then first appearance."""
    p = todo[members[0]].point
    return (*shape_group(todo[members[0]]), p.ep, p.etp, members[0])


def tasks(order: Sequence[int], todo: Sequence[Layout], jobs: int) -> list[list[int]]:
    """`order` cut into tasks: each pipeline group (shape_group) one task, a group larger than
    max(CHUNK, len / (4 jobs)) cut into near-equal pieces (so the workers still finish together)."""
    largest = max(CHUNK, -(-len(order) // (4 * jobs)))
    groups: list[list[int]] = []
    for i in order:
        if groups and shape_group(todo[groups[-1][-1]]) == shape_group(todo[i]):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for g in groups:
        pieces = -(-len(g) // largest)
        size = -(-len(g) // pieces)
        out += [g[k:k + size] for k in range(0, len(g), size)]
    return out


def by_memory_class(todo: Sequence[Layout]) -> list[int]:
    """The layouts' indices, those of one memory class (memory_memo.memory_key) next to each other, classes
    ordered by mesh and micro-batch (_mesh_first)."""
    classes: dict[tuple, list[int]] = {}
    for i, layout in enumerate(todo):
        classes.setdefault(memory_key(layout), []).append(i)
    return [i for members in sorted(classes.values(), key=lambda m: _mesh_first(m, todo)) for i in members]


def screen_all(todo: Sequence[Layout], variants: Variants, files: FileSnapshot | None, stored: set[str], jobs: int,
               advance: Callable[[int], None], deadline: float | None = None
               ) -> tuple[list[Outcome], dict[str, Candidate]]:
    """Every layout's outcome, in order, and the candidates resolved here (all of them with jobs = 1). Past
    `deadline` (time.monotonic), once a layout fits, no new layout (one process) or chunk (workers) starts:
    the layouts left are UNSCREENED."""
    outcomes: list[Outcome] = [UNSCREENED] * len(todo)
    candidates: dict[str, Candidate] = {}
    if jobs <= 1 or len(todo) <= CHUNK:
        cache, memo = PriceCache(), MemoryMemo()
        for i, layout in enumerate(todo):
            if deadline is not None and candidates and time.monotonic() > deadline:
                break
            outcomes[i], cand = screen_one(layout, variants, files, stored, cache, memo)
            if cand is not None:
                candidates[layout.key] = cand
            advance(1)
        return outcomes, candidates
    _WORK.update(todo=todo, variants=variants, files=files, stored=stored, cache=PriceCache(), memo=MemoryMemo())
    chunks = tasks(by_memory_class(todo), todo, jobs)
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures, fits = [pool.submit(_chunk, chunk) for chunk in chunks], False
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                done = future.result()
                for i, outcome in done:
                    outcomes[i] = outcome
                advance(len(done))
                fits = fits or any(isinstance(o, tuple) for _, o in done)
                if deadline is not None and fits and time.monotonic() > deadline:
                    for f in futures:
                        f.cancel()  # those not started; a running chunk finishes
    finally:
        _WORK.clear()
    return outcomes, candidates
