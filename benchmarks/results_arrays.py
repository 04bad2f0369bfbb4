"""CPU of the steady-state proof, the critical path and the breakdown, and of the whole `simulate()`, on one
or more scenarios: this tree, this tree with today's per-event code in their place (tests/results_reference:
the same engine, so only they differ), and (optionally) another tree, in the same command.

Each tree runs in its own process (its own interpreter, its own `meshsim` package): `simulate()` once to
warm imports and caches, then `--repeats` times with the three analyses wrapped to add up their CPU
(time.process_time), min over the repeats; each under gc_frozen, as `meshsim run` runs it (without it
the collector's rescans of the step's ~10^6 objects land in whichever analysis allocates). `columns`:
building EventLog.columns() from the per-event tuples, whichever analysis asks first (not counted in
it); an engine that records into arrays hands them over for free. Nothing here is asserted.

    python benchmarks/results_arrays.py [--baseline /work/main] [--repeats 3] [SCENARIO ...]
    (default: llama31-405b-h100-tp8-pp8-cp2 deepseek-v3-h100-ep64)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROBE = r"""
import gc, json, sys, time
from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.results import simulate as sm, steady_state as ss, step_result as sr

from meshsim.sim.engine import events
spent = {"prove": 0.0, "critical_path": 0.0, "breakdown": 0.0, "columns": 0.0}
inside = []  # CPU of timed calls made inside the running one: counted in theirs, not in its

def timed(name, fn):
    def wrapper(*args, **kwargs):
        t = time.process_time()
        inside.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            own, elapsed = inside.pop(), time.process_time() - t
            spent[name] += elapsed - own
            if inside:
                inside[-1] += elapsed
    return wrapper

events.EventLog.columns = timed("columns", events.EventLog.columns)  # the log's arrays, built on first use

if sys.argv[3] == "reference":  # today's per-event code (tests/results_reference) in this tree's place
    sys.path.insert(0, "tests")
    from results_reference import breakdown as rb, critical_path as rc, period_proof as rp
    ss.prove, ss.breakdown, sm.breakdown = rp.prove, rb.breakdown, rb.breakdown
    sm.critical_path_columns = sr.pc.critical_path_columns = lambda s, log: sr.pc.from_segments(rc.critical_path(s, log))
    sr.bd = rb
ss.prove = timed("prove", ss.prove)
ss.breakdown = timed("breakdown", ss.breakdown)
sm.breakdown = timed("breakdown", sm.breakdown)
sm.critical_path_columns = timed("critical_path", sm.critical_path_columns)  # the path as columns (path_columns.py)
sr.pc.critical_path_columns = timed("critical_path", sr.pc.critical_path_columns)
sr.bd.breakdown = timed("breakdown", sr.bd.breakdown)
name, repeats = sys.argv[1], int(sys.argv[2])
rs = load_and_resolve(name)
with sm.gc_frozen():
    first = sm.simulate(rs).step_time_s
best = None
for _ in range(repeats):
    for k in spent:
        spent[k] = 0.0
    gc.collect()
    t = time.process_time()
    with sm.gc_frozen():  # as `meshsim run` and sweeps run it
        result = sm.simulate(rs)
    row = {"simulate": time.process_time() - t, **spent, "step_time_s": result.step_time_s,
           "path": result.steady_state.path, "first_step_time_s": first}
    best = row if best is None or row["simulate"] < best["simulate"] else best
print(json.dumps(best))
"""


def measure(tree: str, name: str, repeats: int, reference: bool = False) -> dict:
    """One process of `tree`'s venv python over the scenario (min over repeats of simulate's CPU);
    `reference`: with tests/results_reference's proof, critical path and breakdown instead of the tree's."""
    python = os.path.join(tree, ".venv", "bin", "python")
    out = subprocess.run([python, "-c", PROBE, name, str(repeats), "reference" if reference else "tree"], cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", default=["llama31-405b-h100-tp8-pp8-cp2", "deepseek-v3-h100-ep64"])
    ap.add_argument("--baseline", help="another meshsim tree with its .venv (e.g. /work/main)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = [("this tree", here, False), ("reference", here, True)] + \
        ([("baseline", args.baseline, False)] if args.baseline else [])
    cols = ("simulate", "prove", "critical_path", "breakdown", "columns")
    print(f"{'scenario':32s} {'tree':10s} " + " ".join(f"{c:>13s}" for c in cols) + "  (CPU s, min of repeats)")
    for name in args.scenarios:
        rows = {label: measure(tree, name, args.repeats, ref) for label, tree, ref in trees}
        for label, row in rows.items():
            print(f"{name:32s} {label:10s} " + " ".join(f"{row[c]:13.3f}" for c in cols) + f"  {row['path']}")
        for other in ("reference", "baseline")[:len(rows) - 1]:
            a, b = rows["this tree"], rows[other]
            same = "identical" if a["step_time_s"] == b["step_time_s"] else \
                f"DIFFERENT {a['step_time_s']!r} {b['step_time_s']!r} (first runs {a['first_step_time_s']!r} " \
                f"{b['first_step_time_s']!r})"
            print(f"{'':32s} {'/ ' + other:10s} " + " ".join(f"{a[c] / b[c] if b[c] else 0:13.2f}" for c in cols)
                  + f"  step time {same}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
