"""Benchmark: a 12-configuration TP sweep of Llama-2 70B on 1024 GPUs (128 DGX H100 nodes).

tp in {1, 2, 4, 8, 16, 32} x sp in {off, on}, micro-batch 1, selective recompute (the built-in
llama2-70b-h100-tp8 scenario scaled to 128 nodes). global_batch is raised to 1024 sequences (4M tokens,
Llama-2's published batch) so that dp = 1024 / tp divides it for every tp. tp=1 with sp=on is skipped
by the scenario checks, so 11 configurations are simulated.

Target: under 10 s wall on 2 cores. Prints each configuration's wall time (measured in the worker that ran
it) and the total.

    python benchmarks/sweep.py [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import time

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.sweep.axes import configurations, sweep_axes
from meshsim.sim.sweep.explain import explain, sweet_spot
from meshsim.sim.sweep.record import run_point
from meshsim.sim.sweep.runner import run_sweep

TARGET_S = 10.0


def timed_point(scenario, source, point, digest=""):
    """run_point plus the wall time it took in its worker."""
    start = time.perf_counter()
    record = run_point(scenario, source, point, digest)
    return {**record, "elapsed_s": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    base, source = load_scenario("llama2-70b-h100-tp8")
    scenario = with_overrides(base, {"topology.nodes": 128, "parallel.global_batch": 1024}, source)
    points = configurations(sweep_axes(scenario, {"tp": "1,2,4,8,16,32", "sp": "both"}))
    start = time.perf_counter()
    records = run_sweep(scenario, source, points, jobs=args.jobs, progress=False, runner=timed_point)
    total_s = time.perf_counter() - start
    for rec in records:
        status = f"{rec.result.step_time_s:.3f} s/step" if rec.ok else "skipped"
        print(f"{rec.key:<52} {rec['elapsed_s']:6.2f} s   {status}")
    best = sweet_spot(records)
    print(f"sweet spot: {best.key if best else 'none fits'}")
    print(explain(records)[0])
    verdict = "OK" if total_s < TARGET_S else "OVER TARGET"
    print(f"total: {total_s:.2f} s wall for {len(points)} configurations with --jobs {args.jobs} "
          f"(target < {TARGET_S:g} s: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
