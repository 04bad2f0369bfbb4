"""Wall time and peak memory of whole `meshsim run` processes (what a user waits for), median of N runs.

Cases (issue 10's targets):
- default: the built-in default scenario (Llama-2 70B, tp 8 + SP, 64 H100), target < 0.6 s;
- gpt3-gb1536-overlap: GPT-3 175B on 128 A100 (gpt3-175b-a100-16node) with GPT-3's published global
  batch of 1,536 sequences (96 micro-batches per replica) and tp_comm_overlap on, target < 1.5 s, < 300 MB;
- deepseek-v3: the built-in deepseek-v3-h100-ep64 (Megatron-Bridge's H100 recipe, 1,024 GPUs, 256 micro-batches
  per replica), target <= 3x the default case (issue 19);
- llama70b-<gpus>: the default scenario on 64 ... 16,384 H100 (tp 8, dp = gpus / 8) with 8 micro-batches
  per replica (global batch = 8 x dp), target < 1 s at 16,384 and flat within 20% from 64;
- llama31-405b: the built-in llama31-405b-h100-tp8-pp8-cp2 (512 H100, TP 8 + SP, PP 8 x VP 8, CP 2, FP8
  delayed, 256 micro-batches per replica), target <= 3x the default with RSS <= 300 MB (issue 40).

Each case runs `python -m meshsim.sim.cli.main run SCENARIO --out TMP` in a fresh process; its CPU time and
peak RSS come from os.wait4 (CPU time is the figure to trust on a shared machine, where wall time also
counts other people's work; on a busy machine the CPU minimum is the steadiest figure). Extra arguments
after `--` go to every `meshsim run` (e.g. `-- --full`, `-- --outputs none`).

`--baseline DIR` also times a second source tree (a checkout of another commit, e.g. `git archive main |
tar -x -C DIR`) in the same command, its runs interleaved with this tree's so both see the same machine
load: the child imports `meshsim` from DIR through a folder of links put first on PYTHONPATH. Both trees
are byte-compiled first and the children may write bytecode (a user's installed meshsim has it; without
it every run would recompile ~450 modules), so start-up is measured as a user meets it. The line after
each pair gives the CPU minimum ratio (this tree / baseline), and every case's ratio to the default
case of the same tree where the default is among the cases.

`--startup` prints where the default run's start-up goes instead (issue 40's "lean start-up"), each part
the CPU minimum over --runs fresh processes of each tree: the bare interpreter (`python -c pass`), the
third-party floor (numpy, pydantic with one model built, PyYAML, typer, rich's console and table: what the
run imports whoever writes it), everything `meshsim run` imports (`import meshsim.sim.cli.run`: the floor
plus meshsim's own modules), both with the garbage collector off as `meshsim` imports its command, and the
whole `meshsim run --outputs none` and `meshsim run` (all outputs). The differences are meshsim's own
modules (imports minus floor) and the work (run minus imports).

    python benchmarks/run.py [--runs 5] [--cases default,gpt3-gb1536-overlap] [--baseline DIR] [-- --full]
    python benchmarks/run.py --startup [--runs 9] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from meshsim.scenarios.library import DEFAULT_SCENARIO, builtin_scenarios

LLAMA_GPUS = (64, 1024, 16384)
PACKAGE_DIRS = ("sim", "topologies", "scenarios")  # the meshsim subpackages a `meshsim run` imports


def _variant(name: str, parallel: dict, topology: dict, out: Path) -> str:
    data = yaml.safe_load(Path(builtin_scenarios()[name]).read_text())
    data["parallel"].update(parallel)
    data["topology"].update(topology)
    data.pop("sweep", None)
    path = out / f"{name}-{abs(hash(str(parallel) + str(topology)))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def cases(tmp: Path) -> dict[str, str]:
    out = {"default": DEFAULT_SCENARIO,
           "llama3-8b-h100-fp8": "llama3-8b-h100-fp8",  # issue 18: FP8 library scenario, <= 1.5x the default
           "gpt3-gb1536-overlap": _variant("gpt3-175b-a100-16node",
                                           {"global_batch": 1536, "tp_comm_overlap": True}, {}, tmp),
           # issue 9 item 10: GPT-3 175B-class step, tp 8, pp 8, v 12 (one layer per chunk), 1,024 A100
           "gpt3-pp8-v12-1024gpu": _variant("gpt3-175b-a100-pp8", {"vp": 12, "global_batch": 1536},
                                            {"nodes": 128}, tmp),
           # issue 19: DeepSeek-V3 with its H100 recipe's layout (1,024 GPUs), target <= 3x the default's cost
           "deepseek-v3": "deepseek-v3-h100-ep64",
           # DeepSeek-V3's GB300 MXFP8 recipe (256 GPUs, pp 2 x vp 8, MTP, EP overlap)
           "deepseek-v3-gb300": "deepseek-v3-gb300-ep32-mxfp8"}
    # issue 18: the context-parallel library scenarios (target: at most 1.5x the default's cost)
    out["llama3-70b-cp2"] = "llama3-70b-h100-cp2"
    out["llama3-8b-128k-cp4"] = "llama3-8b-128k-h100-cp4"
    # issue 19: the MoE library scenarios on one and two DGX H100
    out["mixtral-ep8"] = "mixtral-8x7b-h100-ep8"
    out["qwen3-ep16"] = "qwen3-30b-a3b-h100-ep16"
    for gpus in LLAMA_GPUS:
        out[f"llama70b-{gpus}"] = _variant(DEFAULT_SCENARIO, {"global_batch": 8 * gpus // 8},
                                           {"nodes": gpus // 8}, tmp)
    # issue 40: Llama 3.1 405B, TP 8 + SP, PP 8 x VP 8, CP 2, FP8 delayed, on 512 H100 (<= 3x, <= 300 MB)
    # (its file, not its name: a --baseline tree older than the scenario runs the same file)
    out["llama31-405b"] = str(builtin_scenarios()["llama31-405b-h100-tp8-pp8-cp2"])
    return out


def tree_env(tree: Path | None, tmp: Path) -> dict[str, str]:
    """The environment of a child that runs `tree`'s meshsim (None: the installed one, this tree)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_NUM_THREADS"] = "1"
    if tree is not None:
        shim = tmp / "baseline-path" / "meshsim"
        shim.mkdir(parents=True, exist_ok=True)
        for name in (*PACKAGE_DIRS, "validate"):
            link = shim / name
            if not link.exists():
                link.symlink_to(tree / name, target_is_directory=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim.parent), env.get("PYTHONPATH")) if p)
    return env


def byte_compile(tree: Path) -> None:
    """Write the bytecode of a tree's packages once, so no timed run pays for compiling them."""
    for name in PACKAGE_DIRS:
        compileall.compile_dir(tree / name, quiet=1)


def core_warning(tree: Path, label: str) -> str | None:
    """A line saying `tree` has the compiled engine core's source but not the built extension (a `git archive`
    of a commit has no build outputs): its `meshsim run` then runs the Python core, and a comparison with a
    built tree measures the two cores, not the change. None when built or when the tree has no such core."""
    engine = tree / "sim" / "engine"
    if not (engine / "_core.pyx").is_file() or any(engine.glob("_core.*.so")) or any(engine.glob("_core.*.pyd")):
        return None
    return (f"warning: {label} ({tree}) has no built compiled core: its runs use the Python core. Copy "
            "sim/engine/_core*.so and _rows*.so there from a tree built from the same .pyx files, or build "
            "the extensions in that tree")


def run_once(scenario: str, extra: list[str], out: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one `meshsim run` process."""
    cmd = [sys.executable, "-m", "meshsim.sim.cli.main", "run", scenario, "--out", str(out), *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 3):  # 3: does not fit in GPU memory, still simulated
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.read().decode()[-2000:]}")
    return wall_s, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def summary(name: str, runs: list[tuple[float, float, float]], out: Path, extra: list[str]) -> str:
    walls = sorted(w for w, _, _ in runs)
    cpus = sorted(c for _, c, _ in runs)
    written = out.iterdir() if out.is_dir() else ()  # --outputs none writes nothing
    size_mb = sum(f.stat().st_size for f in written) / 1e6
    return (f"{name:<22} wall median {statistics.median(walls):6.2f} s (min {walls[0]:.2f}, max {walls[-1]:.2f}, "
            f"{len(runs)} runs), CPU median {statistics.median(cpus):6.2f} s (min {cpus[0]:.2f}), peak RSS "
            f"{max(r for _, _, r in runs):6.0f} MB, outputs {size_mb:6.1f} MB  {' '.join(extra)}")


FLOOR_CODE = ("import gc; gc.disable()\n"  # as `meshsim` imports its command (sim/cli/main.py)
              "import numpy, yaml, typer, rich.console, rich.table\n"
              "from pydantic import BaseModel\n"
              "class Probe(BaseModel):\n    x: int\n"
              "Probe(x=1)\n")
STARTUP_PARTS = {  # name: the command's arguments after the interpreter
    "interpreter": ["-c", "pass"],
    "third-party floor": ["-c", FLOOR_CODE],
    "meshsim run imports": ["-c", "import gc; gc.disable(); import meshsim.sim.cli.run"],
}


def cpu_of(args: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one `python ARGS` process."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 3):
        raise SystemExit(f"python {' '.join(args)[:200]} failed: {proc.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def startup(trees: dict[str, Path | None], runs: int, tmp: Path, envs: dict[str, dict[str, str]]) -> None:
    """The start-up split of the default run, CPU minimum of `runs` interleaved fresh processes per tree."""
    parts = dict(STARTUP_PARTS)
    for level in ("none", "all"):
        parts[f"meshsim run --outputs {level}"] = ["-m", "meshsim.sim.cli.main", "run", "--out",
                                                   str(tmp / "startup"), "--outputs", level]
    best: dict[tuple[str, str], float] = {}
    for _ in range(runs):
        for name, args in parts.items():
            for label in trees:
                cpu = cpu_of(args, envs[label])
                best[label, name] = min(cpu, best.get((label, name), cpu))
    for label in trees:
        tree = label.strip() or "this tree"
        for name in parts:
            print(f"{tree:<10} {name:<28} CPU min {best[label, name] * 1e3:6.0f} ms ({runs} runs)", flush=True)
        own = best[label, "meshsim run imports"] - best[label, "third-party floor"]
        work = best[label, "meshsim run --outputs all"] - best[label, "meshsim run imports"]
        print(f"{tree:<10} meshsim's own modules {own * 1e3:.0f} ms; the run's work after its imports "
              f"{work * 1e3:.0f} ms (all outputs)", flush=True)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another source tree (with sim/, topologies/, scenarios/) timed in the same command")
    ap.add_argument("--startup", action="store_true", help="the default run's start-up split (see above)")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    here = Path(__file__).resolve().parent.parent
    trees = {"": None} if args.baseline is None else {"": None, "baseline ": args.baseline.resolve()}
    with tempfile.TemporaryDirectory(prefix="meshsim-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        chosen = cases(tmp)
        wanted = [c for c in args.cases.split(",") if c] or list(chosen)
        unknown = [c for c in wanted if c not in chosen]
        if unknown:
            raise SystemExit(f"--cases: unknown {', '.join(unknown)}; the cases are {', '.join(chosen)}")
        envs = {}
        for label, tree in trees.items():
            byte_compile(tree or here)
            envs[label] = tree_env(tree, tmp)
            warning = core_warning(tree or here, label.strip() or "this tree")
            if warning:
                print(warning, file=sys.stderr, flush=True)
        if args.startup:
            startup(trees, args.runs, tmp, envs)
            return
        default_cpu: dict[str, float] = {}
        for name in wanted:
            runs: dict[str, list] = {label: [] for label in trees}
            for _ in range(args.runs):  # interleaved: both trees see the same load
                for label in trees:
                    runs[label].append(run_once(chosen[name], extra, tmp / (label.strip() or "this") / name,
                                                envs[label]))
            best = {}
            for label in trees:
                best[label] = min(c for _, c, _ in runs[label])
                if name == "default":
                    default_cpu[label] = best[label]
                ratio = f", {best[label] / default_cpu[label]:.2f}x the default" if label in default_cpu else ""
                print(summary(label + name, runs[label], tmp / (label.strip() or "this") / name, extra) + ratio,
                      flush=True)
            if args.baseline is not None:
                print(f"{'':<22} CPU min this tree / baseline: {best[''] / best['baseline ']:.3f}", flush=True)


if __name__ == "__main__":
    main()
