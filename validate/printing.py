"""Console output of the validate commands (rich tables); each printer returns the exit status."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text

from meshsim.sim.core.console import Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.text import user_text
from meshsim.validate.calibrate.noise import Noise, noisy_step_warning
from meshsim.validate.numerics.opcount import per_block_counts

MAX_LINES = 8  # findings printed per variant (worst first)
NUMERICS_COLUMNS = (Column("variant", "left", keep=True), Column("result", "left", keep=True),
                    Column("tensors", keep=True), Column("worst mismatch", "left", rank=0, wrap=True),
                    Column("collectives /step", keep=True), Column("vs schedule", "left", keep=True))
CATEGORY_COLUMNS = (Column("category", "left", keep=True), Column("simulated ms", keep=True),
                    Column("measured ms", keep=True), Column("error", keep=True), Column("path sim", keep=True),
                    Column("path measured", keep=True))


WORST_COLUMN = 3  # NUMERICS_COLUMNS' "worst mismatch"; every mismatch is also listed below the table


def _without(columns, rows, index: int):
    """The columns and rows without column `index`."""
    return (columns[:index] + columns[index + 1:], [row[:index] + row[index + 1:] for row in rows])


def _fmt_err(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _op_column(r, compare_ops: bool) -> str:
    if r.op_diffs is None:
        return "not compared"
    if not r.op_diffs:
        return "same"
    return f"{len(r.op_diffs)} differ" + ("" if compare_ops else " (ignored)")


def print_numerics(results, nproc: int, dtype: str, *, compare_ops: bool = True, console=None) -> int:
    """Variant table, then every mismatch / error / op-count difference; 0 when all pass, else 1."""
    console = console or make_console()
    rows = []
    failed = 0
    for r in results:
        ops_bad = compare_ops and bool(r.op_diffs)
        failed += (not r.ok) or ops_bad
        worst = r.mismatches[0] if r.mismatches else None
        worst_txt = f"{worst['tensor']} rank {worst['rank']} max|err| {worst['max_abs_err']:.3g}" if worst else "-"
        status = Text("ok", style="green") if r.ok else Text("FAIL", style="red")  # styled: not escaped
        rows.append([r.name or "scenario", status, str(r.checked), worst_txt, str(len(r.calls)), _op_column(r, compare_ops)])
    columns = NUMERICS_COLUMNS
    if not any(r.mismatches for r in results):  # an all-"-" column: left out, no "widen the terminal" note
        columns, rows = _without(columns, rows, WORST_COLUMN)
    print_fitted(console, fitted_table(f"numerics vs single process ({nproc} processes, {dtype})", columns,
                                       rows, console.width))
    routed = [f"{r.name or 'scenario'} {r.imbalance:.2f}" for r in results if r.imbalance is not None]
    if routed:
        console.print("MoE routing, rows the busiest rank's experts received / mean: " + ", ".join(routed)
                      + " (the dispatcher's sizes are compared with the schedule as means over the ranks)")
    if results and results[0].calls:
        counts = per_block_counts(results[0].calls)
        console.print(f"collectives per block.phase ({user_text(results[0].name or 'scenario')}, rank 0): "
                      + ", ".join(f"{user_text(k)} {v}" for k, v in counts.items()))
    for r in results:
        lines = [f"[red]{user_text(e)}[/]" for e in r.errors]
        lines += [f"{user_text(m['tensor'])} differs on rank {m['rank']}: max|err| {m['max_abs_err']:.3g} (max|ref| "
                  f"{m['max_abs_ref']:.3g})" for m in r.mismatches]
        lines += [f"collectives: {user_text(line)}" for line in r.op_diffs or []]
        for line in lines[:MAX_LINES]:
            console.print(f"{user_text(r.name)}: {line}")
        if len(lines) > MAX_LINES:
            console.print(f"{user_text(r.name)}: ... and {len(lines) - MAX_LINES} more")
    console.print(f"{len(results) - failed} of {len(results)} variants pass")
    return 1 if failed else 0


def print_crosscheck(report: dict, out_dir: Path | None, tolerance: float | None, console=None) -> int:
    """Step time, categories, critical-path agreement; 1 when the numerics check failed
    (numerics_ok False; None = not run) or |error| exceeds `tolerance` percent, else 0."""
    console = console or make_console()
    err = report["error_pct"]
    console.print(f"{user_text(report['scenario'])}: simulated {report['simulated_step_s'] * 1e3:.2f} ms, measured "
                  f"{report['measured_step_s'] * 1e3:.2f} ms, error {_fmt_err(err)}  (numerics "
                  f"{'ok' if report['numerics_ok'] else report['numerics_ok']})")
    console.print(f"simulated without any overlap {report['simulated_serial_s'] * 1e3:.2f} ms (error "
                  f"{_fmt_err(report['error_serial_pct'])}); measured ops replayed on the simulator's engine "
                  f"{report['replayed_step_s'] * 1e3:.2f} ms")
    share = report["critical_path_agreement"]["share"]
    rows = [[cat, f"{row['simulated_s'] * 1e3:.2f}", f"{row['measured_s'] * 1e3:.2f}", _fmt_err(row["error_pct"]),
             f"{share[cat]['simulated']:.1%}", f"{share[cat]['measured']:.1%}"] for cat, row in report["categories"].items()]
    print_fitted(console, fitted_table("busy time per category (path: share of the critical path)", CATEGORY_COLUMNS,
                                       rows, console.width))
    if "pipeline_bubble" in share:  # pp > 1 (measured: the replay's waits for a P2P peer)
        console.print(f"pipeline bubble on the critical path: simulated {share['pipeline_bubble']['simulated']:.1%}, "
                      f"measured {share['pipeline_bubble']['measured']:.1%} ({report.get('pp', 1)} stages)")
    agree = report["critical_path_agreement"]
    console.print(f"critical path: {agree['on_both']} ops on both, Jaccard {agree['jaccard']:.2f}")
    if report.get("noise"):
        _print_noise(console, report["noise"])
    if out_dir is not None:
        console.print(f"traces: {user_text(Path(out_dir) / 'trace_merged.json')} (open in https://ui.perfetto.dev)")
    failed = report["numerics_ok"] is False
    if failed:
        console.print("[red]numerics check failed: the real step does not match the single-process reference "
                      "(meshsim validate SCENARIO --check shows which tensors)[/]")
    if tolerance is not None and (err is None or abs(err) > tolerance):
        console.print(f"[red]step-time error {_fmt_err(err)} exceeds the tolerance of {tolerance}%[/]")
        failed = True
    return 1 if failed else 0


def _print_noise(console, record: dict) -> None:
    """The timed steps' excess over the fastest and the load, and the warning beyond the bound."""
    noise = Noise(record["excess"], record["what"], record["samples"], record["load_per_core"], record["cores"],
                  record.get("collectives_excess"))
    console.print(f"measurement noise: {noise.describe()} (bound {record['max_excess']:.0%})", highlight=False)
    warning = noisy_step_warning(noise)
    if warning:
        console.print(f"[yellow]{warning}[/]", highlight=False)


def print_profile(profile, path: Path, console=None) -> None:
    console = console or make_console()
    best = max((p.tflops for p in profile.gemm_table), default=0.0)
    console.print(f"profile {user_text(profile.name)}: {len(profile.gemm_table)} GEMM shapes (best "
                  f"{best:.3g} TFLOP/s), memory {profile.elementwise_bw_gbps or 0:.3g} GB/s, "
                  f"launch {profile.compute.launch_overhead_us or 0:.3g} us, {len(profile.kernel_table)} kernels, "
                  f"{len(profile.collective_table)} collective points, comm/compute interference "
                  f"kappa {profile.compute.comm_interference or 0:.2f}", highlight=False)
    measured = profile.measured_on.get("comm_interference")
    if measured:  # the times kappa comes from, and what they mean (validate/calibrate/interference.py)
        console.print(f"kappa measured: {measured}", highlight=False, markup=False)
    noise = profile.measured_on.get("timing_noise")
    if noise:  # validate/calibrate/noise.py: the repeats' excess over the best and the load they ran under
        console.print(f"timing noise: {noise}", highlight=False, markup=False)
    console.print(f"written: {user_text(path)}  (use it with hardware: {{profile: {user_text(path)}}})")
