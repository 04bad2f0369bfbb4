"""The search's two kinds of task, refining a bound and simulating a layout, on one pool kept busy.

`Workers(jobs, ...)` runs them in `jobs` forked processes that live for the whole search (with one job, in
this process, at once). The branch and bound (sim/search/branch.py) keeps up to `jobs` tasks in flight
and takes each result as it comes (`done`), so no worker waits for a slower one of its batch; the forked
workers inherit what they read (the resolved layouts, the variants, the runner) and keep their own
PriceCache across the layouts they refine, so a collective or a kernel is priced once per worker.

Equal to the one-process search: a refined bound is lower_bound of the same resolved layout (the one
screening made, or the layout resolved again: resolving is deterministic) priced by a PriceCache, equal to
fresh pricing (bound_types.py; tests/test_search_bound.py); a simulation is the sweep's runner
(sim/sweep/record.py run_point) on the layout's variant scenario, its point, the variant's file snapshot
and digest, exactly as sim/sweep/runner.py run_sweep calls it, and the record goes to OUT/sweep.jsonl the
same way (sim/sweep/store.py append_record), so a rerun or `meshsim sweep` reads it back. With --ray the
simulations go through run_sweep's Ray path, one call per set of simulations in flight.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from meshsim.sim.search.bound import lower_bound
from meshsim.sim.search.bound_types import Bound, PriceCache
from meshsim.sim.search.screen import Variants
from meshsim.sim.search.space import Layout
from meshsim.sim.sweep.axes import referenced_snapshot, scenario_digest
from meshsim.sim.sweep.record import SweepRecord
from meshsim.sim.sweep.runner import kill_workers, run_sweep, worker_init
from meshsim.sim.sweep.store import append_record, read_store

_WORK: dict = {}  # what forked workers read: rs_of, variants, runner, a PriceCache, the variants' snapshots


class _Snapshots:
    """variant -> (its scenario, the files it references, its digest), as run_sweep computes them."""

    def __init__(self, variants: Variants):
        self.variants, self.made = variants, {}

    def __call__(self, layout: Layout):
        made = self.made.get(layout.variant)
        if made is None:
            scenario = self.variants(layout)
            files = referenced_snapshot(scenario, self.variants.source)
            made = self.made[layout.variant] = (scenario, files, scenario_digest(scenario, self.variants.source, files))
        return made


def _refine(key: str) -> tuple[Bound, float]:
    """(the refined bound, CPU seconds)."""
    t0 = time.process_time()
    bound = lower_bound(_WORK["rs_of"][key], cache=_WORK["cache"])
    return bound, time.process_time() - t0


def _simulate(layout: Layout) -> tuple[SweepRecord, float, bool]:
    """(the record, CPU seconds, True: new, to be stored)."""
    t0 = time.process_time()
    scenario, files, digest = _WORK["snapshots"](layout)
    record = _WORK["runner"](scenario, _WORK["snapshots"].variants.source, layout.point, digest, files)
    return record, time.process_time() - t0, True


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class Workers:
    """submit_refine(key) -> a future of (bound, CPU seconds); submit_simulate(layout) -> a future of (record,
    CPU seconds, new), `keep(record)` stores a new one; `done(futures)` waits for at least one. Stored sweep
    records (OUT/sweep.jsonl of the layout's variant) come back without simulating. A context manager that
    shuts its pool down (and kills its workers on an exception or Ctrl-C)."""

    def __init__(self, jobs: int, rs_of, variants: Variants, runner: Callable[..., SweepRecord], out_dir=None,
                 ray: str | None = None, warn=None):
        self.jobs, self.out_dir, self.ray, self.warn = jobs, out_dir, ray, warn
        self.snapshots = _Snapshots(variants)
        self.stored: dict[str, dict[str, SweepRecord]] = {}  # digest -> point key -> record
        _WORK.update(rs_of=rs_of, snapshots=self.snapshots, runner=runner, cache=PriceCache())
        self.pool: ProcessPoolExecutor | None = None
        self.ray_queue: list[tuple[Future, Layout]] = []

    def _pool(self) -> ProcessPoolExecutor | None:
        if self.jobs > 1 and self.pool is None:
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"),
                                            initializer=worker_init, initargs=(os.getpid(),))
        return self.pool

    def submit_refine(self, key: str) -> Future:
        pool = self._pool()
        return pool.submit(_refine, key) if pool is not None else _done(_refine(key))

    def _stored(self, layout: Layout) -> SweepRecord | None:
        if self.out_dir is None:
            return None
        digest = self.snapshots(layout)[2]
        if digest not in self.stored:
            read = read_store(self.out_dir, digest)
            for problem in read.problems:
                if self.warn is not None:
                    self.warn(f"{self.out_dir}/sweep.jsonl {problem}: skipped")
            self.stored[digest] = read.records
        return self.stored[digest].get(layout.point.key)

    def submit_simulate(self, layout: Layout) -> Future:
        stored = self._stored(layout)
        if stored is not None:
            return _done((stored, 0.0, False))
        if self.ray:
            future: Future = Future()
            self.ray_queue.append((future, layout))
            return future
        pool = self._pool()
        return pool.submit(_simulate, layout) if pool is not None else _done(_simulate(layout))

    def keep(self, record: SweepRecord) -> None:
        """A new record into OUT/sweep.jsonl (as run_sweep stores it)."""
        if self.out_dir is not None:
            append_record(self.out_dir, record)

    def _run_ray(self) -> None:
        """The simulations queued for Ray, through run_sweep (its store, its Ray tasks), one call per variant."""
        queued, self.ray_queue = self.ray_queue, []
        groups: dict[tuple, list[tuple[Future, Layout]]] = {}
        for future, layout in queued:
            groups.setdefault(layout.variant, []).append((future, layout))
        for group in groups.values():
            scenario = self.snapshots(group[0][1])[0]
            records = run_sweep(scenario, self.snapshots.variants.source, [lay.point for _, lay in group],
                                jobs=len(group), out_dir=self.out_dir, ray_address=self.ray, progress=False,
                                runner=_WORK["runner"], warn=self.warn)
            for (future, _), record in zip(group, records, strict=True):
                future.set_result((record, 0.0, False))  # run_sweep stored it

    def done(self, futures) -> set[Future]:
        """The futures of `futures` that are done, waiting for at least one."""
        if self.ray_queue:
            self._run_ray()
        finished = {f for f in futures if f.done()}
        return finished or wait(futures, return_when=FIRST_COMPLETED).done

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind, *exc) -> None:
        if self.pool is not None:
            if kind is None:
                self.pool.shutdown(cancel_futures=True)
            else:
                kill_workers(self.pool)
        _WORK.clear()
