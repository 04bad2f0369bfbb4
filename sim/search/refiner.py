"""Refined bounds (sim/search/bound.py) for the layouts that reach the front of the search's queue, several
at a time in forked worker processes when the search has `jobs` > 1.

A worker computes lower_bound of the same resolved layout (the one screening made, or the layout resolved
again: resolving is deterministic) with its own PriceCache (equal to fresh pricing, bound_types.py), so a
bound does not depend on where it was computed. The pool is forked at the first batch of two or more and
inherits `rs_of`; with one job, or one layout, the bound is computed in this process.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from meshsim.sim.search.bound import lower_bound
from meshsim.sim.search.bound_types import Bound, PriceCache

_WORK: dict = {}  # what forked workers read: rs_of, a PriceCache


def _refine(key: str) -> Bound:
    return lower_bound(_WORK["rs_of"][key], cache=_WORK["cache"])


class Refiner:
    """refiner(keys) -> their refined bounds, in order; a context manager that shuts its pool down."""

    def __init__(self, jobs: int):
        self.jobs, self.rs_of, self.cache = jobs, None, PriceCache()
        self.pool: ProcessPoolExecutor | None = None

    def __call__(self, keys: Sequence[str]) -> list[Bound]:
        if self.jobs <= 1 or len(keys) <= 1:
            return [lower_bound(self.rs_of[key], cache=self.cache) for key in keys]
        if self.pool is None:
            _WORK.update(rs_of=self.rs_of, cache=self.cache)
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"))
        return list(self.pool.map(_refine, keys))

    def __enter__(self) -> Refiner:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            _WORK.clear()
