"""`meshsim trace summary PATH...`: what a PyTorch-profiler (Kineto) trace says about its training steps.

One JSON (plain or .gz) per rank, or folders of them. Per (rank, step): step time, busy time by
category (compute, communication, copies), communication not hidden by compute, idle, HTA's critical
path by what bounds it; busy time by kernel class; collectives by size with their bus bandwidth; the
GEMM shapes with their throughput. A progress bar (stderr) while a file is read on a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from meshsim.sim.core.console import Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.fmt import fmt_bytes
from meshsim.sim.core.outfiles import check_output_file, write_output_file
from meshsim.sim.core.text import echo_plain, user_text
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.kineto.document import summary_document
from meshsim.sim.kineto.ranks import MAX_KEPT_EVENTS, RankData, all_summaries, load_for

trace_app = typer.Typer(help="Read PyTorch-profiler (Kineto) traces: meshsim trace summary PATH...",
                        no_args_is_help=True, add_completion=False)


@contextmanager
def progress_bars(enabled: bool):
    """A factory path -> progress callback (bytes read), drawing one rich bar per file on stderr; a
    factory of None when disabled or stderr is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield lambda path: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=make_console(stderr=True), transient=True) as bars:
        def factory(path: Path) -> Callable[[int], None]:
            task = bars.add_task(f"reading {path.name}", total=path.stat().st_size)
            return lambda done: bars.update(task, completed=done)
        yield factory


def read_traces(paths: list[Path], progress: bool = True, step: int | None = None) -> list[RankData]:
    """The traces (only ProfilerStep#step's window when `step` is given: bounded memory)."""
    with progress_bars(progress) as factory:
        return load_for(paths, factory, step)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


STEP_COLUMNS = (Column("rank", keep=True), Column("step", keep=True), Column("ms", keep=True),
                Column("compute", keep=True), Column("comm", keep=True), Column("exposed comm", keep=True),
                Column("copies", rank=3), Column("idle", keep=True), Column("kernels", rank=2),
                Column("path: cpu", rank=1), Column("path: gpu compute", rank=1), Column("path: gpu comm", rank=1),
                Column("path: gaps", rank=0))


def _step_row(s: dict) -> list[str]:
    cp = s["critical_path"]
    gaps = cp.get("gpu_kernel_kernel_overhead", 0.0) + cp.get("gpu_kernel_launch_overhead", 0.0)
    return [str(s["rank"]), "-" if s["step"] is None else str(s["step"]), _ms(s["span_s"]), _ms(s["compute_busy_s"]),
            _ms(s["comm_busy_s"]), _ms(s["exposed_comm_s"]), _ms(s["memory_busy_s"]), _ms(s["idle_s"]),
            f"{sum(s['count'].values()):,}", _ms(cp.get("cpu_bound", 0.0)), _ms(cp.get("gpu_compute_bound", 0.0)),
            _ms(cp.get("gpu_communication_bound", 0.0)), _ms(gaps)]


def print_summary(doc: dict, console) -> None:
    for r in doc["ranks"]:
        kind = "CPU as the device" if r["cpu_device"] else r["device"]
        console.print(f"rank {r['rank']} of {user_text(str(r['world_size'] or '?'))} ({user_text(r['backend'] or '?')}, {user_text(kind)}): {user_text(r['path'])}, "
                      f"{r['events']:,} events, {r['device_events']:,} device events", highlight=False)
    title = ("Steps (ms): busy rows overlap; exposed comm = communication with no compute running; path: = "
             "HTA's critical path by what bounds it")
    print_fitted(console, fitted_table(title, STEP_COLUMNS, [_step_row(s) for s in doc["steps"]], console.width))
    mean = doc["mean_step"]
    rows = [[cls, _ms(t), f"{100 * t / mean['span_s']:.1f}" if mean["span_s"] else "-",
             f"{mean['kernels_per_step'].get(cls, 0):,.0f}"] for cls, t in mean["busy_s"].items()]
    columns = (Column("class", "left", keep=True), Column("ms", keep=True), Column("% of step", keep=True),
               Column("kernels", keep=True))
    print_fitted(console, fitted_table(f"Busy time by kernel class, mean per step (step {_ms(mean['span_s'])} ms)",
                                       columns, rows, console.width))
    _print_collectives(doc, console)
    _print_gemms(doc, console)


COLLECTIVE_COLUMNS = (Column("op", "left", keep=True), Column("group", keep=True), Column("bytes", keep=True),
                      Column("count", rank=1), Column("mean us", keep=True), Column("min us", rank=0),
                      Column("busbw GB/s", keep=True), Column("algo", "left", rank=2))


def _print_collectives(doc: dict, console) -> None:
    if not doc["collectives"]:
        return
    rows = []
    for r in doc["collectives"]:
        group = f"{r['group']}{'*' if r['assumed_group'] else ''}" if r["group"] else "?"
        bw = f"{r['busbw_GBps']:.2f}" if r["busbw_GBps"] is not None else "-"
        rows.append([r["op"], group, fmt_bytes(r["bytes"]), str(r["count"]), f"{r['mean_us']:,.1f}",
                     f"{r['min_us']:,.1f}", bw, f"{r['algo']} {r['protocol']}".strip()])
    title = "Collectives by size (busbw = bytes / time x nccl-tests factor; * group size assumed)"
    print_fitted(console, fitted_table(title, COLLECTIVE_COLUMNS, rows, console.width))


def _print_gemms(doc: dict, console, top: int = 10) -> None:
    if not doc["gemms"]:
        return
    rows = [[f"{g['m']}x{g['n']}x{g['k']}" + (f" ({g['batch']})" if g["batch"] > 1 else ""), str(g["count"]),
             f"{g['mean_us']:,.1f}", f"{g['tflops']:.2f}"] for g in doc["gemms"][:top]]
    columns = (Column("m x n x k (batch)", keep=True), Column("count", keep=True), Column("mean us", keep=True),
               Column("TFLOP/s", keep=True))
    title = f"GEMMs by shape (from the launching operator's Input Dims; top {top} by time)"
    print_fitted(console, fitted_table(title, columns, rows, console.width))


@trace_app.command("summary")
def summary_command(
    paths: list[Path] = typer.Argument(..., help="trace files (.json / .json.gz, one per rank) or folders of them"),
    step: int = typer.Option(None, "--step", help="only ProfilerStep#STEP (default: every traced step)"),
    json_path: Path = typer.Option(None, "--json", help="write the summary as JSON here"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar on a terminal"),
    critical_path: bool = typer.Option(True, "--critical-path/--no-critical-path",
                                       help="HTA's critical path per step (the slowest part on large traces)"),
    max_events: int = typer.Option(MAX_KEPT_EVENTS, "--max-events", help="trace records held in memory at once (~1 KB "
                                   "each with their kernels); larger traces are spilled to a temporary file as they "
                                   "are parsed, then summarized per batch of steps"),
) -> None:
    """Per rank and step: busy time by category and kernel class, exposed communication, idle, critical path;
    collectives with their bus bandwidth; GEMMs with their throughput."""
    check_output_file("--json", json_path)
    if max_events < 1:
        raise UserError("--max-events", max_events, "give a positive number of events, e.g. 1000000")
    with progress_bars(progress) as factory:
        ranks, steps = all_summaries(paths, factory, step, critical=critical_path, budget=max_events)
    doc = summary_document(ranks, steps)
    if json_path is not None:
        write_output_file("--json", json_path, dumps_finite(doc, indent=1))
    print_summary(doc, make_console())
    if json_path is not None:
        echo_plain(f"json: {json_path}")


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
