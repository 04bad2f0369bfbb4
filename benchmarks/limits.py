"""Inputs at the documented limits (sim/core/limits.py, README "Limits"): each finishes in under a minute
and (at the op limit) about 1.1 GB on the project machine, and one step past the limit is refused at once. Prints wall time, CPU
time and peak RSS of each whole `meshsim` process (os.wait4), and its exit status (2 = refused).

Cases at the limits:
- passes-full: 80 layers x 125 micro-batches simulated whole (--full): op bound 496,944;
- cp-ring-500: 500 layers, a 64-rank CP p2p ring, 5 micro-batches, --full: op bound 1,132,560 (MAX_SIMULATED_OPS);
- pipeline-48: 48 stages of 1 layer, 208 micro-batches, --full: 9,984 layer passes over 48 simulated ranks;
- node-576: one custom node of 576 GPUs (MAX_NODE_GPUS) on one switch, dp 576 (a 576-rank ring and tree);
- alltoall-512: `meshsim collective --op all_to_all` over 512 ranks (MAX_ALL_TO_ALL_RANKS), one size;
- moe-ep512: an MoE step whose expert all-to-all spans 512 ranks;
- allreduce-16384: `meshsim collective --op all_reduce` over 16,384 GPUs (MAX_GPUS), 24 sizes;
- sizes-905-plot: `meshsim collective` over 16,384 GPUs, 905 sizes (1 B..1 TiB by 1.02816) with --plot
  (issue 44: past 120 s; the group checked, split and its candidates chosen once for all sizes, link
  loads not computed: 16.0 s CPU, 317 MB);
and past them: cp-ring-500 x 10 micro-batches (issue 44: 99 s and 2 GB before the op bound; refused after
its steady-state try, ~6 s and ~0.9 GB), node-1300 and alltoall-1024 (refused at once), and pipeline-100
(100 stages x 1,000 micro-batches: refused when the whole step must be simulated; its steady state is
proven, so it runs, in ~4 s).

    python benchmarks/limits.py [--cases node-576,alltoall-512]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

MODEL = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "mlp": "swiglu", "ffn_hidden": 28672,
         "seq_len": 4096, "vocab": 32000}


def _scenario(folder: Path, name: str, model: dict, topology: dict, parallel: dict) -> str:
    path = folder / f"scenario-{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "model": model, "topology": topology, "parallel": parallel}))
    return str(path)


def _node(folder: Path, gpus: int) -> str:
    devices = [{"name": f"g{i}", "kind": "gpu"} for i in range(gpus)] + [{"name": "sw", "kind": "nvswitch"}]
    links = [{"src": f"g{i}", "dst": "sw", "bw_gbps": 450, "latency_us": 0.5, "kind": "nvlink"} for i in range(gpus)]
    (folder / f"node{gpus}.yaml").write_text(yaml.safe_dump({"name": f"node{gpus}", "gpu": "h100-sxm",
                                                             "gpus_per_node": gpus, "devices": devices, "links": links}))
    return f"node{gpus}.yaml"


def cases(folder: Path) -> dict[str, list[str]]:
    """Case name -> meshsim arguments."""
    small = {**MODEL, "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336}
    moe = {**small, "moe": {"experts": 512, "top_k": 8, "ffn_hidden": 768}}
    cp_model = {"layers": 500, "hidden": 256, "heads": 4, "seq_len": 1024, "vocab": 1024}
    run = ["run", "--outputs", "none"]
    return {
        "passes-full": [*run, "--full", _scenario(folder, "passes", MODEL, {"preset": "dgx-h100", "nodes": 1},
                                                  {"tp": 8, "sp": True, "micro_batch": 1, "global_batch": 125})],
        "pipeline-48": [*run, "--full", _scenario(folder, "pp48", {**small, "layers": 48}, {"preset": "dgx-h100", "nodes": 6},
                                                  {"tp": 1, "pp": 48, "micro_batch": 1, "global_batch": 208})],
        "node-576": [*run, _scenario(folder, "node576", small, {"file": _node(folder, 576)},
                                     {"tp": 1, "micro_batch": 1, "global_batch": 576})],
        "alltoall-512": ["collective", "--op", "all_to_all", "--nodes", "64", "--min-bytes", "16M", "--max-bytes", "16M"],
        "moe-ep512": [*run, _scenario(folder, "ep512", moe, {"preset": "dgx-h100", "nodes": 64},
                                      {"tp": 1, "ep": 512, "micro_batch": 1, "global_batch": 512})],
        "allreduce-16384": ["collective", "--op", "all_reduce", "--nodes", "2048"],
        "cp-ring-500": [*run, "--full", _scenario(folder, "cp64", cp_model, {"preset": "dgx-h100", "nodes": 8},
                                                  {"tp": 1, "cp": 64, "micro_batch": 1, "global_batch": 5})],
        "cp-ring-500x10 (refused)": [*run, _scenario(folder, "cp64x10", cp_model, {"preset": "dgx-h100", "nodes": 8},
                                                     {"tp": 1, "cp": 64, "micro_batch": 1, "global_batch": 10})],
        "sizes-905-plot": ["collective", "--nodes", "2048", "--min-bytes", "1", "--max-bytes", "1T", "--step-factor",
                           "1.02816", "--plot", str(folder / "busbw.html")],
        "pipeline-100 (refused)": [*run, _scenario(folder, "pp100", {**small, "layers": 100}, {"preset": "dgx-h100", "nodes": 13},
                                                   {"tp": 1, "pp": 100, "gpus": 100, "micro_batch": 1, "global_batch": 1000})],
        "node-1300 (refused)": [*run, _scenario(folder, "node1300", small, {"file": _node(folder, 1300)},
                                                {"tp": 1, "micro_batch": 1, "global_batch": 1300})],
        "alltoall-1024 (refused)": ["collective", "--op", "all_to_all", "--nodes", "128"],
    }


def measure(args: list[str], cwd: Path) -> tuple[int, float, float, float]:
    """(exit status, wall s, CPU s, peak RSS MB) of one `meshsim ARGS` process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "meshsim.sim.cli.main", *args], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshsim-limits-") as tmp:
        folder = Path(tmp)
        table = cases(folder)
        wanted = args.cases.split(",") if args.cases else list(table)
        print(f"{'case':<26} {'exit':>4} {'wall s':>8} {'CPU s':>8} {'peak MB':>8}")
        for name in wanted:
            code, wall, cpu, rss = measure(table[name], folder)
            print(f"{name:<26} {code:>4} {wall:>8.2f} {cpu:>8.2f} {rss:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
