"""Screening and cheap bounding of every layout, in `jobs` forked worker processes.

Each layout is screened (sim/search/screen.py) and, when legal and fitting, given its cheap bound
(sim/search/cheap_bound.py) and its accuracy group's error band, exactly as one process would: the same
functions of the same inputs, so the outcome does not depend on `jobs` (tests/test_search.py compares
them). Workers are forked (they inherit the scenario, the variants and the file snapshot) and take the
layouts in chunks, a memory class (sim/search/memory_memo.py memory_key) in one chunk where it fits, so its
memory is priced once; they send back refusals, out-of-memory marks and (bound, band) pairs, not resolved
scenarios: the parent resolves again only the layouts it refines (bound.py) and those are few.
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

CHUNK = 256  # layouts per task: large enough to share a mesh's prices in one process, small enough to balance
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


def _mesh_first(members: list[int], todo: Sequence[Layout]) -> tuple:
    """A class's place: its mesh and micro-batch first (the layouts that share costers and block costs, which
    each worker process keeps for itself, come in the same or nearby chunks), then first appearance."""
    p = todo[members[0]].point
    return p.tp, p.cp, p.ep, p.etp, p.pp, p.vp, p.micro_batch, members[0]


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
    order = by_memory_class(todo)
    chunks = [order[k:k + CHUNK] for k in range(0, len(order), CHUNK)]
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
