"""Branch and bound over a scenario's layouts, lazily bounded: `search(...)` -> SearchResult.

1. Enumerate the space (sim/search/space.py), screen every layout with the scenario checks and the
   closed-form memory (sim/search/screen.py), and give every candidate its cheap bound
   (sim/search/cheap_bound.py: block templates times the micro-batch count, no schedule built), in
   `jobs` processes (sim/search/screen_pool.py).
2. A queue ordered by each layout's current bound, the larger of the levels computed (both are <= its
   simulated step, so the larger is too). Take the front: a layout with only its cheap bound gets its
   refined one (sim/search/bound.py: short schedules, the pipeline's fill and drain) and goes back in
   the queue; a refined layout is simulated, `jobs` at a time, through the sweep's runner
   (sim/sweep/runner.py run_sweep: the same run_point, the resumable OUT/sweep.jsonl store, its process
   pool or Ray). Stop when the front's bound is >= best x (1 + e), e the largest error band (MAPE,
   sim/results/error_band.py) of the candidates' accuracy groups. Bounds go to OUT/bounds.jsonl
   (sim/search/bound_store.py), so a rerun reads them back instead of bounding again.
3. Optimality: every layout not simulated has a current bound >= best (1 + e) >= best, and its simulated
   step is >= that bound, so no layout is faster than the best: the winner is the fastest layout of the
   space under meshsim's model. Layouts whose step is within e of the winner all have bound < best (1 + e),
   so all were simulated: "could be the best within the model's error" lists every one of them. Only the
   layouts whose cheap bound comes below that line are ever refined.
   A --budget that runs out first leaves the winner unproven, and the result says so.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshsim.scenarios.schema import Scenario
from meshsim.sim.outputs.advice import scenario_settings
from meshsim.sim.search.bound_store import BoundStore
from meshsim.sim.search.refiner import Refiner
from meshsim.sim.search.result import Entry, SearchResult
from meshsim.sim.search.screen import Candidate, Refusal, Variants, by_rule, screen
from meshsim.sim.search.screen_pool import screen_all
from meshsim.sim.search.space import Layout, build_space, layouts
from meshsim.sim.sweep.axes import referenced_snapshot, scenario_digest
from meshsim.sim.sweep.explain import explain
from meshsim.sim.sweep.record import SweepRecord, run_point
from meshsim.sim.sweep.runner import run_sweep


def _bar(enabled: bool) -> Progress:
    """The sweep's bar (stderr, no refresh thread: pool workers fork while it is live)."""
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), auto_refresh=False, disable=not enabled, transient=False)


def screen_and_bound(scenario: Scenario, source: str, fixed: Mapping, opened: Mapping, bar: Progress,
                     store: BoundStore, jobs: int):
    """(layouts searched, refusals, out-of-memory count, the candidates resolved here, their entries with
    cheap bounds and error bands, variants, bounds reused), screening and cheap
    bounding in `jobs` processes (sim/search/screen_pool.py)."""
    todo = layouts(scenario, build_space(scenario, fixed, opened))
    variants, files = Variants(scenario, source), referenced_snapshot(scenario, source)
    stored = {key for key, level in store.bounds if level == "cheap"}
    task = bar.add_task("screening and bounding layouts", total=len(todo))
    outcomes, candidates = screen_all(todo, variants, files, stored, jobs,
                                      lambda n: bar.update(task, advance=n, refresh=True))
    refusals, oom, entries, new = [], 0, [], []
    for layout, outcome in zip(todo, outcomes, strict=True):
        if isinstance(outcome, Refusal):
            refusals.append(outcome)
        elif outcome is None:
            oom += 1
        else:
            bound, band = outcome
            if bound is None:
                bound = store.get(layout.key, "cheap")
            else:
                new.append((layout.key, bound))
            entries.append((Entry(layout, bound, store.get(layout.key, "refined")), band))
    store.put(new)
    reused = len(entries) - len(new) + sum(1 for e, _ in entries if e.refined is not None)
    return len(todo), refusals, oom, candidates, entries, variants, reused


class _Resolved:
    """layout key -> its resolved scenario: the one screening made, else resolved again (screen.py)."""

    def __init__(self, candidates: dict[str, Candidate], variants: Variants, layouts_by_key: dict[str, Layout]):
        self.candidates, self.variants, self.layouts = candidates, variants, layouts_by_key

    def __getitem__(self, key: str):
        c = self.candidates.get(key)
        if c is None:
            c = screen(self.layouts[key], self.variants, referenced_snapshot(self.variants.scenario,
                                                                               self.variants.source))
        return c.rs


def _simulate(batch: list[Entry], variants: Variants, source: str, *, jobs: int, out_dir, ray: str | None,
              runner: Callable[..., SweepRecord], warn) -> dict[str, SweepRecord]:
    """Run a batch through the sweep runner, one run_sweep per variant scenario; layout key -> record."""
    groups: dict[tuple, list[Entry]] = {}
    for e in batch:
        groups.setdefault(e.layout.variant, []).append(e)
    out = {}
    for group in groups.values():
        points = [e.layout.point for e in group]
        records = run_sweep(variants(group[0].layout), source, points, jobs=min(jobs, len(points)), out_dir=out_dir,
                            ray_address=ray, progress=False, runner=runner, warn=warn)
        out.update({e.key: r for e, r in zip(group, records, strict=True)})
    return out


class _Queue:
    """Entries by current bound (ties: enumeration order)."""

    def __init__(self, entries: list[Entry]):
        self.heap = [(e.bound.step_s, n, e.key) for n, e in enumerate(entries)]
        heapq.heapify(self.heap)

    def front(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def pop(self) -> tuple[int, str]:
        _, n, key = heapq.heappop(self.heap)
        return n, key

    def push(self, entry: Entry, n: int) -> None:
        heapq.heappush(self.heap, (entry.bound.step_s, n, entry.key))


def _next_batch(queue: _Queue, entries: dict[str, Entry], limit: float, size: int, refiner: Refiner,
                store: BoundStore) -> list[tuple[int, Entry]]:
    """Up to `size` refined entries from the front whose bound is below `limit`; layouts that reach the front
    with their cheap bound only are refined, up to `size` at a time (in parallel), and put back."""
    batch: list[tuple[int, Entry]] = []
    while len(batch) < size and queue.front() is not None and queue.front() < limit:
        todo: list[tuple[int, str]] = []
        while len(batch) < size and len(todo) < size and queue.front() is not None and queue.front() < limit:
            n, key = queue.pop()
            if entries[key].refined is None:
                todo.append((n, key))
            else:
                batch.append((n, entries[key]))
        if todo:
            bounds = refiner([key for _, key in todo])
            for (n, key), bound in zip(todo, bounds, strict=True):
                entries[key] = replace(entries[key], refined=bound)
                queue.push(entries[key], n)
            store.put(list(zip([key for _, key in todo], bounds, strict=True)))
    return batch


def _take(batch, records: dict[str, SweepRecord], entries: dict[str, Entry], failed: list[Refusal],
          best: Entry | None) -> Entry | None:
    """Record a simulated batch in `entries` (and `failed`); the best fitting layout so far."""
    for _, e in batch:
        rec = records[e.key]
        e = entries[e.key] = replace(e, record=rec)
        if not rec.ok:
            failed.append(Refusal(e.layout, "simulation", rec.reason))
        elif rec.fits and (best is None or rec.result.step_time_s < best.step_s):
            best = e
    return best


def search(scenario: Scenario, source: str, *, fixed: Mapping | None = None, opened: Mapping | None = None,
           budget_s: float | None = None, jobs: int = 1, out_dir=None, ray: str | None = None,
           progress: bool = False, runner: Callable[..., SweepRecord] = run_point, warn=None) -> SearchResult:
    """Branch and bound over the layouts of `scenario` (module docstring)."""
    start = time.monotonic()
    store = BoundStore(out_dir, scenario_digest(scenario, source, referenced_snapshot(scenario, source)))
    with _bar(progress) as bar, Refiner(jobs) as refiner:
        searched, refusals, oom, candidates, banded, variants, reused = screen_and_bound(
            scenario, source, fixed or {}, opened or {}, bar, store, jobs)
        bounded = time.monotonic()
        order = [e for e, _ in banded]
        entries = {e.key: e for e in order}
        refiner.rs_of = _Resolved(candidates, variants, {e.key: e.layout for e in order})
        bands = {e.key: b for e, b in banded}
        margin = max((b.mape for b in bands.values()), default=0.0)
        queue = _Queue(order)
        task = bar.add_task("simulating (ascending bound)", total=len(order))
        best: Entry | None = None
        failed: list[Refusal] = []
        simulated, stop, refine_s = 0, "", 0.0
        while True:
            if budget_s is not None and best is not None and time.monotonic() - start > budget_s:
                stop = "budget"
                break
            limit = best.step_s * (1 + margin) if best is not None else float("inf")
            t0 = time.monotonic()
            batch = _next_batch(queue, entries, limit, max(1, jobs), refiner, store)
            refine_s += time.monotonic() - t0
            if not batch:
                stop = "bound" if queue.front() is not None else ""
                break
            records = _simulate([e for _, e in batch], variants, source, jobs=jobs, out_dir=out_dir, ray=ray,
                                runner=runner, warn=warn)
            best = _take(batch, records, entries, failed, best)
            simulated += len(batch)
            bar.update(task, completed=simulated, description=f"simulating: best {best.key if best else '-'}"[:48],
                       refresh=True)
        bar.update(task, total=simulated, description=f"simulated {simulated}, pruned {len(order) - simulated}",
                   refresh=True)
    if best is not None:
        best = entries[best.key]
    final = sorted(entries.values(), key=lambda e: e.bound.step_s)  # stable: ties keep enumeration order
    front = queue.front()
    proven = best is not None and stop != "budget" and (front is None or front >= best.step_s)
    phases = (("screen and cheap bound", bounded - start), ("refine", refine_s),
              ("simulate", time.monotonic() - bounded - refine_s))
    return _outcome(scenario, searched, refusals, oom, final, failed, best, proven, stop, start, bands, phases, reused)


def _outcome(scenario: Scenario, searched, refusals, oom, entries, failed, best, proven, stop, start, bands, phases,
             reused) -> SearchResult:
    reason = {"bound": "the next bound is beyond the best step and its error band",
              "budget": "--budget ran out", "": "every layout simulated"}[stop]
    band, within, reasons = None, (), ()
    if best is not None:
        band = bands[best.key]
        within = tuple(e for e in entries if e is not best and e.step_s is not None and e.record.fits
                       and e.step_s <= best.step_s * (1 + band.mape))
        records = [e.record for e in entries if e.record is not None]
        reasons = tuple(explain(records, lambda rec: band, settings=scenario_settings(scenario)))
    return SearchResult(scenario.name, searched, by_rule(refusals), oom, tuple(entries), tuple(failed), best, proven,
                        reason, within, band, reasons, time.monotonic() - start, phases, reused)

