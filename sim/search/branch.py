"""Branch and bound over a scenario's layouts: `search(...)` -> SearchResult.

1. Enumerate the space (sim/search/space.py), screen every layout with the scenario checks and the
   closed-form memory (sim/search/screen.py), bound every candidate (sim/search/bound.py).
2. Simulate in ascending bound order, `jobs` layouts at a time, through the sweep's runner
   (sim/sweep/runner.py run_sweep: the same run_point, the resumable OUT/sweep.jsonl store, its process
   pool or Ray). Stop when the next bound is >= best x (1 + e), e the largest error band (MAPE,
   sim/results/error_band.py) of the candidates' accuracy groups.
3. Optimality: every layout not simulated has bound >= best (1 + e) >= best, and its simulated step is
   >= its bound (bound.py), so no layout is faster than the best: the winner is the fastest layout of the
   space under meshsim's model. Layouts whose step is within e of the winner all have bound < best (1 + e),
   so all were simulated: "could be the best within the model's error" lists every one of them.
   A --budget that runs out first leaves the winner unproven, and the result says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshsim.scenarios.schema import Scenario
from meshsim.sim.outputs.advice import scenario_settings
from meshsim.sim.results.error_band import band_for
from meshsim.sim.search.bound import lower_bound
from meshsim.sim.search.result import Entry, SearchResult
from meshsim.sim.search.screen import Candidate, Refusal, Variants, by_rule, screen
from meshsim.sim.search.space import build_space, layouts
from meshsim.sim.sweep.axes import referenced_snapshot
from meshsim.sim.sweep.explain import explain
from meshsim.sim.sweep.record import SweepRecord, run_point
from meshsim.sim.sweep.runner import run_sweep


def _bar(enabled: bool) -> Progress:
    """The sweep's bar (stderr, no refresh thread: pool workers fork while it is live)."""
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), auto_refresh=False, disable=not enabled, transient=False)


def screen_and_bound(scenario: Scenario, source: str, fixed: Mapping, opened: Mapping, bar: Progress):
    """(layouts searched, refusals, out-of-memory count, entries in ascending bound order)."""
    todo = layouts(scenario, build_space(scenario, fixed, opened))
    variants, files = Variants(scenario, source), referenced_snapshot(scenario, source)
    refusals, oom, candidates = [], 0, []
    task = bar.add_task("screening layouts", total=len(todo))
    for layout in todo:
        outcome = screen(layout, variants, files)
        if isinstance(outcome, Refusal):
            refusals.append(outcome)
        elif isinstance(outcome, Candidate):
            candidates.append(outcome)
        else:
            oom += 1
        bar.update(task, advance=1, refresh=True)
    screened = time.monotonic()
    task = bar.add_task("bounding layouts", total=len(candidates))
    entries = []
    for c in candidates:
        entries.append((Entry(c.layout, lower_bound(c.rs)), band_for(c.rs.scenario)))
        bar.update(task, advance=1, refresh=True)
    entries.sort(key=lambda t: t[0].bound.step_s)  # stable: ties keep enumeration order
    return len(todo), refusals, oom, entries, variants, screened


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


def search(scenario: Scenario, source: str, *, fixed: Mapping | None = None, opened: Mapping | None = None,
           budget_s: float | None = None, jobs: int = 1, out_dir=None, ray: str | None = None,
           progress: bool = False, runner: Callable[..., SweepRecord] = run_point, warn=None) -> SearchResult:
    """Branch and bound over the layouts of `scenario` (module docstring)."""
    start = time.monotonic()
    with _bar(progress) as bar:
        searched, refusals, oom, banded, variants, screened = screen_and_bound(scenario, source, fixed or {},
                                                                               opened or {}, bar)
        phases = [("screen", screened - start), ("bound", time.monotonic() - screened)]
        entries = [e for e, _ in banded]
        bands = {e.key: b for e, b in banded}
        margin = max((b.mape for b in bands.values()), default=0.0)
        task = bar.add_task("simulating (ascending bound)", total=len(entries))
        best: Entry | None = None
        failed: list[Refusal] = []
        i, stop = 0, ""
        while i < len(entries):
            limit = best.step_s * (1 + margin) if best is not None else float("inf")
            if entries[i].bound.step_s >= limit:
                stop = "bound"
                break
            if budget_s is not None and best is not None and time.monotonic() - start > budget_s:
                stop = "budget"
                break
            batch = [e for e in entries[i:i + max(1, jobs)] if e.bound.step_s < limit]
            records = _simulate(batch, variants, source, jobs=jobs, out_dir=out_dir, ray=ray, runner=runner, warn=warn)
            for j, e in enumerate(batch, start=i):
                rec = records[e.key]
                entries[j] = replace(e, record=rec)
                if not rec.ok:
                    failed.append(Refusal(e.layout, "simulation", rec.reason))
                elif rec.fits and (best is None or rec.result.step_time_s < best.step_s):
                    best = entries[j]
            i += len(batch)
            bar.update(task, completed=i, description=f"simulating: best {best.key if best else '-'}"[:48],
                       refresh=True)
        bar.update(task, total=i, description=f"simulated {i}, pruned {len(entries) - i}", refresh=True)
    phases.append(("simulate", time.monotonic() - start - sum(t for _, t in phases)))
    return _outcome(scenario, searched, refusals, oom, entries, failed, best, i, stop, start, bands, tuple(phases))


def _outcome(scenario: Scenario, searched, refusals, oom, entries, failed, best, i, stop, start, bands, phases
             ) -> SearchResult:
    proven = best is not None and stop != "budget" and (i == len(entries) or entries[i].bound.step_s >= best.step_s)
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
                        reason, within, band, reasons, time.monotonic() - start, phases)

