"""meshsim's front door: what notebooks and scripts import instead of the internal modules.

    from meshsim.sim.api import load_scenario, resolve, simulate, sweep

    scenario, source = load_scenario("llama2-70b-h100-tp8")        # a YAML path or a built-in name
    result = simulate(resolve(scenario, source))                     # -> StepResult
    result.steady_state                                              # SteadyState("extrapolated", ...) or "full" + reason
    simulate(resolve(scenario, source), full=True, engine_name="simpy")  # every micro-batch, on simpy's loop
    records = sweep(scenario, source, {"tp": "2,4,8", "sp": "both"})  # -> list of SweepRecord
    found = search(scenario, source, fix={"pp": "1"}, space={"fp8": "off,tensorwise"})  # -> SearchResult
    found.winner.key, found.proven, found.winner.step_s                   # the fastest layout, proven under the model
"""

from __future__ import annotations

from collections.abc import Mapping

from meshsim.scenarios.library import builtin_scenarios
from meshsim.scenarios.load import load_and_resolve, load_scenario, resolve, with_overrides
from meshsim.sim.results.simulate import simulate, simulate_with_events
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.search.branch import search as _search
from meshsim.sim.search.result import SearchResult
from meshsim.sim.search.space import parse_assignment
from meshsim.sim.sweep.axes import configurations, sweep_axes
from meshsim.sim.sweep.explain import explain
from meshsim.sim.sweep.explain_terms import sweet_spot
from meshsim.sim.sweep.runner import run_sweep

__all__ = [
    "SearchResult", "StepResult", "builtin_scenarios", "explain", "load_and_resolve", "load_scenario", "resolve", "simulate",
    "search", "simulate_with_events", "sweep", "sweet_spot", "with_overrides",
]


def sweep(scenario, source: str, axes: Mapping[str, str] | None = None, *, jobs: int = 1,
          progress: bool = False) -> list:
    """Every configuration of `axes` (as `meshsim sweep` flags: {"tp": "2,4,8", "sp": "both"}) simulated."""
    points = configurations(sweep_axes(scenario, dict(axes or {})))
    return run_sweep(scenario, source, points, jobs=jobs, progress=progress)


def search(scenario, source: str, fix: Mapping[str, str] | None = None, space: Mapping[str, str] | None = None, *,
           budget_s: float | None = None, jobs: int = 1, out_dir=None, ray: str | None = None,
           progress: bool = False) -> SearchResult:
    """The fastest layout of the scenario's space by branch and bound (as `meshsim search`): `fix` pins axes
    ({"tp": "8"}), `space` sets the values an axis takes ({"fp8": "off,tensorwise"}); text as on the command
    line. result.winner, result.proven, result.within_error, result.entries (every legal layout that fits,
    with its lower bound and, when simulated, its sweep record)."""
    fixed = dict(parse_assignment("--fix", f"{k}={v}", True) for k, v in (fix or {}).items())
    opened = dict(parse_assignment("--space", f"{k}={v}", False) for k, v in (space or {}).items())
    return _search(scenario, source, fixed=fixed, opened=opened, budget_s=budget_s, jobs=jobs, out_dir=out_dir,
                   ray=ray, progress=progress)
