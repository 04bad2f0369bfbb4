"""`meshsim sweep` (find the TP sweet spot) and `meshsim compare` (two results side by side)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.console import Console

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.core.console import fitted_table, make_console
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.userio import check_output_dir, check_output_file
from meshsim.sim.results.error_band import band_for
from meshsim.sim.sweep.axes import configurations, sweep_axes
from meshsim.sim.sweep.compare import compare_files, print_comparison
from meshsim.sim.sweep.explain import explain, ok, sweet_spot
from meshsim.sim.sweep.record import RECORD_VERSION, SweepRecord
from meshsim.sim.sweep.report_page import write_report
from meshsim.sim.sweep.runner import run_sweep
from meshsim.sim.sweep.table import table_columns, table_rows

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
    jobs: int = typer.Option(None, "--jobs", "-j", help="local worker processes (default: all cores; 1 = in-process)"),
    out: Path = typer.Option(None, "--out", help="directory for sweep.jsonl (resumable) and report.html"),
    json_path: Path = typer.Option(None, "--json", help="write configurations, skipped, sweet_spot, explanation"),
    ray: str = typer.Option(None, "--ray", help="run as Ray tasks: a cluster address, 'auto' or 'local'"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Sweep tp x pp x vp x sp x micro-batch x overlap x recompute at the scenario's GPU count; name the sweet spot."""
    if jobs is not None and not 1 <= jobs <= MAX_JOBS:
        raise UserError("--jobs", jobs, f"use --jobs 1 to {MAX_JOBS}")
    flags = dict(tp=tp, sp=sp, micro_batch=micro_batch, tp_comm_overlap=tp_comm_overlap, recompute=recompute,
                 pp=pp, vp=vp, ep=ep, etp=etp)
    base, source = load_scenario(scenario)
    axes = sweep_axes(base, flags)  # bad axis values fail here, before any work
    points = configurations(axes)
    check_output_dir("--out", out)
    check_output_file("--json", json_path)
    workers = min(jobs or os.cpu_count() or 1, len(points))
    records = run_sweep(base, source, points, jobs=workers, out_dir=out, ray_address=ray, progress=progress)
    reasons = explain(records, lambda rec: band_for(with_overrides(base, rec.point.overrides(), source)))
    written = {}  # files first, so that `meshsim sweep ... | head` still writes them
    if out is not None:
        written["report"] = write_report(records, reasons, f"TP sweep of {base.name}", out)
        written["results"] = Path(out) / "sweep.jsonl"
    if json_path is not None:
        write_sweep_json(json_path, records, reasons)
        written["json"] = json_path
    print_results(records, reasons, title=f"{base.name}: {len(points)} configurations")
    for kind, path in written.items():
        typer.echo(f"{kind}: {path}")


def sweep_document(records: list[SweepRecord], reasons: list[str]) -> dict:
    """The --json document."""
    best = sweet_spot(records)
    return {"version": RECORD_VERSION, "configurations": [r.to_json() for r in records if ok(r)],
            "skipped": [r.to_json() for r in records if not ok(r)],
            "sweet_spot": best.to_json() if best is not None else None, "explanation": reasons}


def write_sweep_json(path: Path, records: list[SweepRecord], reasons: list[str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sweep_document(records, reasons), indent=1))


def print_results(records: list[SweepRecord], reasons: list[str], *, title: str, console: Console | None = None) -> None:
    console = console or make_console()
    best = sweet_spot(records)
    ran = [rec for rec in records if ok(rec)]
    table, note = fitted_table(title + " (bold green: the sweet spot)", table_columns(ran), table_rows(ran),
                               console.width, row_styles=["bold green" if rec is best else None for rec in ran])
    console.print(table)
    if note:
        console.print(note, highlight=False)
    for rec in records:
        if not ok(rec):
            console.print(f"[yellow]skipped[/yellow] {rec.key}: {rec.reason}", highlight=False)
    console.print()
    for sentence in reasons:
        console.print(f"- {sentence}", highlight=False)


def compare_command(
    a: Path = typer.Argument(..., help="first results.json (meshsim run --out DIR writes DIR/results.json)"),
    b: Path = typer.Argument(..., help="second results.json"),
    out: Path = typer.Option(None, "--out", help="write compare.json and a merged Perfetto trace.json here"),
) -> None:
    """Two results side by side: headline numbers, step time by category with deltas, merged timeline."""
    check_output_dir("--out", out)
    comparison = compare_files(a, b, out_dir=out)
    print_comparison(comparison, make_console())


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_command)
    app.command("compare")(compare_command)
