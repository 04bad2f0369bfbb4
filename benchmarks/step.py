"""Wall time of simulating one training step, and how it grows with layers and with GPUs.

Workload: Llama-2 70B (the built-in default scenario) at tp 8 with sequence parallelism on 128 DGX H100
nodes (1024 GPUs, dp 128), global batch 1024 sequences of 4096 tokens (4M tokens, the batch Touvron et
al. 2023 report for Llama 2), so 8 micro-batches per replica. Timed on one core, in one process:
resolve, build the schedule, run the engine (the cost models are called from it and timed apart),
assemble the StepResult, write results.json and trace.json (timeline.html is timed on its own).

Scaling runs keep 8 micro-batches per replica (global batch = 8 x dp) so the per-rank schedule only
changes with the layer count: the GPU sweep shows what the mesh size itself costs (it should be ~0).

    python benchmarks/step.py [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from meshsim.scenarios.library import DEFAULT_SCENARIO
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.engine import events as engine
from meshsim.sim.outputs.step_report import write_results_json
from meshsim.sim.outputs.timeline import write_timeline
from meshsim.sim.outputs.trace import write_trace
from meshsim.sim.results.costers import CollectiveCoster, compute_fn
from meshsim.sim.results.simulate import simulated_ranks
from meshsim.sim.results.step_result import build_result

MICRO_BATCHES = 8


def overrides(nodes: int, layers: int | None = None) -> dict:
    dp = nodes * 8 // 8  # 8 GPUs per node, tp 8
    out = {"topology.nodes": nodes, "parallel.tp": 8, "parallel.sp": True, "parallel.dp": "auto",
           "parallel.global_batch": MICRO_BATCHES * dp}
    if layers is not None:
        out["model.layers"] = layers
    return out


class Timed:
    """Wraps a cost callable and accumulates the seconds spent in it."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args):
        t0 = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0


def one_step(nodes: int, layers: int | None = None, out_dir: Path | None = None, html: bool = False) -> dict:
    """Time every stage of one simulated step; returns seconds per stage and sizes."""
    from meshsim.sim.cost.flops import model_flops_per_step
    from meshsim.sim.cost.memory import memory_per_gpu
    from meshsim.sim.schedule.builder import build_schedule

    cpu0 = time.process_time()
    t = {"start": time.perf_counter()}
    scenario, source = load_scenario(DEFAULT_SCENARIO)
    rs = resolve(with_overrides(scenario, overrides(nodes, layers), source), source)
    t["resolve"] = time.perf_counter()
    schedule = build_schedule(rs)
    t["build"] = time.perf_counter()
    coster, compute = CollectiveCoster(rs), compute_fn(rs)
    timed_coll, timed_comp = Timed(coster), Timed(compute)
    log = engine.run(schedule, simulated_ranks(rs, False), timed_comp, timed_coll, rs.group)
    t["engine"] = time.perf_counter()
    result = build_result(rs, schedule, log, memory=memory_per_gpu(rs), model_flops=model_flops_per_step(rs),
                          collectives=coster.chosen(schedule))
    t["results"] = time.perf_counter()
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="meshsim-bench-"))
    write_results_json(result, out_dir / "results.json")
    write_trace(out_dir / "trace.json", log.events, result.critical_path)
    t["write"] = time.perf_counter()
    cpu_s = time.process_time() - cpu0
    if html:
        write_timeline(out_dir / "timeline.html", log.events, result.critical_path)
    t["html"] = time.perf_counter()
    stages = ["start", "resolve", "build", "engine", "results", "write", "html"]
    secs = {b: t[b] - t[a] for a, b in zip(stages, stages[1:], strict=False)}
    secs["costs"] = timed_coll.seconds + timed_comp.seconds
    secs["total"] = t["write"] - t["start"]
    secs["cpu"] = cpu_s
    return {"gpus": rs.gpus, "layers": rs.scenario.model.layers, "ops": len(schedule.ops),
            "events": len(log.events), "step_ms": result.step_time_s * 1e3, "mfu": result.mfu, **secs}


def show(label: str, r: dict) -> None:
    print(f"{label:<22} gpus {r['gpus']:>5} layers {r['layers']:>3} events {r['events']:>6} | total "
          f"{r['total']:.3f} s wall ({r['cpu']:.3f} s CPU) = resolve {r['resolve']:.3f} + build {r['build']:.3f} + engine {r['engine']:.3f} "
          f"(of which costs {r['costs']:.3f}) + results {r['results']:.3f} + write {r['write']:.3f} | "
          f"{r['events'] / r['engine']:,.0f} events/s in the engine, {r['events'] / r['total']:,.0f} end to end"
          f" | html {r['html']:.3f} s | step {r['step_ms']:.1f} ms, MFU {100 * r['mfu']:.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="cProfile the 1024-GPU step (top 25 by own time)")
    ap.add_argument("--quick", action="store_true", help="only the 1024-GPU step")
    args = ap.parse_args()
    one_step(8, 2)  # warm imports and module-level caches outside the measurements
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(one_step, 128)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    show("70B, 1024 GPUs (cold)", one_step(128, html=True))
    show("70B, 1024 GPUs (warm)", one_step(128))
    if args.quick:
        return
    for layers in (20, 40, 80):
        show(f"layers {layers}", one_step(128, layers))
    for nodes in (8, 32, 128):
        show(f"gpus {nodes * 8}", one_step(nodes))


if __name__ == "__main__":
    main()
