"""CPU of writing one run's outputs (results.json, trace.json, timeline.html), from the compiled core's
event arrays (sim/outputs/trace_rows.py, timeline_rows.py) and the per-event Python way (the reference:
trace.py's iter_trace_json, the timeline over Event tuples), in one process on the same simulated step;
and whether the two ways wrote the same bytes.

Each scenario is simulated once (`simulate()`, under gc_frozen as `meshsim run` runs it), then each writer
runs `--repeats` times per way, CPU (time.process_time) min over the repeats. The timeline's reference
gets the step's events as a tuple of Event, built before its clock starts. Nothing here is asserted.

    python benchmarks/outputs.py [--repeats 3] [SCENARIO ...]
    (default: deepseek-v3-h100-ep64 llama31-405b-h100-tp8-pp8-cp2)
"""

from __future__ import annotations

import argparse
import filecmp
import tempfile
import time
from pathlib import Path

from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.outputs import trace, trace_rows
from meshsim.sim.outputs.step_report import write_results_json
from meshsim.sim.outputs.timeline import write_timeline
from meshsim.sim.results.simulate import gc_frozen, simulate

DEFAULT = ("deepseek-v3-h100-ep64", "llama31-405b-h100-tp8-pp8-cp2")


def cpu_min(repeats: int, fn, *args, **kw) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn(*args, **kw)
        best = min(best, time.process_time() - start)
    return best


def python_trace(path: Path, events, critical_path, **kw) -> Path:
    """write_trace the Python way (the compiled writer switched off)."""
    applies = trace_rows.applies
    trace_rows.applies = lambda *a: False
    try:
        return trace.write_trace(path, events, critical_path, **kw)
    finally:
        trace_rows.applies = applies


def measure(name: str, repeats: int, out: Path) -> None:
    with gc_frozen(program=True):
        r = simulate(load_and_resolve(name))
        events = r.events
        figures = {
            "results.json": cpu_min(repeats, write_results_json, r, out / "results.json"),
            "trace.json arrays": cpu_min(repeats, trace.write_trace, out / "a.json", events, r.critical_path, result=r),
            "trace.json python": cpu_min(repeats, python_trace, out / "p.json", events, r.critical_path, result=r),
            "timeline arrays": cpu_min(repeats, write_timeline, out / "a.html", events, r.critical_path, "t", result=r),
        }
        as_tuples = tuple(events)
        figures["timeline python"] = cpu_min(repeats, write_timeline, out / "p.html", as_tuples, r.critical_path, "t",
                                             result=r)
    same = {f: filecmp.cmp(out / f"a.{f}", out / f"p.{f}", shallow=False) for f in ("json", "html")}
    size_mb = (out / "a.json").stat().st_size / 1e6
    print(f"{name}: {len(events):,} events, trace.json {size_mb:.1f} MB")
    for what, cpu_s in figures.items():
        print(f"  {what:<20} CPU min {cpu_s:6.3f} s")
    print(f"  trace.json x{figures['trace.json python'] / figures['trace.json arrays']:.1f}, timeline "
          f"x{figures['timeline python'] / figures['timeline arrays']:.1f}; same bytes: trace {same['json']}, "
          f"timeline {same['html']}; compiled trace writer built: {trace_rows.AVAILABLE}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", default=list(DEFAULT))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenarios:
            measure(name, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()
