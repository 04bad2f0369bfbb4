"""Branch and bound over a scenario's layouts, lazily bounded: `search(...)` -> SearchResult.

1. Enumerate the space (sim/search/space.py), screen every layout with the scenario checks and the
   closed-form memory (sim/search/screen.py), and give every candidate its cheap bound
   (sim/search/cheap_bound.py: block templates times the micro-batch count, no schedule built), in
   `jobs` processes (sim/search/screen_pool.py).
2. A queue ordered by each layout's current bound, the larger of the levels computed (both are <= its
   simulated step, so the larger is too). Up to `jobs` tasks are in flight on one pool of workers that
   lives for the whole search (sim/search/workers.py); whenever one is free it takes the front: a layout
   with only its cheap bound gets its refined one (sim/search/bound.py: short schedules, the pipeline's
   fill and drain) and goes back in the queue; a refined layout is simulated by the sweep's runner
   (sim/sweep/record.py run_point, recorded in the resumable OUT/sweep.jsonl; Ray through run_sweep).
   Results are taken as they come, not in batches. Nothing new starts once the front's bound is
   > best x (1 + e), best the fastest fitting layout simulated so far and e its accuracy group's error
   band (MAPE, sim/results/error_band.py); the search ends when nothing is in flight either. Bounds go to
   OUT/bounds.jsonl (sim/search/bound_store.py), so a rerun reads them back instead of bounding again.
3. Optimality: when the search ends, every layout not simulated has a current bound > best (1 + e) >= best
   (best and e those of the final winner: the limit is read afresh before every launch), and its
   simulated step is >= that bound, so no layout is faster than the best: the winner is the fastest
   layout of the space under meshsim's model. Layouts whose step is within e of the winner all have
   bound <= best (1 + e), so all were simulated: "could be the best within the model's error" lists every
   one of them; layouts whose bound is past that line are never simulated (nor refined, when the cheap
   bound is). Which layouts are simulated besides the proof's depends only on the tasks in flight when
   the best improves (at most jobs - 1 of them); the winner's step does not.
4. --budget S bounds the whole search's wall time, counted from its start: screening, bounding and
   simulating. Past it no new screening chunk, refinement or simulation starts (those running finish),
   except that a search with no fitting layout simulated yet goes on until one is, so it always names
   a layout. Then the claims are read off what was done, each on its own: "proven optimal" holds when
   every layout was screened and every one not simulated has a bound >= the winner's step (a budget
   that ran out during the error band's simulations leaves the proof whole); "the error band's list is
   complete" when, besides, every one not simulated has a bound > best (1 + e). The result says which
   hold and how many layouts each one still lacks (SearchResult.band_complete, unscreened,
   needed_for_proof).
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
from meshsim.sim.search.result import Entry, SearchResult
from meshsim.sim.search.screen import Candidate, Refusal, Variants, by_rule, screen
from meshsim.sim.search.screen_pool import UNSCREENED, screen_all
from meshsim.sim.search.space import Layout, build_space, layouts
from meshsim.sim.search.workers import Workers
from meshsim.sim.sweep.axes import referenced_snapshot, scenario_digest
from meshsim.sim.sweep.explain import explain
from meshsim.sim.sweep.record import SweepRecord, run_point


def _bar(enabled: bool) -> Progress:
    """The sweep's bar (stderr, no refresh thread: pool workers fork while it is live)."""
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), auto_refresh=False, disable=not enabled, transient=False)


def screen_and_bound(scenario: Scenario, source: str, fixed: Mapping, opened: Mapping, bar: Progress,
                     store: BoundStore, jobs: int, deadline: float | None = None):
    """(layouts searched, refusals, out-of-memory count, the candidates resolved here, their entries with
    cheap bounds and error bands, variants, bounds reused, layouts left unscreened at `deadline`), screening
    and cheap bounding in `jobs` processes (sim/search/screen_pool.py)."""
    todo = layouts(scenario, build_space(scenario, fixed, opened))
    variants, files = Variants(scenario, source), referenced_snapshot(scenario, source)
    stored = {key for key, level in store.bounds if level == "cheap"}
    task = bar.add_task("screening and bounding layouts", total=len(todo))
    outcomes, candidates = screen_all(todo, variants, files, stored, jobs,
                                      lambda n: bar.update(task, advance=n, refresh=True), deadline)
    refusals, oom, entries, new, unscreened = [], 0, [], [], 0
    for layout, outcome in zip(todo, outcomes, strict=True):
        if outcome == UNSCREENED:
            unscreened += 1
        elif isinstance(outcome, Refusal):
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
    return len(todo), refusals, oom, candidates, entries, variants, reused, unscreened


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


class _State:
    """The branch and bound's running state: entries, the queue, the best layout, what is in flight."""

    def __init__(self, order: list[Entry], bands: dict):
        self.entries = {e.key: e for e in order}
        self.queue, self.bands = _Queue(order), bands
        self.best: Entry | None = None
        self.failed: list[Refusal] = []
        self.flight: dict = {}  # future -> ("refine" | "simulate", n, key)
        self.simulated = 0
        self.cpu_s = {"refine": 0.0, "simulate": 0.0}

    def limit(self) -> float:
        """best x (1 + e), e the best layout's error band (module docstring step 3); inf before a best."""
        if self.best is None:
            return float("inf")
        return self.best.step_s * (1 + self.bands[self.best.key].mape)

    def launch(self, workers: Workers, jobs: int) -> None:
        """Fill the free workers from the front of the queue, below the limit: a layout with its cheap bound
        only is refined (and goes back in the queue), a refined one simulated."""
        while len(self.flight) < jobs and self.queue.front() is not None and self.queue.front() <= self.limit():
            n, key = self.queue.pop()
            e = self.entries[key]
            if e.refined is None:
                self.flight[workers.submit_refine(key)] = ("refine", n, key)
            else:
                self.flight[workers.submit_simulate(e.layout)] = ("simulate", n, key)

    def take(self, future, workers: Workers, store: BoundStore) -> None:
        kind, n, key = self.flight.pop(future)
        result = future.result()
        self.cpu_s[kind] += result[1]
        e = self.entries[key]
        if kind == "refine":
            e = self.entries[key] = replace(e, refined=result[0])
            self.queue.push(e, n)
            store.put([(key, result[0])])
            return
        record, _, new = result
        if new:
            workers.keep(record)
        e = self.entries[key] = replace(e, record=record)
        self.simulated += 1
        if not record.ok:
            self.failed.append(Refusal(e.layout, "simulation", record.reason))
        elif record.fits and (self.best is None or record.result.step_time_s < self.best.step_s):
            self.best = e


def search(scenario: Scenario, source: str, *, fixed: Mapping | None = None, opened: Mapping | None = None,
           budget_s: float | None = None, jobs: int = 1, out_dir=None, ray: str | None = None,
           progress: bool = False, runner: Callable[..., SweepRecord] = run_point, warn=None) -> SearchResult:
    """Branch and bound over the layouts of `scenario` (module docstring)."""
    start = time.monotonic()
    deadline = start + budget_s if budget_s is not None else None
    jobs = max(1, jobs)
    store = BoundStore(out_dir, scenario_digest(scenario, source, referenced_snapshot(scenario, source)))
    with _bar(progress) as bar:
        searched, refusals, oom, candidates, banded, variants, reused, unscreened = screen_and_bound(
            scenario, source, fixed or {}, opened or {}, bar, store, jobs, deadline)
        bounded = time.monotonic()
        order = [e for e, _ in banded]
        state = _State(order, {e.key: b for e, b in banded})
        rs_of = _Resolved(candidates, variants, {e.key: e.layout for e in order})
        task = bar.add_task("simulating (ascending bound)", total=len(order))
        stop = ""
        with Workers(jobs, rs_of, variants, runner, out_dir, ray, warn) as workers:
            while True:
                if not stop and deadline is not None and state.best is not None and time.monotonic() > deadline:
                    stop = "budget"  # no new task; those in flight finish and count
                if not stop:
                    state.launch(workers, jobs)
                if not state.flight:
                    break
                for future in workers.done(list(state.flight)):
                    state.take(future, workers, store)
                best = state.best
                bar.update(task, completed=state.simulated,
                           description=f"simulating: best {best.key if best else '-'}"[:48], refresh=True)
        if stop != "budget" and state.queue.front() is not None:
            stop = "bound"
        bar.update(task, total=state.simulated,
                   description=f"simulated {state.simulated}, pruned {len(order) - state.simulated}", refresh=True)
    best = state.best
    final = sorted(state.entries.values(), key=lambda e: e.bound.step_s)  # stable: ties keep enumeration order
    front = state.queue.front()
    proven = best is not None and not unscreened and (front is None or front >= best.step_s)
    band_done = proven and (front is None or front > state.limit())
    phases = (("screen and cheap bound", bounded - start), ("refine and simulate", time.monotonic() - bounded),
              ("refine CPU", state.cpu_s["refine"]), ("simulate CPU", state.cpu_s["simulate"]))
    return _outcome(scenario, searched, refusals, oom, final, state.failed, best, (proven, band_done, unscreened),
                    stop, start, state.bands, phases, reused)


def _outcome(scenario: Scenario, searched, refusals, oom, entries, failed, best, claims, stop, start, bands, phases,
             reused) -> SearchResult:
    proven, band_done, unscreened = claims
    reason = {"bound": "the next bound is beyond the best step and its error band",
              "budget": "--budget ran out", "": "every layout simulated"}[stop]
    if unscreened:
        reason = f"--budget ran out while screening ({unscreened:,} layouts not screened)"
    band, within, reasons = None, (), ()
    if best is not None:
        band = bands[best.key]
        within = tuple(e for e in entries if e is not best and e.step_s is not None and e.record.fits
                       and e.step_s <= best.step_s * (1 + band.mape))
        records = [e.record for e in entries if e.record is not None]
        reasons = tuple(explain(records, lambda rec: band, settings=scenario_settings(scenario)))
    return SearchResult(scenario.name, searched, by_rule(refusals), oom, tuple(entries), tuple(failed), best, proven,
                        reason, within, band, reasons, time.monotonic() - start, phases, reused, band_done,
                        unscreened)

