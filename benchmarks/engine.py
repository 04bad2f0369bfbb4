"""CPU cost of the discrete-event engine and of the critical-path walk alone, in process (min of N repeats).

Runs `simulate()` once per scenario to record every engine call (the two short steady-state runs, or the
whole step), then repeats those calls: the collective and compute costers are warm, so the figure is the
engine's own cost (us per event). The critical path is timed the same way on fresh event logs. Whole
processes (imports, outputs) are benchmarks/run.py's job.

Each engine (the compiled core, the Python core on its own loop and on simpy's, sim/core/engines.py) is timed
on the same calls.

    python benchmarks/engine.py [--repeats 7] [--engines compiled,python,simpy] [SCENARIO ...]   (default: the default scenario)
"""

from __future__ import annotations

import argparse
import time

from meshsim.scenarios.library import DEFAULT_SCENARIO
from meshsim.scenarios.load import load_scenario, resolve
from meshsim.sim.engine import events
from meshsim.sim.engine.events import EventLog
from meshsim.sim.results import simulate as simulate_module
from meshsim.sim.results.critical_path import critical_path

engine_run = events.run  # the real one (recorded_calls patches the module attribute simulate() calls)


def recorded_calls(name: str) -> tuple[list, list]:
    """(engine calls, critical-path calls) made by one simulate() of the scenario."""
    scenario, source = load_scenario(name)
    engine_calls, path_calls = [], []

    def recording_run(*args, **kwargs):
        engine_calls.append((args, kwargs))
        return engine_run(*args, **kwargs)

    def path(schedules, log):
        path_calls.append((schedules, log))
        return critical_path(schedules, log)

    simulate_module.engine.run, simulate_module.critical_path = recording_run, path
    try:
        simulate_module.simulate(resolve(scenario, source))
    finally:
        simulate_module.engine.run, simulate_module.critical_path = engine_run, critical_path
    return engine_calls, path_calls


def min_cpu_s(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", default=[DEFAULT_SCENARIO])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--engines", default="compiled,python,simpy", help="comma-separated engine names")
    args = ap.parse_args()
    for name in args.scenarios:
        engine_calls, path_calls = recorded_calls(name)
        n_events = sum(len(engine_run(*a, **k).events) for a, k in engine_calls)
        path_s = min_cpu_s(lambda calls=path_calls: [critical_path(s, EventLog(log.events, log.ranks, log.step_time_s))
                                                     for s, log in calls], args.repeats)
        for engine in args.engines.split(","):
            engine_s = min_cpu_s(lambda calls=engine_calls, e=engine: [engine_run(*a, **{**k, "engine": e})
                                                                       for a, k in calls], args.repeats)
            print(f"{name:<26} {engine:<8} engine {engine_s * 1e3:7.1f} ms ({len(engine_calls)} runs, {n_events} "
                  f"events, {engine_s / max(n_events, 1) * 1e6:5.2f} us/event), critical path {path_s * 1e3:6.1f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
