"""Benchmark: two sweeps of Llama-2 70B (the built-in llama2-70b-h100-tp8 scenario, selective recompute).

- tp-sp (issue 10): tp in {1, 2, 4, 8, 16, 32} x sp in {off, on} on 1,024 GPUs (128 DGX H100 nodes),
  micro-batch 1, global_batch 1,024 sequences (4M tokens, Llama-2's published batch) so that dp divides it
  for every tp; tp=1 with sp=on is skipped by the checks. Target: < 1.5 s wall with 2 jobs.
- tp-pp (issue 9): tp in {1, 2, 4, 8} x pp in {1, 2, 4, 8}, sp on, on 256 GPUs (32 nodes), global batch
  1,024; invalid pairs are skipped with their rule. Target: < 30 s wall with 2 jobs.

Prints each configuration's wall time (measured in the worker that ran it: SweepRecord.elapsed_s), the
median and the total.

    python benchmarks/sweep.py [--case tp-sp|tp-pp] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.sweep.axes import configurations, sweep_axes
from meshsim.sim.sweep.explain import explain
from meshsim.sim.sweep.explain_terms import sweet_spot
from meshsim.sim.sweep.runner import run_sweep

CASES = {  # name: (nodes, axes, target wall s)
    "tp-sp": (128, {"tp": "1,2,4,8,16,32", "sp": "both"}, 1.5),
    "tp-pp": (32, {"tp": "1,2,4,8", "pp": "1,2,4,8", "sp": "on"}, 30.0),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--case", choices=sorted(CASES), default="tp-sp")
    args = parser.parse_args()
    nodes, axes, target_s = CASES[args.case]
    base, source = load_scenario("llama2-70b-h100-tp8")
    scenario = with_overrides(base, {"topology.nodes": nodes, "parallel.global_batch": 1024}, source)
    points = configurations(sweep_axes(scenario, axes))
    start = time.perf_counter()
    records = run_sweep(scenario, source, points, jobs=args.jobs, progress=False)
    total_s = time.perf_counter() - start
    for rec in records:
        status = f"{rec.result.step_time_s:.3f} s/step" if rec.ok else "skipped"
        print(f"{rec.key:<52} {rec.elapsed_s:6.2f} s   {status}")
    best = sweet_spot(records)
    print(f"sweet spot: {best.key if best else 'none fits'}")
    print(explain(records)[0])
    ran = [rec.elapsed_s for rec in records if rec.ok]
    verdict = "OK" if total_s < target_s else "OVER TARGET"
    print(f"median per simulated configuration: {statistics.median(ran) if ran else 0:.3f} s")
    print(f"total: {total_s:.2f} s wall for {len(points)} configurations with --jobs {args.jobs} "
          f"(target < {target_s:g} s: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
