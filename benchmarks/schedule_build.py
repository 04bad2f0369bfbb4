"""CPU time and memory of building schedules, on this tree and on others given with --against, in one command.

For each scenario and tree, in a fresh child process (so RSS is its own): build_stage_schedules at the
micro-batches of the steady-state short run `meshsim run` simulates (simulate.plan_and_run; the whole step
when it is not extrapolated), then, in another child, the whole `api.simulate`. Printed per run: ops, CPU s
(time.process_time), RSS before and after the build (/proc/self/statm) and peak RSS (ru_maxrss).
On this tree it also times the compiled engine's per-stage arrays (sim/engine/compiled._stage's kind,
dep_ptr / dep_idx, per-stream positions) read off the ops as _stage does today, against Schedule.arrays
(tiled from the stamps) plus the per-stream positions from its stream column.

    python benchmarks/schedule_build.py [--against /work/main] [--scenarios a,b] [--no-simulate]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SCENARIOS = ("llama31-405b-h100-tp8-pp8-cp2", "deepseek-v3-h100-ep64")

CHILD = r'''
import json, os, resource, sys, time
from dataclasses import replace
from itertools import chain
what, name = sys.argv[1], sys.argv[2]
def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
from meshsim.sim import api
from meshsim.sim.results.simulate import plan_and_run
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
rs = api.load_and_resolve(name)
out = {}
if what == "build":
    chosen = plan_and_run(rs, False)
    rs = replace(rs, micro_batches=chosen[1]) if chosen else rs
    before, t = rss_mb(), time.process_time()
    schedules = build_stage_schedules(rs)
    out.update(cpu_s=time.process_time() - t, ops=sum(len(s.ops) for s in schedules), micro_batches=rs.micro_batches)
    out.update(rss_before_mb=before, rss_after_mb=rss_mb())
    if len(sys.argv) > 3:
        import numpy as np
        from meshsim.sim.schedule.ops import FIFO_STREAMS, P2P, STREAMS, Collective
        t = time.process_time()
        for s in schedules:  # sim/engine/compiled._stage's array lines, as written on main
            ops = s.ops
            deps = list(map(lambda op: op.deps, ops))
            dep_ptr = np.zeros(len(ops) + 1, dtype=np.intc)
            np.cumsum(np.fromiter(map(len, deps), dtype=np.intc, count=len(ops)), out=dep_ptr[1:])
            dep_idx = np.fromiter(chain.from_iterable(deps), dtype=np.intc, count=int(dep_ptr[-1]))
            types = list(map(type, map(lambda op: op.work, ops)))
            kind_of = {k: 1 if issubclass(k, Collective) else 2 if issubclass(k, P2P) else 0 for k in set(types)}
            kind = np.fromiter(map(kind_of.__getitem__, types), dtype=np.intc, count=len(ops))
            by = {x: [] for x in STREAMS}
            for op in ops:
                by[op.stream].append(op)
            streams = [np.fromiter(map(lambda op: op.id, by[x]), dtype=np.intc, count=len(by[x]))
                       for x in FIFO_STREAMS if by[x]]
            batches = [op.id for op in by["pp_comm"]]
        out["stage_from_ops_s"] = time.process_time() - t
        t = time.process_time()
        for s in schedules:  # the same from Schedule.arrays
            a = s.arrays
            kind, dep_ptr, dep_idx = a.kind, a.dep_ptr, a.dep_idx
            streams = [p for p in (np.flatnonzero(a.stream == STREAMS.index(x)).astype(np.intc)
                                   for x in FIFO_STREAMS) if p.size]
            batches = np.flatnonzero(a.stream == STREAMS.index("pp_comm")).tolist()
        out["stage_from_arrays_s"] = time.process_time() - t
else:
    before, t = rss_mb(), time.process_time()
    api.simulate(rs)
    out.update(cpu_s=time.process_time() - t, rss_before_mb=before, rss_after_mb=rss_mb())
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
'''


def child(tree: Path, what: str, name: str, arrays: bool) -> dict:
    cmd = [str(tree / ".venv/bin/python"), "-c", CHILD, what, name] + (["arrays"] if arrays else [])
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", action="append", default=[], help="another tree with its own .venv (e.g. /work/main)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--no-simulate", action="store_true", help="only the schedule build")
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    trees = [here] + [Path(t).resolve() for t in args.against]
    for name in args.scenarios.split(","):
        for what in ("build",) + (() if args.no_simulate else ("simulate",)):
            for tree in trees:
                r = child(tree, what, name, what == "build" and tree == here)
                print(f"{name} {what:8s} {tree}: " + " ".join(
                    f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
