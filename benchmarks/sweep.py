"""Benchmark: sweeps of Llama-2 70B (the built-in llama2-70b-h100-tp8 scenario, selective recompute).

- tp-sp (issue 10): tp in {1, 2, 4, 8, 16, 32} x sp in {off, on} on 1,024 GPUs (128 DGX H100 nodes),
  micro-batch 1, global_batch 1,024 sequences (4M tokens, Llama-2's published batch) so that dp divides it
  for every tp; tp=1 with sp=on is skipped by the checks. Target: < 1.5 s wall with 2 jobs.
- tp-pp (issue 9): tp in {1, 2, 4, 8} x pp in {1, 2, 4, 8}, sp on, on 256 GPUs (32 nodes), global batch
  1,024; invalid pairs are skipped with their rule. Target: < 30 s wall with 2 jobs.
- default-96 (issue 40): the default scenario as it is (64 H100, global batch 128, sp on) swept over
  tp in {1, 2, 4, 8} x pp in {1, 2, 4, 8} x micro-batch in {1, 2} x recompute in {none, selective, full}:
  96 configurations, every one legal (dp x micro-batch divides 128). Target (issue 40's "100-configuration
  sweep"): <= 50 ms CPU per configuration with --jobs 1.

Prints each configuration's wall time (measured in the worker that ran it: SweepRecord.elapsed_s), the
median, the total, and the CPU time per configuration: the CPU of this process and of the workers it
waited for (os.times children), divided by the number of configurations. CPU is the figure to trust on a
shared machine; wall time also counts other people's work.

`--baseline DIR` times a second source tree (e.g. `git archive main | tar -x -C DIR`) in the same command:
each of `--runs` rounds runs the sweep once in a fresh process per tree, interleaved so that both see the
same load (the child imports `meshsim` from the tree through a folder of links first on PYTHONPATH, as
benchmarks/run.py does), and the CPU per configuration of each tree (min and median) and their ratio are
printed. Only the CPU figures are printed then.

`--split` (with --jobs 1) also prints where each configuration's CPU goes, by phase of the sweep's
pipeline (PHASES): each phase's function is wrapped in this process by a CPU timer (process_time, around the
outermost call only), so a phase's figure includes what it calls; the phases marked "of which" run inside
the one above them. The timers cost ~1 us per call; a phase whose function is gone is printed as n/a.

    python benchmarks/sweep.py [--case tp-sp|tp-pp|default-96] [--jobs 2]
    python benchmarks/sweep.py --case default-96 --jobs 1 --split
    python benchmarks/sweep.py --case default-96 --jobs 1 --runs 3 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIO = "llama2-70b-h100-tp8"
CASES = {  # name: (scenario overrides, axes, target wall s or None, target CPU s per configuration or None)
    "tp-sp": ({"topology.nodes": 128, "parallel.global_batch": 1024}, {"tp": "1,2,4,8,16,32", "sp": "both"},
              1.5, None),
    "tp-pp": ({"topology.nodes": 32, "parallel.global_batch": 1024}, {"tp": "1,2,4,8", "pp": "1,2,4,8", "sp": "on"},
              30.0, None),
    "default-96": ({}, {"tp": "1,2,4,8", "sp": "on", "pp": "1,2,4,8", "micro_batch": "1,2",
                        "recompute": "none,selective,full"}, None, 0.050),
}


# (label, module, attribute, depth). A depth 0 phase is timed only when no other depth 0 phase is running (a call
# from inside another is counted there), so their figures add up; a depth 1 phase is timed only inside the depth
# 0 phase listed above it (its calls elsewhere are counted where they happen). The attributes are the names the
# sweep's code calls them by (sim/sweep/record.py, sim/results/simulate.py), so each timer sees those calls.
PHASES = (
    ("resolve: overrides + schema", "meshsim.sim.sweep.record", "with_overrides", 0),
    ("resolve: checks + topology + profile", "meshsim.sim.sweep.record", "resolve", 0),
    ("schedule building", "meshsim.sim.results.simulate", "build_stage_schedules", 0),
    ("engine run (run_stages)", "meshsim.sim.results.simulate", "run_stages", 0),
    ("input check (check_inputs)", "meshsim.sim.engine.events", "check_inputs", 1),
    ("host issue times", "meshsim.sim.results.simulate", "host_issue_times", 1),
    ("collective pricing (CollectiveCoster.cost)", "meshsim.sim.results.costers", "CollectiveCoster.cost", 1),
    ("host issue times (short runs' records)", "meshsim.sim.results.simulate", "host_issue_times", 0),
    ("critical path (short runs)", "meshsim.sim.results.simulate", "critical_path_columns", 0),
    ("breakdown (short runs)", "meshsim.sim.results.simulate", "breakdown", 0),
    ("steady-state proof + extrapolation", "meshsim.sim.results.steady_state", "extrapolate", 0),
    ("collective report rows (CollectiveCoster.rows)", "meshsim.sim.results.costers", "CollectiveCoster.rows", 0),
    ("memory model (memory_per_gpu)", "meshsim.sim.results.simulate", "memory_per_gpu", 0),
    ("result assembly: full runs (build_result)", "meshsim.sim.results.simulate", "build_result", 0),
    ("result assembly: extrapolated (assemble)", "meshsim.sim.results.simulate", "assemble", 0),
    ("result assembly: rows_by_event", "meshsim.sim.results.simulate", "rows_by_event", 0),
    ("sweep record (SweepRecord.ran)", "meshsim.sim.sweep.record", "SweepRecord.ran", 0),
)


@contextlib.contextmanager
def phase_timers():
    """PHASES' functions wrapped by CPU timers for the block; yields {label: CPU s} (None: not found)."""
    spent: dict[str, float | None] = {}
    running: list[str] = []  # the depth 0 phase running now, if any
    wrapped: dict[tuple[int, str], object] = {}  # (id(owner), name) -> the function as first found
    undo = []
    parent = ""
    for label, module, attribute, depth in PHASES:
        parent = label if depth == 0 else parent
        owner = importlib.import_module(module)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        current = getattr(owner, name, None)
        if current is None:
            spent[label] = None
            continue
        spent[label] = 0.0
        original = wrapped.setdefault((id(owner), name), current)
        if current is original:
            undo.append((owner, name, original))
        setattr(owner, name, _timed(current, label, depth, parent, spent, running))
    try:
        yield spent
    finally:
        for owner, name, func in reversed(undo):
            setattr(owner, name, func)


def _timed(func, label: str, depth: int, parent: str, spent: dict[str, float | None], running: list[str]):
    busy = [False]

    @functools.wraps(func)
    def timed(*args, **kwargs):
        mine = not busy[0] and (not running if depth == 0 else running[-1:] == [parent])
        if not mine:
            return func(*args, **kwargs)
        busy[0] = True
        if depth == 0:
            running.append(label)
        start = time.process_time()
        try:
            return func(*args, **kwargs)
        finally:
            spent[label] += time.process_time() - start
            busy[0] = False
            if depth == 0:
                running.pop()
    return timed


def print_split(spent: dict[str, float | None], total_cpu_s: float, configurations: int) -> None:
    """The phases' CPU per configuration, and the rest (the sweep's loop, simulate's glue, records)."""
    print(f"CPU per configuration by phase ({configurations} configurations, this process):")
    top = 0.0
    for label, _, _, depth in PHASES:
        value = spent[label]
        if value is not None and depth == 0:
            top += value
        figure = "n/a" if value is None else f"{value / configurations * 1e3:7.1f} ms {value / total_cpu_s:6.1%}"
        print(f"  {'  of which ' if depth else ''}{label:<{54 - (10 if depth else 0)}} {figure}")
    rest = total_cpu_s - top
    print(f"  {'rest (simulate glue, freeing its objects, loop)':<54} {rest / configurations * 1e3:7.1f} ms "
          f"{rest / total_cpu_s:6.1%}")


def cpu_s() -> float:
    """CPU seconds of this process and of its children that were waited for (pool workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_case(case: str, jobs: int):
    """(records, points, wall s, CPU s) of one sweep of `case` in this process."""
    from meshsim.scenarios.load import load_scenario, with_overrides
    from meshsim.sim.sweep.axes import configurations, sweep_axes
    from meshsim.sim.sweep.runner import run_sweep

    overrides, axes, _, _ = CASES[case]
    base, source = load_scenario(SCENARIO)
    scenario = with_overrides(base, overrides, source) if overrides else base
    points = configurations(sweep_axes(scenario, axes))
    cpu0, start = cpu_s(), time.perf_counter()
    records = run_sweep(scenario, source, points, jobs=jobs, progress=False)
    return records, points, time.perf_counter() - start, cpu_s() - cpu0


def report(case: str, jobs: int, split: bool = False) -> None:
    from meshsim.sim.sweep.explain import explain
    from meshsim.sim.sweep.explain_terms import sweet_spot

    with phase_timers() if split else contextlib.nullcontext() as spent:
        records, points, total_s, total_cpu_s = run_case(case, jobs)
    _, _, target_s, target_cpu_s = CASES[case]
    for rec in records:
        status = f"{rec.result.step_time_s:.3f} s/step" if rec.ok else "skipped"
        print(f"{rec.key:<52} {rec.elapsed_s:6.2f} s   {status}")
    best = sweet_spot(records)
    print(f"sweet spot: {best.key if best else 'none fits'}")
    print(explain(records)[0])
    ran = [rec.elapsed_s for rec in records if rec.ok]
    print(f"median per simulated configuration: {statistics.median(ran) if ran else 0:.3f} s wall")
    wall = f" (target < {target_s:g} s: {'OK' if total_s < target_s else 'OVER TARGET'})" if target_s else ""
    print(f"total: {total_s:.2f} s wall for {len(points)} configurations with --jobs {jobs}{wall}")
    per_cpu_s = total_cpu_s / max(1, len(points))
    cpu = (f" (target <= {target_cpu_s * 1e3:g} ms: {'OK' if per_cpu_s <= target_cpu_s else 'OVER TARGET'})"
           if target_cpu_s else "")
    print(f"CPU per configuration: {per_cpu_s * 1e3:.1f} ms ({total_cpu_s:.2f} s CPU, this process and its "
          f"workers){cpu}")
    if split:
        print_split(spent, total_cpu_s, len(points))


def child(case: str, jobs: int) -> None:
    """--child: one sweep, its figures as one JSON line (for --baseline)."""
    records, points, total_s, total_cpu_s = run_case(case, jobs)
    print(json.dumps({"configurations": len(points), "ran": sum(r.ok for r in records), "wall_s": total_s,
                      "cpu_s": total_cpu_s}))


def compare(case: str, jobs: int, runs: int, baseline: Path) -> None:
    """Fresh-process sweeps of this tree and `baseline`, interleaved; CPU per configuration of each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import byte_compile, core_warning, tree_env  # benchmarks/run.py: the same child environment

    here = Path(__file__).resolve().parent.parent
    trees = {"this tree": None, "baseline": baseline.resolve()}
    per: dict[str, list[float]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="meshsim-sweep-bench-") as tmp_dir:
        envs = {}
        for label, tree in trees.items():
            byte_compile(tree or here)
            envs[label] = tree_env(tree, Path(tmp_dir))
            warning = core_warning(tree or here, label)
            if warning:
                print(warning, file=sys.stderr, flush=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--case", case, "--jobs", str(jobs)]
        for _ in range(runs):
            for label in trees:
                proc = subprocess.run(cmd, env=envs[label], capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise SystemExit(f"{label}: {' '.join(cmd)} failed: {proc.stderr[-2000:]}")
                figures = json.loads(proc.stdout.strip().splitlines()[-1])
                per[label].append(figures["cpu_s"] / figures["configurations"])
                print(f"{label:<10} {figures['configurations']} configurations ({figures['ran']} ran), "
                      f"{figures['cpu_s']:.2f} s CPU, {figures['wall_s']:.2f} s wall", flush=True)
    for label, values in per.items():
        print(f"{label:<10} CPU per configuration: min {min(values) * 1e3:.1f} ms, median "
              f"{statistics.median(values) * 1e3:.1f} ms ({runs} runs, --jobs {jobs}, case {case})")
    print(f"CPU min this tree / baseline: {min(per['this tree']) / min(per['baseline']):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--case", choices=sorted(CASES), default="tp-sp")
    parser.add_argument("--runs", type=int, default=3, help="rounds with --baseline")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another source tree (with sim/, topologies/, scenarios/) timed in the same command")
    parser.add_argument("--split", action="store_true", help="also print the CPU per configuration by phase (--jobs 1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.split and args.jobs != 1:
        parser.error("--split times the phases in this process: use it with --jobs 1")
    if args.child:
        child(args.case, args.jobs)
    elif args.baseline is not None:
        compare(args.case, args.jobs, args.runs, args.baseline)
    else:
        report(args.case, args.jobs, args.split)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
