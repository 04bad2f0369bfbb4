"""`meshsim calibrate`: measure this machine's GEMMs, attention, memory-bound kernels and collectives on a
shrunk scenario (torch, the meshsim[validate] extra, imported inside the command), or learn the same
profile from PyTorch-profiler traces of the scenario's own step (--from-trace, no torch).
"""

from __future__ import annotations

from pathlib import Path

import typer

from meshsim.scenarios.load import load_scenario, resolve
from meshsim.scenarios.profile import save_profile
from meshsim.sim.cli.launch_args import (
    DEFAULT_CALIBRATION_SCENARIO,
    backend_of,
    default_out,
    interruptible,
    nproc_of,
    read_results,
    reading_results,
    results_backend,
    write_payload,
)
from meshsim.sim.cli.trace import read_traces
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.outfiles import check_output_file, check_own_file
from meshsim.sim.core.text import echo_plain
from meshsim.sim.kineto.calibrate import profile_from_trace
from meshsim.sim.kineto.ranks import summaries
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules


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
    accept_noise: bool = typer.Option(False, "--accept-noise", help="write the profile even when its repeated "
                                      "timings disagree beyond the bound (a busy machine; validate/calibrate/noise.py)"),
) -> None:
    """Measure GEMMs, attention, memory-bound kernels and collectives; write a hardware profile."""
    if from_trace:
        _calibrate_from_trace(from_trace, scenario_opt or scenario, out, step)
        return
    # meshsim[validate] extra: these modules import torch
    from meshsim.validate.calibrate.calibration import calibrate, calibration_payload, checked_profile
    from meshsim.validate.printing import print_profile
    from meshsim.validate.timing.measured import schedule_of

    local = dump_payload is None and from_results is None
    per_rank = read_results(from_results) if from_results is not None else None
    be = results_backend(per_rank, backend, nproc) if per_rank is not None else backend_of(backend, local)
    n = nproc_of(nproc, be, local)
    sc, source = load_scenario(scenario or DEFAULT_CALIBRATION_SCENARIO)
    shrunk, payload = calibration_payload(sc, source, n, be)
    path = out or default_out(sc.name) / "profile.yaml"
    check_output_file("--out", path)  # before measuring: a bad path must not throw measurements away
    check_own_file("--out", path)  # never through a link, even a dangling one
    check_output_file("--dump-payload", dump_payload)
    if dump_payload is not None:
        write_payload(dump_payload, "calibrate", payload, n, be)
        return
    if per_rank is not None:
        with reading_results(from_results):
            profile = checked_profile(schedule_of(shrunk, source), per_rank, f"{shrunk.name}-{be}-{n}proc", be,
                                      sc.name, (None, 0), accept_noise)  # load: of the machine that ran them
        save_profile(profile, path)
    else:
        profile = calibrate(shrunk, source, n, backend=be, out=path, accept_noise=accept_noise)
    print_profile(profile, path)


def _calibrate_from_trace(paths: list[Path], scenario: str | None, out: Path | None, step: int | None) -> None:
    """`calibrate --from-trace`: the profile of the traced steps, for the scenario's schedule (no torch)."""
    if scenario is None:
        raise UserError("--scenario", None, "name the scenario the trace ran: --scenario S (a YAML path or "
                        "built-in name); the profile is learnt for its schedule's works")
    sc, source = load_scenario(scenario)
    path = out or default_out(sc.name) / "profile.yaml"
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


def register(app: typer.Typer) -> None:
    app.command("calibrate")(interruptible(calibrate_command))
