"""`meshsim validate`: the numerics check, or the simulated-vs-measured cross-check (`meshsim calibrate`: calibrate.py).

sim/cli/main.py imports this module to call `register(app)` for the command and for `meshsim --help`, so
torch (and everything that imports it) is imported only inside the command functions.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer

from meshsim.scenarios.load import load_scenario
from meshsim.sim.cli.launch_args import (
    MAX_REPEATS,
    backend_of,
    check_gloo_backend,
    default_out,
    interruptible,
    nproc_of,
    read_results,
    reading_results,
    results_backend,
    write_payload,
)
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.outfiles import check_output_dir, check_output_file
from meshsim.sim.core.text import echo_plain
from meshsim.sim.core.userio import dumps_finite


def _specs(variants: str | None) -> list[str] | None:
    return [v.strip() for v in variants.split(",") if v.strip()] if variants else None


def _exit(code: int) -> None:
    """Exit with `code` when non-zero. SystemExit, not typer.Exit: sim/cli/main.py's main() runs the app with
    standalone_mode=False, where click returns typer.Exit's code and main() drops it."""
    if code:
        raise SystemExit(code)


# the files validate/crosscheck/crosscheck.py run_crosscheck / finish write into --out (that module imports
# torch, so the names are listed here for the check that runs before any work)
CROSSCHECK_FILES = ("profile.yaml", "trace_measured.json", "trace_merged.json")


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
        write_payload(dump, "numerics", payload, nproc, "gloo")
        return 0
    per_rank = read_results(results_path) if results_path else launch("numerics", payload, nproc, timeout_s=120.0)
    with reading_results(results_path):
        merged = merge(variants_, per_rank, source)
    code = print_numerics(merged, nproc, dtype, compare_ops=ops)
    return code or (0 if fp8_ok else 1)


def _moe_note(sc) -> None:
    """What of a scenario --check does not run for real (validate/launch/shrink.py): an MoE scenario's
    dispatcher and token dropping; MLA and MTP; the optimizer section and the recompute modules (numerics checks the
    forward and backward, not the optimizer; recompute runs the variants' own settings); the activation's clamp
    and sliding windows (they change which kernels run and how much attention costs, not the layout's math)."""
    moe, p = sc.model.moe, sc.parallel
    left = ([f"the {p.moe_dispatcher} dispatcher (its layers run with alltoall)"]
            if moe is not None and p.moe_dispatcher != "alltoall" else [])
    left += ["token dropping (routing runs dropless)"] if moe is not None and moe.capacity_factor is not None else []
    left += ["multi-latent attention (its layers run standard attention)"] if sc.model.mla is not None else []
    left += ["multi-token prediction (model.mtp_layers)"] if sc.model.mtp_layers else []
    left += ["parallel.recompute_modules"] if p.recompute_modules is not None else []
    left += ["model.activation_clamp (the activation runs unclamped)"] if sc.model.activation_clamp else []
    left += ["model.sliding_window (attention runs full causal)"] if sc.model.sliding_window else []
    left += ["the optimizer section"] if sc.optimizer.model_dump(exclude_defaults=True) else []
    left += ["FSDP (the timing run executes its gathers and reduce-scatters)"] if p.fsdp else []
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
    accept_noise: bool = typer.Option(False, "--accept-noise", help="calibrate even when the repeated timings "
                                      "disagree beyond the bound (a busy machine; validate/calibrate/noise.py)"),
) -> None:
    """Run the scenario's TP/SP step for real: numerics (--check), or simulated vs measured step time."""
    if check:
        check_gloo_backend(backend)
        _exit(_check(scenario, nproc_of(nproc, "gloo"), variants, dtype, ops, dump_payload, from_results))
        return
    local = dump_payload is None and from_results is None
    per_rank = read_results(from_results) if from_results is not None else None
    be = results_backend(per_rank, backend, nproc) if per_rank is not None else backend_of(backend, local)
    n = nproc_of(nproc, be, local)
    check_output_dir("--trace", trace)
    if trace is not None and not local:
        raise UserError("--trace", str(trace), "drop --trace with --dump-payload / --from-results (the traces are "
                        "recorded by processes this command spawns)")
    _exit(_crosscheck(scenario, n, be, profile, tolerance, json_path, out, repeats, dump_payload, per_rank, trace,
                      from_results, accept_noise))


def _crosscheck(scenario: str, n: int, be: str, profile: Path | None, tolerance: float | None,
                json_path: Path | None, out: Path | None, repeats: int, dump: Path | None,
                per_rank: list | None, trace: Path | None = None, results_path: Path | None = None,
                accept_noise: bool = False) -> int:
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
    out_dir = out or default_out(sc.name, "-validate")
    check_output_dir("--out", out_dir, CROSSCHECK_FILES)
    check_output_file("--json", json_path)
    check_output_file("--dump-payload", dump)
    if dump is not None:
        write_payload(dump, "timing", timing_payload(sc, source, n, be, repeats=repeats)[2], n, be)
        return 0
    if per_rank is not None:
        if profile is None:
            raise UserError("--profile", None, "with --from-results give the profile to simulate with "
                            "(meshsim calibrate ... --from-results writes one)")
        shrunk, variants_, _ = timing_payload(sc, source, n, be, repeats=repeats)
        with reading_results(results_path):
            measured = reduce_run(stage_schedules_of(shrunk, source), per_rank)
            result = finish(shrunk, source, str(profile), variants_, measured, out_dir)
    else:
        result = run_crosscheck(sc, source, n, profile=str(profile) if profile else None, out_dir=out_dir,
                                backend=be, repeats=repeats, trace_dir=trace, accept_noise=accept_noise)
        if trace is not None:
            echo_plain(f"traces: {trace} (meshsim trace summary {trace}; meshsim compare {trace / 'scenario.yaml'} "
                       f"--trace {trace})")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(dumps_finite(result.report, indent=2))
    return print_crosscheck(result.report, out_dir, tolerance)


def register(app: typer.Typer) -> None:
    app.command("validate")(interruptible(validate_command))
