"""`meshsim validate` (numerics check, or simulated-vs-measured cross-check) and `meshsim calibrate`.

sim/cli/main.py imports this module to call `register(app)` for these commands and for `meshsim --help`, so
torch (and everything that imports it) is imported only inside the command functions.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from pathlib import Path

import typer

from meshsim.scenarios.load import load_scenario, resolve
from meshsim.scenarios.profile import save_profile
from meshsim.sim.cli.trace import read_traces
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.interrupt import Interrupted, signals_raise
from meshsim.sim.core.outfiles import check_output_dir, check_output_file, check_own_file, output_folder_name
from meshsim.sim.core.text import echo_plain
from meshsim.sim.core.userio import dumps_finite, load_json
from meshsim.sim.kineto.calibrate import profile_from_trace
from meshsim.sim.kineto.ranks import summaries
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

DEFAULT_CALIBRATION_SCENARIO = "tiny-2gpu"
MAX_LOCAL_NPROC = 64  # processes spawned on this machine (more: torchrun / SLURM, docs/validate.md)
MAX_REPEATS = 1_000  # timed steps of a cross-check
DEFAULT_OUT_ROOT = Path("meshsim-out")


def _backend(backend: str | None, local: bool = True) -> str:
    """The backend; `local` (processes spawned here) also checks that CUDA devices exist for nccl."""
    import torch  # meshsim[validate] extra: optional, heavy

    if backend is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise UserError("--backend", backend, "use gloo (CPU) or nccl (CUDA GPUs)")
    if local and backend == "nccl" and torch.cuda.device_count() == 0:
        raise UserError("--backend", backend, "use --backend gloo on a machine without CUDA GPUs",
                        problem="No CUDA device is visible")
    return backend


def _nproc(nproc: int, backend: str, local: bool = True) -> int:
    if nproc < 1:
        raise UserError("--nproc", nproc, "use 1 or more processes")
    if local and nproc > MAX_LOCAL_NPROC:
        raise UserError("--nproc", nproc, f"use at most {MAX_LOCAL_NPROC} local processes; for more launch with "
                        "torchrun (--dump-payload, docs/validate.md)")
    if local and backend == "nccl":
        import torch  # meshsim[validate] extra: optional, heavy

        if nproc > torch.cuda.device_count():
            raise UserError("--nproc", nproc, f"use at most {torch.cuda.device_count()} (one process per GPU); "
                            "for more GPUs launch with torchrun (docs/validate.md)")
    return nproc


def _check_backend(backend: str | None) -> None:
    """--check runs the numerics model on CPU tensors with gloo, on any machine and any nproc; an explicit
    --backend nccl is refused rather than silently ignored."""
    if backend is None or backend == "gloo":
        return
    _backend(backend, local=False)  # an unknown name gets the usual message
    raise UserError("--backend", backend, "drop --backend (or give gloo): --check always runs on CPU with gloo",
                    problem="--check does not use NCCL")


def _results_backend(per_rank: list, backend: str | None, nproc: int) -> str:
    """The backend the workers measured on (timing and calibrate results carry it; older results fall back
    to --backend or the default), so the parent rebuilds the shrunk schedule the workers ran.
    A different --backend, or an --nproc other than the results' rank count, is refused."""
    if len(per_rank) != nproc:
        raise UserError("--nproc", nproc, f"use --nproc {len(per_rank)}, the number of ranks in the results")
    measured = per_rank[0].get("backend") if per_rank and isinstance(per_rank[0], dict) else None
    if measured is None:
        return _backend(backend, local=False)
    if backend is not None and backend != measured:
        raise UserError("--backend", backend, f"drop --backend: the results were measured with {measured}",
                        problem="The results were measured with another backend")
    return measured


def _specs(variants: str | None) -> list[str] | None:
    return [v.strip() for v in variants.split(",") if v.strip()] if variants else None


def _exit(code: int) -> None:
    """Exit with `code` when non-zero. SystemExit, not typer.Exit: sim/cli/main.py's main() runs the app with
    standalone_mode=False, where click returns typer.Exit's code and main() drops it."""
    if code:
        raise SystemExit(code)


RESULTS_FIX = "give the results.json that rank 0 of `python -m meshsim.validate.launch.launch ... --out DIR` wrote into DIR"


def _results(path: Path) -> list:
    if not path.is_file():
        raise UserError("--from-results", str(path), RESULTS_FIX, problem="No such file")
    data = load_json(path, field="--from-results", fix=RESULTS_FIX)
    if not isinstance(data, list) or not data or not all(isinstance(entry, dict | list) for entry in data):
        raise UserError("--from-results", str(path), RESULTS_FIX,
                        problem="Expected a list with one entry (an object, or a list for --check) per rank")
    return data


@contextlib.contextmanager
def _reading_results(path: Path | None) -> Iterator[None]:
    """Turn a malformed --from-results file (a rank's entry missing a key, a string where a list of
    timings belongs, ranks of another payload) into one UserError naming it; no-op without a file."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        if path is None:
            raise
        detail = f"{type(exc).__name__}: {exc}"[:120]
        raise UserError("--from-results", str(path), RESULTS_FIX + " for this scenario and --nproc",
                        problem=f"Not the results of this payload ({detail})") from None


# the files validate/crosscheck/crosscheck.py run_crosscheck / finish write into --out (that module imports
# torch, so the names are listed here for the check that runs before any work)
CROSSCHECK_FILES = ("profile.yaml", "trace_measured.json", "trace_merged.json")


def _default_out(name: str, suffix: str = "") -> Path:
    """meshsim-out/<the scenario name as one safe folder name><suffix>: never a path outside meshsim-out/."""
    return DEFAULT_OUT_ROOT / output_folder_name(name, suffix)


def _dump(path: Path, task: str, payload: dict, nproc: int, backend: str) -> None:
    """Write the payload with the backend it was shrunk for; the torchrun worker runs on that backend
    (validate/launch/launch.py payload_backend), so the results match the schedule rebuilt from them."""
    check_output_file("--dump-payload", path)
    path.write_text(dumps_finite({**payload, "backend": backend}))
    echo_plain(f"payload: {path} (backend {backend})\nrun it on {nproc} processes, e.g.\n  torchrun "
               f"--nproc-per-node {nproc} -m meshsim.validate.launch.launch {task} {path} --out RESULTS_DIR\nthen "
               "repeat this command with --from-results RESULTS_DIR/results.json (docs/validate.md: "
               "multi-node, SLURM)")


def _check(scenario: str, nproc: int, variants: str | None, dtype: str, ops: bool, dump: Path | None,
           results_path: Path | None) -> int:
    # meshsim[validate] extra: these modules import torch
    from meshsim.validate.launch.launch import launch
    from meshsim.validate.numerics.check import merge, numerics_payload
    from meshsim.validate.numerics.fp8_emulation import check_fp8_run, without_fp8  # torch
    from meshsim.validate.printing import print_numerics  # torch, via validate

    sc, source = load_scenario(scenario)
    check_output_file("--dump-payload", dump)
    fp8_ok = True
    if sc.run.fp8_on:  # the gloo stack is 16-bit: FP8 numerics are emulated apart, the TP/SP step in 16 bit
        fp8_ok, lines = check_fp8_run(sc.run)
        typer.echo("\n".join(lines) + "\nthe TP/SP step below runs with run.fp8 off (16-bit stack)")
        sc = without_fp8(sc)
    variants_, payload = numerics_payload(sc, source, nproc, _specs(variants), dtype=dtype)
    _moe_note(sc)
    _cp_note(sc)
    if dump is not None:
        _dump(dump, "numerics", payload, nproc, "gloo")
        return 0
    per_rank = _results(results_path) if results_path else launch("numerics", payload, nproc, timeout_s=120.0)
    with _reading_results(results_path):
        merged = merge(variants_, per_rank, source)
    code = print_numerics(merged, nproc, dtype, compare_ops=ops)
    return code or (0 if fp8_ok else 1)


def _moe_note(sc) -> None:
    """What of a scenario --check does not run for real (validate/launch/shrink.py): an MoE scenario's
    dispatcher and token dropping; the optimizer section and the recompute modules (numerics checks the
    forward and backward, not the optimizer; recompute runs the variants' own settings)."""
    moe, p = sc.model.moe, sc.parallel
    left = ([f"the {p.moe_dispatcher} dispatcher (its layers run with alltoall)"]
            if moe is not None and p.moe_dispatcher != "alltoall" else [])
    left += ["token dropping (routing runs dropless)"] if moe is not None and moe.capacity_factor is not None else []
    left += ["parallel.recompute_modules"] if p.recompute_modules is not None else []
    left += ["the optimizer section"] if sc.optimizer.model_dump(exclude_defaults=True) else []
    if left:
        echo_plain(f"simulated but not run for real: {'; '.join(left)}")


def _cp_note(sc) -> None:
    """Context parallelism is not part of the whole-model run (validate/launch/shrink.py)."""
    if sc.parallel.cp > 1:
        typer.echo(f"CP: the whole-model run uses cp = 1; the {sc.parallel.cp_comm} context-parallel attention "
                   "runs for real in the cp_numerics check (validate/numerics/cp_check.py, tests/test_validate_cp.py)")


def validate_command(
    scenario: str = typer.Argument(..., help="scenario YAML path or built-in name"),
    check: bool = typer.Option(False, "--check", help="numerics only: every variant's outputs and gradients "
                               "against a single process, and its collectives against the schedule"),
    nproc: int = typer.Option(2, "--nproc", help="local processes (world size)"),
    variants: str = typer.Option(None, "--variants", help="with --check: comma-separated variants, each "
                                 "modifiers joined by '+', e.g. 'sp+swiglu+gqa+full,tp+gelu' (default: the "
                                 "matrix tp|sp x gelu|swiglu x mha|gqa x none|selective|full)"),
    dtype: str = typer.Option("float32", "--dtype", help="with --check: float32, float64 or bfloat16"),
    ops: bool = typer.Option(True, "--ops/--no-ops", help="with --check: fail when counted collectives differ "
                             "from the schedule's"),
    profile: Path = typer.Option(None, "--profile", help="hardware profile to simulate with (default: "
                                 "calibrate first, into OUT/profile.yaml)"),
    tolerance: float = typer.Option(None, "--tolerance", help="exit 1 when |step-time error| exceeds PCT"),
    json_path: Path = typer.Option(None, "--json", help="write {numerics_ok, simulated_step_s, "
                                   "measured_step_s, error_pct, categories, critical_path_agreement}"),
    out: Path = typer.Option(None, "--out", help="output directory (default meshsim-out/<scenario>-validate): "
                             "profile.yaml, trace_measured.json, trace_merged.json"),
    backend: str = typer.Option(None, "--backend", help="gloo or nccl (default: nccl when CUDA is available; "
                                "with --from-results, the results' own); --check always runs on CPU with gloo "
                                "and refuses nccl"),
    repeats: int = typer.Option(5, "--repeats", help="timed steps (after 2 warm-up steps)"),
    dump_payload: Path = typer.Option(None, "--dump-payload", help="write the workers' payload for torchrun / "
                                      "SLURM and exit (docs/validate.md)"),
    from_results: Path = typer.Option(None, "--from-results", help="report from the results.json of a torchrun "
                                      "run of the dumped payload instead of spawning processes"),
    trace: Path = typer.Option(None, "--trace", help="also record PyTorch-profiler traces of 3 more "
                               "as-scheduled steps into this folder (rank<R>.json) with the shrunk "
                               "scenario.yaml they ran (meshsim trace summary / compare --trace / calibrate "
                               "--from-trace read them)"),
) -> None:
    """Run the scenario's TP/SP step for real: numerics (--check), or simulated vs measured step time."""
    if check:
        _check_backend(backend)
        _exit(_check(scenario, _nproc(nproc, "gloo"), variants, dtype, ops, dump_payload, from_results))
        return
    local = dump_payload is None and from_results is None
    per_rank = _results(from_results) if from_results is not None else None
    be = _results_backend(per_rank, backend, nproc) if per_rank is not None else _backend(backend, local)
    n = _nproc(nproc, be, local)
    check_output_dir("--trace", trace)
    if trace is not None and not local:
        raise UserError("--trace", str(trace), "drop --trace with --dump-payload / --from-results (the traces are "
                        "recorded by processes this command spawns)")
    _exit(_crosscheck(scenario, n, be, profile, tolerance, json_path, out, repeats, dump_payload, per_rank, trace,
                      from_results))


def _crosscheck(scenario: str, n: int, be: str, profile: Path | None, tolerance: float | None,
                json_path: Path | None, out: Path | None, repeats: int, dump: Path | None,
                per_rank: list | None, trace: Path | None = None, results_path: Path | None = None) -> int:
    # meshsim[validate] extra: these modules import torch
    from meshsim.validate.crosscheck.crosscheck import finish, run_crosscheck, timing_payload
    from meshsim.validate.printing import print_crosscheck
    from meshsim.validate.timing.measured import reduce_run, stage_schedules_of

    sc, source = load_scenario(scenario)
    if profile is not None and not profile.is_file():
        raise UserError("--profile", str(profile), "give a profile YAML written by meshsim calibrate",
                        problem="No such file")
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise UserError("--tolerance", tolerance, "give a finite percentage >= 0, e.g. 25")
    if not 1 <= repeats <= MAX_REPEATS:
        raise UserError("--repeats", repeats, f"use 1 to {MAX_REPEATS} timed steps")
    out_dir = out or _default_out(sc.name, "-validate")
    check_output_dir("--out", out_dir, CROSSCHECK_FILES)
    check_output_file("--json", json_path)
    check_output_file("--dump-payload", dump)
    if dump is not None:
        _dump(dump, "timing", timing_payload(sc, source, n, be, repeats=repeats)[2], n, be)
        return 0
    if per_rank is not None:
        if profile is None:
            raise UserError("--profile", None, "with --from-results give the profile to simulate with "
                            "(meshsim calibrate ... --from-results writes one)")
        shrunk, variants_, _ = timing_payload(sc, source, n, be, repeats=repeats)
        with _reading_results(results_path):
            measured = reduce_run(stage_schedules_of(shrunk, source), per_rank)
            result = finish(shrunk, source, str(profile), variants_, measured, out_dir)
    else:
        result = run_crosscheck(sc, source, n, profile=str(profile) if profile else None, out_dir=out_dir,
                                backend=be, repeats=repeats, trace_dir=trace)
        if trace is not None:
            echo_plain(f"traces: {trace} (meshsim trace summary {trace}; meshsim compare {trace / 'scenario.yaml'} "
                       f"--trace {trace})")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(dumps_finite(result.report, indent=2))
    return print_crosscheck(result.report, out_dir, tolerance)


def calibrate_command(
    scenario: str = typer.Argument(None, help=f"scenario whose schedule's works are measured (default "
                                   f"{DEFAULT_CALIBRATION_SCENARIO}); shrunk to nproc processes"),
    nproc: int = typer.Option(2, "--nproc", help="local processes (world size)"),
    backend: str = typer.Option(None, "--backend", help="gloo or nccl (default: nccl when CUDA is available; "
                                "with --from-results, the results' own)"),
    out: Path = typer.Option(None, "--out", help="profile YAML to write (default meshsim-out/<scenario>/"
                             "profile.yaml); name it in a scenario with hardware: {profile: PATH}"),
    dump_payload: Path = typer.Option(None, "--dump-payload", help="write the workers' payload for torchrun / "
                                      "SLURM and exit (docs/validate.md)"),
    from_results: Path = typer.Option(None, "--from-results", help="build the profile from the results.json of "
                                      "a torchrun run of the dumped payload"),
    from_trace: list[Path] = typer.Option(None, "--from-trace", help="learn the profile from PyTorch-profiler "
                                          "traces of the scenario's own step (files or folders, one file per "
                                          "rank; repeatable); no processes are run, torch is not needed"),
    scenario_opt: str = typer.Option(None, "--scenario", help="the scenario the trace ran (same as the argument)"),
    step: int = typer.Option(None, "--step", help="with --from-trace: only ProfilerStep#STEP"),
) -> None:
    """Measure GEMMs, attention, memory-bound kernels and collectives; write a hardware profile."""
    if from_trace:
        _calibrate_from_trace(from_trace, scenario_opt or scenario, out, step)
        return
    # meshsim[validate] extra: these modules import torch
    from meshsim.validate.calibrate.calibration import build_profile, calibrate, calibration_payload
    from meshsim.validate.printing import print_profile
    from meshsim.validate.timing.measured import schedule_of

    local = dump_payload is None and from_results is None
    per_rank = _results(from_results) if from_results is not None else None
    be = _results_backend(per_rank, backend, nproc) if per_rank is not None else _backend(backend, local)
    n = _nproc(nproc, be, local)
    sc, source = load_scenario(scenario or DEFAULT_CALIBRATION_SCENARIO)
    shrunk, payload = calibration_payload(sc, source, n, be)
    path = out or _default_out(sc.name) / "profile.yaml"
    check_output_file("--out", path)  # before measuring: a bad path must not throw measurements away
    check_own_file("--out", path)  # never through a link, even a dangling one
    check_output_file("--dump-payload", dump_payload)
    if dump_payload is not None:
        _dump(dump_payload, "calibrate", payload, n, be)
        return
    if per_rank is not None:
        with _reading_results(from_results):
            profile = build_profile(schedule_of(shrunk, source), per_rank, f"{shrunk.name}-{be}-{n}proc", be, sc.name)
        save_profile(profile, path)
    else:
        profile = calibrate(shrunk, source, n, backend=be, out=path)
    print_profile(profile, path)


def _calibrate_from_trace(paths: list[Path], scenario: str | None, out: Path | None, step: int | None) -> None:
    """`calibrate --from-trace`: the profile of the traced steps, for the scenario's schedule (no torch)."""
    if scenario is None:
        raise UserError("--scenario", None, "name the scenario the trace ran: --scenario S (a YAML path or "
                        "built-in name); the profile is learnt for its schedule's works")
    sc, source = load_scenario(scenario)
    path = out or _default_out(sc.name) / "profile.yaml"
    check_output_file("--out", path)
    check_own_file("--out", path)
    schedule = build_stage_schedules(resolve(sc, source))[0]
    ranks = read_traces(paths, step=step)
    steps = summaries(ranks, step, critical=False, min_over_ranks=False)
    profile = profile_from_trace(ranks, steps, schedule, f"{sc.name}-from-trace", sc.name)
    save_profile(profile, path)
    echo_plain(f"profile: {path} ({len(profile.gemm_table)} GEMM shapes, {len(profile.kernel_table)} kernels, "
               f"{len(profile.collective_table)} collective sizes, from {len(steps)} traced rank-steps); use it "
               f"with meshsim run {scenario} --profile {path}")


def _interruptible(command):
    """The command with SIGTERM / Ctrl-C turned into one line and exit 128 + signal (sim/core/interrupt.py):
    the launcher's `finally` stops the workers and removes its temporary folder on the way out."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            with signals_raise():
                return command(*args, **kwargs)
        except Interrupted as stop:
            raise Interrupted(stop.signum, f"meshsim {command.__name__.removesuffix('_command')} stopped its "
                              "workers and removed its temporary folder; nothing was written") from None

    return run


def register(app: typer.Typer) -> None:
    app.command("validate")(_interruptible(validate_command))
    app.command("calibrate")(_interruptible(calibrate_command))
