"""The terminal report of one simulated step (rich), and `write_outputs` for the output files.

Sections: a banner when the configuration does not fit in memory; headline numbers (step, tokens/s,
TFLOP/s, MFU next to HFU, time to train a token budget) and the model's error for this kind of run; memory per GPU (GiB); the step split along the
critical path (adds up to the step) apart from busy time per stream (overlaps); the critical path's top
op types; the collective algorithms chosen. Every table fits the console's width (sim/console.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from meshsim.sim.core.console import SECTION, Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.fmt import (
    fmt_bytes_range,
    fmt_count,
    fmt_duration_long,
    fmt_gb_as_gib,
    fmt_gib,
    fmt_pct,
    fmt_s,
    gb_to_gib,
    time_column,
)
from meshsim.sim.core.outfiles import open_own_for_writing
from meshsim.sim.core.text import user_text
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.engine.events import Event
from meshsim.sim.outputs.advice import fixes_sentence
from meshsim.sim.outputs.timeline import write_timeline
from meshsim.sim.outputs.trace import write_trace
from meshsim.sim.results.critical_path import CATEGORY_NAMES
from meshsim.sim.results.error_band import ErrorBand
from meshsim.sim.results.records import CollectiveRow, ConfigEcho
from meshsim.sim.results.simulate import release_freed_memory
from meshsim.sim.results.step_result import MEMORY_KEYS, StepResult

OUTPUT_FILES = {"results": "results.json", "trace": "trace.json", "timeline": "timeline.html"}
OUTPUT_LEVELS = ("none", "results", "all")  # meshsim run --outputs: nothing, results.json, every file
MEMORY_ROWS = tuple(k for k in MEMORY_KEYS if k not in ("total", "capacity", "fits"))  # the parts of the total
WAITING_NAMES = {"exposed_tp_comm": "while TP comm runs", "exposed_ep_comm": "while EP comm runs",
                 "exposed_cp_comm": "while CP comm runs",
                 "exposed_dp_comm_only": "while only DP comm runs",
                 "exposed_pp_comm_only": "while only P2P transfers run",
                 "pipeline_bubble": "pipeline bubble (stage waits for a neighbour)",
                 "nothing_running": "while nothing runs", "compute_waiting_at_start": "before its first op"}
STREAM_NAMES = {"compute_busy": "compute stream busy", "tp_comm_busy": "TP comm stream busy",
                "dp_comm_busy": "DP comm stream busy", "pp_comm_busy": "P2P stream busy",
                "ep_comm_busy": "EP comm stream busy", "cp_comm_busy": "CP comm stream busy"}


def path_row_name(key: str) -> str:
    """How a report names a critical-path category: 'compute', 'exposed TP communication', 'pipeline bubble'
    (CATEGORY_NAMES; a category it does not name, in words)."""
    name = CATEGORY_NAMES.get(key, key.replace("_", " "))
    return f"exposed {name}" if key.endswith("_comm") else name


def stream_row_name(key: str) -> str:
    """How a report names a busy or waiting time of rank 0: 'compute stream busy', 'compute stream waiting'."""
    return STREAM_NAMES.get(key) or ("compute stream waiting" if key == "compute_waiting" else key.replace("_", " "))


def _pct(x: float) -> str:
    return fmt_pct(x, 1)



def _precision(recipe: str | None, fmt: str) -> str:
    """', FP8 tensorwise (hybrid; ...)' / ', NVFP4 (E2M1; ...)' for the header line; '' in 16 bit."""
    if recipe in (None, "off"):
        return ""
    what = "NVFP4 (E2M1 with E4M3 block scales" if recipe == "nvfp4" else f"FP8 {recipe} ({fmt}"
    return f", {what}; MFU on the 16-bit peak)"


def config_line(c: ConfigEcho) -> str:
    """'tp=8 pp=1 sp=on dp=8, 64 x h100-sxm (8 x dgx-h100), micro-batch 1 x 128, recompute none, release profile
    mbridge-26.08' (the software-release family whose constants apply, scenarios/releases.py)."""
    vp = f" vp={c.vp}" if (c.vp or 1) > 1 else ""
    ep = f" ep={c.ep} etp={c.etp} edp={c.edp}" if c.has("ep") else ""
    if c.moe_ep_overlap:  # Megatron's combined 1F1B (sim/schedule/ep_overlap.py)
        ep += " ep-overlap" + (" +delayed-wgrad" if c.delay_wgrad_compute else "")
    cp = f" cp={c.cp} ({c.cp_comm})" if (c.cp or 1) > 1 else ""
    ep += f" mtp={c.mtp_layers}" if c.mtp_layers else ""  # multi-token prediction depths
    fsdp = " (fsdp)" if c.fsdp else ""  # Megatron-FSDP: weights and gradients sharded over dp too
    if c.dist_opt_instances:  # the distributed optimizer shards inside each of this many instances
        fsdp += f" ({c.dist_opt_instances} optimizer instances)"
    return (f"tp={c.tp}{cp} pp={c.pp or 1}{vp} sp={'on' if c.sp else 'off'} dp={c.dp}{fsdp}{ep}, "
            f"{c.gpus} x {c.gpu} ({c.nodes} x {c.topology}), "
            f"micro-batch {c.micro_batch} x {c.micro_batches}, recompute {c.recompute}"
            + _precision(c.fp8, c.fp8_format) + (f", release profile {c.release}" if c.release else ""))


def band_line(band: ErrorBand) -> str:
    """How far these figures may be off: the out-of-fit error of the scenario's accuracy group."""
    return f"model's error {band.sentence()} (benchmarks/accuracy.py)"


def ep_line(r: StepResult) -> str:
    """One MoE layer's dispatch and combine times, and their share of the step on the critical path."""
    ms, path = r.ep_comm.layer_ms, r.ep_comm.critical_path_s
    parts = [f"{k.replace('.', ' ')} {fmt_s(v / 1e3)}" for k, v in ms.items()]
    on_path = sum(path.values())
    share = f"; on the critical path {fmt_s(on_path)} per step ({_pct(on_path / r.step_time_s)})" \
        if r.step_time_s > 0 else ""
    return "one MoE layer's all-to-all: " + ", ".join(parts) + share


def headline(r: StepResult, tokens: float | None = None, band: ErrorBand | None = None) -> str:
    text = (f"[bold]{user_text(r.scenario)}[/bold]  {user_text(config_line(r.config))}\n"
            f"step [bold]{fmt_s(r.step_time_s)}[/bold]   {fmt_count(r.tokens_per_s)} tokens/s   "
            f"{r.tflops_per_gpu:.1f} TFLOP/s per GPU   MFU [bold]{_pct(r.mfu)}[/bold]   HFU {_pct(r.hfu)}\n"
            f"one layer: forward {fmt_s(r.layer_fwd_ms / 1e3)}, backward {fmt_s(r.layer_bwd_ms / 1e3)}")
    if r.ep_comm is not None:
        text += "\n" + ep_line(r)
    if band is not None:
        text += "\n" + band_line(band)
    if tokens and r.tokens_per_s > 0:
        seconds = tokens / r.tokens_per_s
        gpus = f" on {fmt_count(r.config.gpus)} GPUs: {fmt_count(round(seconds * r.config.gpus / 3600))} " \
               "GPU-hours" if r.config.gpus else ""
        text += f"\n{fmt_count(tokens)} tokens take [bold]{fmt_duration_long(seconds)}[/bold] at this rate{gpus}"
    return text


def not_fit_banner(r: StepResult, settings: Mapping[str, Any] | None = None) -> Panel | None:
    """A red panel when the configuration needs more memory than the GPU has; None when it fits. It
    suggests only what is not already set (sim/outputs/advice.py): `settings` adds what the config echo
    lacks (distributed_optimizer)."""
    if r.fits:
        return None
    m = r.memory_gb
    return Panel(f"[bold]DOES NOT FIT[/bold]: needs {fmt_gb_as_gib(m.total)} per GPU, the GPU has "
                 f"{fmt_gb_as_gib(m.capacity)} (activations {fmt_gb_as_gib(m.activations)}). "
                 f"The timings below are for a run that could not start. {fixes_sentence({**r.config.to_json(), **(settings or {})})}",
                 style="bold red", title="memory", title_align="left")


def memory_table(r: StepResult, width: int) -> tuple[Table, str]:
    m = r.memory_gb
    cap = m.capacity
    columns = (Column("", "left", keep=True), Column("GiB", keep=True), Column("% of capacity", keep=True))
    rows: list = [[key, fmt_gib(gb_to_gib(getattr(m, key))), _pct(getattr(m, key) / cap) if cap else "-"]
                  for key in MEMORY_ROWS]
    verdict = ("fits", "green") if r.fits else ("DOES NOT FIT", "bold red")
    rows += [SECTION, [Text.assemble("total (", verdict, ")"), fmt_gib(gb_to_gib(m.total)),
                       _pct(m.total / cap) if cap else "-"], ["capacity", fmt_gib(gb_to_gib(cap)), ""]]
    if m.host_optimizer:
        rows.append(["host memory (offloaded optimizer)", fmt_gib(gb_to_gib(m.host_optimizer)), ""])
    return fitted_table("memory per GPU", columns, rows, width)


def _time_columns(unit: str) -> tuple[Column, ...]:
    return Column("", "left", keep=True), Column(unit, keep=True), Column("% of step", keep=True)


def critical_path_table(r: StepResult, width: int) -> tuple[Table, str]:
    """The step split along the critical path: its categories tile [0, step], so the rows add up."""
    unit, fmt = time_column([r.step_time_s])
    rows: list = []
    for key, share in r.critical_path_share.items():
        rows.append([path_row_name(key), fmt(share * r.step_time_s), _pct(share)])
    rows += [SECTION, ["step", fmt(r.step_time_s), _pct(sum(r.critical_path_share.values()))]]
    return fitted_table("step along the critical path (adds up)", _time_columns(unit), rows, width)


def stream_table(r: StepResult, width: int) -> tuple[Table, str]:
    """Busy time per stream of the representative rank (they overlap), and how long compute waits."""
    b = r.breakdown_s
    unit, fmt = time_column([r.step_time_s])
    step = r.step_time_s or 1.0
    rows: list = [[name, fmt(b.get(key, 0.0)), _pct(b.get(key, 0.0) / step)]
                  for key, name in STREAM_NAMES.items() if key in b]
    rows += [SECTION, [stream_row_name("compute_waiting"), fmt(b.get("compute_waiting", 0.0)),
                       _pct(b.get("compute_waiting", 0.0) / step)]]
    rows += [[f"  {name}", fmt(b[key]), _pct(b[key] / step)] for key, name in WAITING_NAMES.items() if key in b]
    return fitted_table("busy time per stream, rank 0 (overlaps)", _time_columns(unit), rows, width)


def top_ops_table(r: StepResult, width: int, n: int = 8) -> tuple[Table, str]:
    found = r.top_op_types(n)
    unit, fmt = time_column([total_us * 1e-6 for _, _, total_us, _ in found])
    columns = (Column("op type", "left", keep=True), Column("category", "left", rank=0), Column(unit, keep=True),
               Column("count", rank=1), Column("% of step", keep=True))
    rows = [[kind, CATEGORY_NAMES.get(cat, cat), fmt(total_us * 1e-6), fmt_count(count),
             _pct(total_us / (r.step_time_s * 1e6) if r.step_time_s else 0.0)] for kind, cat, total_us, count in found]
    return fitted_table("top critical-path op types", columns, rows, width)


def _span(lo: float, hi: float, fmt) -> str:
    a, b = fmt(lo), fmt(hi)
    return a if a == b else f"{a}-{b}"


def collective_groups(rows: Iterable[CollectiveRow]) -> list[dict]:
    """Distinct collectives grouped by (op, group, ranks, algo, protocol, source): size/time/busbw ranges
    (the report's table rows)."""
    groups: dict[tuple, list[CollectiveRow]] = {}
    for c in rows:
        key = (c.op, c.group, c.ranks, c.algo, c.protocol, c.source)
        groups.setdefault(key, []).append(c)
    out = []
    for key, items in groups.items():
        out.append({**dict(zip(("op", "group", "ranks", "algo", "protocol", "source"), key, strict=True)),
                    "count": sum(c.count for c in items),
                    **{f"{k}_{end}": fn(float(getattr(c, k)) for c in items)
                       for k in ("nbytes", "time_us", "busbw_gbps") for end, fn in (("min", min), ("max", max))}})
    return out


COLLECTIVE_COLUMNS = (Column("op", "left", keep=True), Column("group", "left", keep=True),
                      Column("algo/proto", "left", keep=True), Column("size", keep=True), Column("{unit} each", rank=2),
                      Column("busbw GB/s", keep=True), Column("calls", rank=1), Column("source", "left", rank=0))


def collectives_table(r: StepResult, width: int) -> tuple[Table, str]:
    groups = collective_groups(r.collectives)
    measured = any(g["source"] == "calibrated" for g in groups)
    unit, fmt = time_column([g["time_us_max"] * 1e-6 for g in groups])
    columns = [Column(c.header.format(unit=unit), c.justify, c.keep, c.rank) for c in COLLECTIVE_COLUMNS]
    rows = [[str(g["op"]), f"{g['group']}[{g['ranks']}]", f"{g['algo']}/{g['protocol']}",
             fmt_bytes_range(g["nbytes_min"], g["nbytes_max"]),
             _span(g["time_us_min"] * 1e-6, g["time_us_max"] * 1e-6, fmt),
             _span(g["busbw_gbps_min"], g["busbw_gbps_max"], lambda v: f"{v:.0f}"), fmt_count(g["count"]),
             str(g["source"])] for g in groups]
    if not measured:
        columns, rows = columns[:-1], [row[:-1] for row in rows]
    title = "collectives chosen" + ("" if measured else " (analytic model)")
    return fitted_table(title, columns, rows, width)


def print_report(r: StepResult, console: Console | None = None, *, tokens: float | None = None,
                 band: ErrorBand | None = None, settings: Mapping[str, Any] | None = None) -> None:
    """The report; `band` (sim/results/error_band.py) adds the model's error next to the headline figures;
    `settings` what the out-of-memory banner needs beyond the config echo (not_fit_banner)."""
    console = console or make_console()
    banner = not_fit_banner(r, settings)
    if banner is not None:
        console.print(banner)
    console.print(headline(r, tokens, band))
    for make in (memory_table, critical_path_table):
        print_fitted(console, make(r, console.width))
    console.print("The rows above add up to the step; the streams below run at the same time, so their busy "
                  "times overlap and do not add up. The compute stream waits whenever it has nothing it may run.",
                  highlight=False)
    for make in (stream_table, top_ops_table, collectives_table):
        print_fitted(console, make(r, console.width))


def results_json_text(r: StepResult, *, full_critical_path: bool = False) -> str:
    """The results JSON: indented headline fields, then the long lists with one item per line (the
    critical path has one entry per op on it; json's indenting encoder is ~5x slower than this). A
    non-finite number is refused (userio.dumps_finite), never written as Infinity / NaN."""
    data = r.to_dict(full_critical_path=full_critical_path)
    lists = {key: data.pop(key) for key in ("collectives", "critical_path") if key in data}
    text = dumps_finite(data, indent=1)[:-2]  # drop the closing "\n}"; never Infinity / NaN
    for key, items in lists.items():
        rows = dumps_finite(items)[1:-1].replace("}, {", "},\n  {")  # items hold scalars only
        text += f',\n "{key}": [\n  {rows}\n ]' if items else f',\n "{key}": []'
    return text + "\n}\n"


def write_results_json(r: StepResult, path: str | Path, *, full_critical_path: bool = False) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = results_json_text(r, full_critical_path=full_critical_path)
    with open_own_for_writing(path) as fh:  # never through a link made after the checks
        fh.write(text)
    return path


def write_outputs(r: StepResult, events: Iterable[Event], out_dir: str | Path | None, *, html: bool = True,
                  level: str = "all", full_critical_path: bool = False) -> dict[str, Path]:
    """Write into out_dir, by `level` (OUTPUT_LEVELS): nothing; results.json; or results.json, trace.json
    and (unless html=False) timeline.html. Only those files."""
    if level == "none":
        return {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": write_results_json(r, out / OUTPUT_FILES["results"], full_critical_path=full_critical_path)}
    if level == "results":
        return paths
    events = events if isinstance(events, Sequence) else list(events)  # an EventRows: streamed, never listed
    paths["trace"] = write_trace(out / OUTPUT_FILES["trace"], events, r.critical_path, result=r)
    release_freed_memory()  # the trace writer's tables: the timeline's peak starts from the heap without them
    if html:
        title = f"{r.scenario}: step {fmt_s(r.step_time_s)}"
        paths["timeline"] = write_timeline(out / OUTPUT_FILES["timeline"], events, r.critical_path, title, result=r)
    return paths
