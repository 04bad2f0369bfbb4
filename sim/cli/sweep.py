"""`meshsim sweep` (find the TP sweet spot) and `meshsim compare` (two results side by side)."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.cli.trace import read_traces
from meshsim.sim.core.console import Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.engines import check_engine
from meshsim.sim.core.errors import EXIT_USER_ERROR, CommandFailed, FilePath, UserError
from meshsim.sim.core.fmt import fmt_bytes, fmt_pct
from meshsim.sim.core.outfiles import (
    check_output_dir,
    check_output_file,
    check_own_file,
    open_own_for_writing,
)
from meshsim.sim.core.text import plain, user_text
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.kineto.kernels import kernels_in, step_windows, trace_steps
from meshsim.sim.kineto.ranks import summaries
from meshsim.sim.outputs.advice import scenario_settings
from meshsim.sim.results.error_band import band_for
from meshsim.sim.sweep.axes import block_axes_swept, configurations, sweep_axes
from meshsim.sim.sweep.compare import compare_files, print_comparison
from meshsim.sim.sweep.explain import explain
from meshsim.sim.sweep.explain_terms import label, ok, sweet_spot, varying_axes
from meshsim.sim.sweep.record import RECORD_VERSION, SweepRecord
from meshsim.sim.sweep.report_page import REPORT_NAME, sweep_title, write_report
from meshsim.sim.sweep.runner import run_sweep
from meshsim.sim.sweep.store import JSONL_NAME, LOCK_NAME
from meshsim.sim.sweep.table import (
    SWEET_MARK,
    mfu_note,
    share_columns,
    share_legend,
    share_rows,
    table_columns,
    table_rows,
)
from meshsim.sim.sweep.trace_compare import compare_trace, simulated_side
from meshsim.sim.sweep.trace_compare_page import write_outputs as write_trace_outputs

COMPARE_FILES = ("compare.json", "compare.html", "trace.json", "compare_trace.json", "compare_trace.html")
MAX_JOBS = 256  # local worker processes of one sweep

AXIS_HELP = "comma-separated; overrides the scenario's sweep: block; unset axes keep the scenario's value"


def sweep_command(
    scenario: str = typer.Argument(..., help="scenario YAML path or built-in name (meshsim scenarios)"),
    tp: str = typer.Option(None, "--tp", help=f"tensor-parallel degrees, e.g. 1,2,4,8 ({AXIS_HELP})"),
    pp: str = typer.Option(None, "--pp", help=f"pipeline stages, e.g. 1,2,4 ({AXIS_HELP}); tp x pp x dp = GPUs"),
    vp: str = typer.Option(None, "--vp", help=f"virtual stages per rank (interleaved 1F1B), e.g. 1,2 ({AXIS_HELP})"),
    sp: str = typer.Option(None, "--sp", help="sequence parallelism: on, off or both"),
    micro_batch: str = typer.Option(None, "--micro-batch", help=f"micro-batch sizes, e.g. 1,2,4 ({AXIS_HELP})"),
    tp_comm_overlap: str = typer.Option(None, "--tp-comm-overlap", help="TP comm/GEMM overlap: on, off or both"),
    recompute: str = typer.Option(None, "--recompute", help="activation recompute modes: none,selective,full"),
    ep: str = typer.Option(None, "--ep", help=f"expert-parallel degrees (MoE), e.g. 8,16,32 ({AXIS_HELP})"),
    etp: str = typer.Option(None, "--etp", help=f"expert-tensor-parallel degrees (MoE), e.g. 1,2 ({AXIS_HELP})"),
    cp: str = typer.Option(None, "--cp", help=f"context-parallel degrees, e.g. 1,2,4 ({AXIS_HELP}); "
                           "tp x cp x pp x dp = GPUs"),
    fp8: str = typer.Option(None, "--fp8", help=f"FP8 recipes (run.fp8), e.g. off,delayed ({AXIS_HELP})"),
    fsdp: str = typer.Option(None, "--fsdp", help="Megatron-FSDP (ZeRO-3) instead of the distributed optimizer: on, "
                             "off or both"),
    dist_opt_instances: str = typer.Option(None, "--dist-opt-instances", help="distributed-optimizer instances, "
                                           f"e.g. 1,2,4 ({AXIS_HELP}); above 1 runs the distributed optimizer"),
    jobs: int = typer.Option(None, "--jobs", "-j", help="local worker processes (default: all cores; 1 = in-process)"),
    out: Path = typer.Option(None, "--out", help="directory for sweep.jsonl (resumable) and report.html"),
    json_path: Path = typer.Option(None, "--json", help="write configurations, skipped, sweet_spot, explanation"),
    ray: str = typer.Option(None, "--ray", help="run as Ray tasks: a cluster address, 'auto' or 'local'"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
    engine: str = typer.Option(None, "--engine", help="discrete-event engine of every simulation: compiled, python or "
                               "simpy (same figures; default: the scenario's run.engine)"),
) -> None:
    """Sweep tp x pp x vp x sp x micro-batch x overlap x recompute (x ep x etp x cp x fp8 x fsdp x optimizer
    instances) at the scenario's GPU count; name the sweet spot."""
    if jobs is not None and not 1 <= jobs <= MAX_JOBS:
        raise UserError("--jobs", jobs, f"use --jobs 1 to {MAX_JOBS}")
    flags = dict(tp=tp, sp=sp, micro_batch=micro_batch, tp_comm_overlap=tp_comm_overlap, recompute=recompute,
                 pp=pp, vp=vp, ep=ep, etp=etp, cp=cp, fp8=fp8, fsdp=fsdp, dist_opt_instances=dist_opt_instances)
    check_engine("--engine", engine)
    base, source = load_scenario(scenario)
    if engine is not None:
        base = with_overrides(base, {"run.engine": engine}, source)
    axes = sweep_axes(base, flags)  # bad axis values fail here, before any work
    points = configurations(axes)
    also = block_axes_swept(base, flags)
    if also:  # said before the work: the flags do not replace the block, they replace its axes they name
        listed = "; ".join(f"{a} {', '.join(map(_flag_text, getattr(axes, a)))}" for a in also)
        make_console().print(f"note: {len(points)} configurations: the scenario's sweep: block also sweeps "
                             f"{listed}; pin {'it' if len(also) == 1 else 'them'} with "
                             f"{', '.join('--' + a.replace('_', '-') + ' VALUE' for a in also)}",
                             highlight=False, markup=False)
    check_output_dir("--out", out, (JSONL_NAME, LOCK_NAME, REPORT_NAME))
    check_output_file("--json", json_path)
    if json_path is not None:
        check_own_file("--json", Path(json_path))  # a device (/dev/full) or a link: refused before the work
    workers = min(jobs or os.cpu_count() or 1, len(points))
    records = run_sweep(base, source, points, jobs=workers, out_dir=out, ray_address=ray, progress=progress)
    reasons = explain(records, lambda rec: band_for(with_overrides(base, rec.point.overrides(), source)),
                      settings=scenario_settings(base))
    written = {}  # files first, so that `meshsim sweep ... | head` still writes them
    if out is not None:
        written["report"] = write_report(records, reasons, sweep_title(records, base.name), out)
        written["results"] = Path(out) / "sweep.jsonl"
    if json_path is not None:
        write_sweep_json(json_path, records, reasons)
        written["json"] = json_path
    check_all_skipped_alike(records, source)
    print_results(records, reasons, title=f"{base.name}: {len(points)} configurations")
    for kind, path in written.items():
        typer.echo(plain(f"{kind}: {path}"))
    if not any(ok(rec) for rec in records):
        raise CommandFailed(f"none of the {len(records)} configurations could run: each is skipped for the reason "
                            "printed above; change the axes or the scenario", exit_code=EXIT_USER_ERROR)


def check_all_skipped_alike(records: list[SweepRecord], source: str) -> None:
    """A sweep whose every configuration is skipped for one and the same reason (an input error that no
    axis changes: a broken hardware profile, a rule every point breaks) stops with that reason as its one
    line, exit status 2."""
    reasons = {rec.reason for rec in records if not ok(rec)}
    if records and len(reasons) == 1 and not any(ok(rec) for rec in records):
        what = "its one configuration" if len(records) == 1 else f"all {len(records)} configurations"
        raise CommandFailed(f"{source}: the sweep skipped {what} for one reason: {reasons.pop()}",
                            exit_code=EXIT_USER_ERROR)


def _flag_text(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def sweep_document(records: list[SweepRecord], reasons: list[str]) -> dict:
    """The --json document."""
    best = sweet_spot(records)
    return {"version": RECORD_VERSION, "configurations": [r.to_json() for r in records if ok(r)],
            "skipped": [r.to_json() for r in records if not ok(r)],
            "sweet_spot": best.to_json() if best is not None else None, "explanation": reasons}


def write_sweep_json(path: Path, records: list[SweepRecord], reasons: list[str]) -> None:
    """The --json document, opened as `run --json` opens its file (never through a link, a regular file
    only); a failed write (a full disk) is one line naming the flag."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_finite(sweep_document(records, reasons), indent=1)
    try:
        with open_own_for_writing(path, flag="--json") as fh:
            fh.write(text)
    except OSError as exc:
        raise UserError("--json", FilePath(path), "give a path on a disk with room (sweep.jsonl in --out keeps every "
                        "configuration)", problem=f"Cannot write the file ({exc.strerror or exc})") from None


def print_results(records: list[SweepRecord], reasons: list[str], *, title: str, console: Console | None = None) -> None:
    """The results table, the critical-path table with its legend, one line per skipped configuration,
    then the explanation (which does not repeat the skipped ones)."""
    console = console or make_console()
    ran = [rec for rec in records if ok(rec)]
    best = sweet_spot(records)
    styles = ["bold green" if rec is best else None for rec in ran]
    for heading, columns, rows in ((f"{title} ({SWEET_MARK} = the sweet spot)", table_columns(ran), table_rows(ran)),
                                   ("critical path, % of each step", share_columns(ran), share_rows(ran))):
        if not rows:
            continue
        print_fitted(console, fitted_table(heading, columns, rows, console.width, row_styles=styles))
    if ran:
        console.print(share_legend(ran), highlight=False)
    if mfu_note(ran):
        console.print(mfu_note(ran), highlight=False)
    for rec in records:  # each reason whole, wrapped at the width between words
        if not ok(rec):
            console.print(skipped_line(rec, records), highlight=False, markup=False)
    console.print()
    for sentence in reasons:
        console.print(f"- {user_text(sentence)}", highlight=False)


def skipped_line(rec: SweepRecord, records: list[SweepRecord]) -> str:
    """'skipped tp=3, pp=2: <why>' on one line: the axes that vary, and the reason as one line."""
    return f"skipped {label(rec, varying_axes(records)) or rec.key}: {' '.join(rec.reason.split())}"


def compare_command(
    a: Path = typer.Argument(..., help="first results.json (meshsim run --out DIR writes DIR/results.json); with "
                             "--trace: a results.json or a scenario (path or built-in name)"),
    b: Path = typer.Argument(None, help="second results.json (not with --trace)"),
    out: Path = typer.Option(None, "--out", help="write compare.json and a merged Perfetto trace.json here (with "
                             "--trace: compare_trace.json, compare_trace.html, trace.json)"),
    trace: list[Path] = typer.Option(None, "--trace", help="compare with PyTorch-profiler traces of the same step "
                                     "(files or folders, one file per rank; repeatable)"),
    step: int = typer.Option(None, "--step", help="with --trace: only ProfilerStep#STEP"),
    profile: Path = typer.Option(None, "--profile", help="with --trace: simulate with this hardware profile "
                                 "(e.g. from meshsim calibrate --from-trace)"),
) -> None:
    """Two results side by side (headline, step time by category, merged timeline), or a simulated step
    against a traced one (--trace)."""
    check_output_dir("--out", out, COMPARE_FILES)
    if trace:
        if b is not None:
            raise UserError("b", str(b), "give one results.json or scenario with --trace")
        if profile is not None and not profile.is_file():
            raise UserError("--profile", str(profile), "give a profile YAML written by meshsim calibrate",
                            problem="No such file")
        compare_with_trace(str(a), trace, step, out, profile)
        return
    if b is None:
        raise UserError("b", None, "give two results.json files, or one with --trace PATH")
    comparison = compare_files(a, b, out_dir=out)
    print_comparison(comparison, make_console())


def compare_with_trace(target: str, paths: list[Path], step: int | None, out: Path | None,
                       profile: Path | None = None) -> None:
    """`compare TARGET --trace PATH`: structure first; rows only when it agrees (sim/sweep/trace_compare.py)."""
    sim = simulated_side(target, profile)
    ranks = read_traces(paths, step=step)
    doc = compare_trace(sim, ranks, summaries(ranks, step, critical=False), step)
    console = make_console()
    print_trace_comparison(doc, console)
    if out is not None:
        data = ranks[0]
        windows = [w for s, w in zip(trace_steps(data.trace), step_windows(trace_steps(data.trace)), strict=True)
                   if step is None or s.number == step]
        window = windows[len(windows) // 2]  # a middle step: the first ones carry warm-up
        paths_out = write_trace_outputs(out, doc, sim, kernels_in(data.kernels, window), window[0], data.trace.rank)
        for kind, path in paths_out.items():
            console.print(f"{kind}: {user_text(path)}", highlight=False)
    if doc["structure_issues"]:
        raise UserError("--trace", ", ".join(map(str, paths)), "give the scenario the trace ran (its layers, "
                        "micro-batches, tp and collectives), or a trace of this scenario",
                        problem="Trace and scenario disagree on structure, so their steps are not compared: "
                                + "; ".join(doc["structure_issues"]))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:,.4g}" if isinstance(value, float) else str(value)


STRUCTURE_COLUMNS = (Column("", "left", keep=True, wrap=True), Column("simulated", keep=True),
                     Column("measured", keep=True), Column("agrees", keep=True))
GAP_COLUMNS = (Column("", "left", keep=True, wrap=True), Column("kind", "left", rank=0), Column("simulated ms", keep=True),
               Column("measured ms", keep=True), Column("sim - meas ms", rank=1), Column("sim vs meas", keep=True))
TRACE_COLLECTIVE_COLUMNS = (Column("op", "left", keep=True), Column("group", keep=True), Column("bytes", keep=True),
                            Column("count", rank=0), Column("measured us", keep=True), Column("model us", keep=True),
                            Column("measured GB/s", rank=1), Column("model GB/s", rank=1))


def print_trace_comparison(doc: dict, console: Console) -> None:
    rows = [[r["what"], _cell(r["simulated"]), _cell(r["measured"]), "yes" if r["agrees"] else "NO"]
            for r in doc["structure"]]
    print_fitted(console, fitted_table(f"Structure: {doc['simulated']} against traced rank {doc['rank']}",
                                       STRUCTURE_COLUMNS, rows, console.width))
    if not doc["rows"]:
        return
    rows = [[r["name"], r["kind"], f"{r['simulated_s'] * 1e3:,.3f}", f"{r['measured_s'] * 1e3:,.3f}",
             f"{r['delta_s'] * 1e3:+,.3f}", "-" if r["delta_pct"] is None else fmt_pct(r["delta_pct"] / 100, 1, signed=True)]
            for r in doc["rows"]]
    print_fitted(console, fitted_table("Simulated vs measured, per step, largest difference first (busy rows overlap)",
                                       GAP_COLUMNS, rows, console.width))
    def fixed(value: float | None, decimals: int) -> str:  # one number format per column
        return "-" if value is None else f"{value:,.{decimals}f}"

    rows = [[r["op"], _cell(r["group"]), fmt_bytes(r["bytes"]), str(r["count"]), fixed(r["mean_us"], 1),
             fixed(r["model_us"], 1), fixed(r["busbw_GBps"], 2), fixed(r["model_busbw_GBps"], 2)]
            for r in doc["collectives"]]
    print_fitted(console, fitted_table("Collectives by size: measured bus bandwidth against meshsim's model",
                                       TRACE_COLLECTIVE_COLUMNS, rows, console.width))


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
    app.command("compare")(compare_command)
