"""The terminal report of one simulated step (rich), and `write_outputs` for the three output files.

Sections: headline numbers; memory per GPU (and whether it fits); where the representative rank's time
goes; the critical path's shares by category and its top op types; the collective algorithms chosen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshsim.sim.core.console import make_console
from meshsim.sim.core.units import format_size
from meshsim.sim.engine.events import Event
from meshsim.sim.outputs.timeline import write_timeline
from meshsim.sim.outputs.trace import write_trace
from meshsim.sim.results.critical_path import top_op_types
from meshsim.sim.results.step_result import MEMORY_KEYS, StepResult

OUTPUT_FILES = {"results": "results.json", "trace": "trace.json", "timeline": "timeline.html"}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _gb(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def headline(r: StepResult) -> str:
    c = r.config
    pipe = f" pp={c['pp']} vp={c.get('vp', 1)}" if c.get("pp", 1) > 1 else ""
    cfg = (f"tp={c.get('tp')}{pipe} sp={'on' if c.get('sp') else 'off'} dp={c.get('dp')} on {c.get('gpus')} x "
           f"{c.get('gpu')} ({c.get('nodes')} x {c.get('topology')}), micro_batch={c.get('micro_batch')} x "
           f"{c.get('micro_batches')}, recompute={c.get('recompute')}")
    return (f"[bold]{r.scenario}[/bold]  {cfg}\n"
            f"step [bold]{r.step_time_s * 1e3:.2f} ms[/bold]   {r.tokens_per_s:,.0f} tokens/s   "
            f"{r.tflops_per_gpu:.1f} TFLOP/s per GPU   MFU [bold]{_pct(r.mfu)}[/bold]   "
            f"layer fwd {r.layer_fwd_ms:.3f} ms / bwd {r.layer_bwd_ms:.3f} ms")


def memory_table(r: StepResult) -> Table:
    m = r.memory_gb
    t = Table(title="memory per GPU (GB)", title_justify="left")
    keys = tuple(k for k in MEMORY_KEYS if k != "fits")
    for key in keys:
        t.add_column(key, justify="right")
    t.add_column("fits")
    fits = "[green]yes[/green]" if m.get("fits") else "[red]NO[/red]"
    t.add_row(*(_gb(m.get(k, 0.0)) for k in keys), fits)
    return t


def time_table(r: StepResult) -> Table:
    t = Table(title="where the time goes (rank 0)", title_justify="left")
    for col in ("", "ms", "% of step"):
        t.add_column(col, justify="right" if col else "left")
    for key, value in r.breakdown_s.items():
        t.add_row(key, f"{value * 1e3:.2f}", _pct(value / r.step_time_s if r.step_time_s else 0.0))
    t.add_section()
    for key, share in r.critical_path_share.items():
        t.add_row(f"critical path: {key}", f"{share * r.step_time_s * 1e3:.2f}", _pct(share))
    return t


def top_ops_table(r: StepResult, n: int = 8) -> Table:
    t = Table(title="top critical-path op types", title_justify="left")
    for col, just in (("op type", "left"), ("category", "left"), ("ms", "right"), ("count", "right"),
                      ("% of step", "right")):
        t.add_column(col, justify=just)
    for kind, cat, total_us, count in top_op_types(r.critical_path, n):
        share = total_us / (r.step_time_s * 1e6) if r.step_time_s else 0.0
        t.add_row(kind, cat, f"{total_us / 1e3:.2f}", str(count), _pct(share))
    return t


def _span(lo: float, hi: float, fmt: str) -> str:
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}-{format(hi, fmt)}"


def collective_groups(rows) -> list[dict]:
    """Distinct collectives grouped by (op, group, ranks, algo, protocol, source): size/time/busbw ranges."""
    groups: dict[tuple, list] = {}
    for c in rows:
        key = tuple(c.get(k) for k in ("op", "group", "ranks", "algo", "protocol", "source"))
        groups.setdefault(key, []).append(c)
    out = []
    for key, items in groups.items():
        out.append({**dict(zip(("op", "group", "ranks", "algo", "protocol", "source"), key, strict=True)),
                    "count": sum(int(c.get("count", 0)) for c in items),
                    **{f"{k}_{end}": fn(float(c.get(k, 0.0)) for c in items)
                       for k in ("nbytes", "time_us", "busbw_gbps") for end, fn in (("min", min), ("max", max))}})
    return out


def collectives_table(r: StepResult) -> Table:
    groups = collective_groups(r.collectives)
    measured = any(g["source"] == "calibrated" for g in groups)
    t = Table(title="collectives chosen" + ("" if measured else " (analytic model)"), title_justify="left")
    cols = ["op", "group", "algo/proto", "size", "us each", "busbw GB/s", "calls"] + (["source"] if measured else [])
    for col in cols:
        t.add_column(col, justify="left" if col in ("op", "group", "algo/proto", "source") else "right",
                     no_wrap=col == "op")
    for g in groups:
        lo, hi = format_size(int(g["nbytes_min"])), format_size(int(g["nbytes_max"]))
        row = [str(g["op"]), f"{g['group']}{g['ranks']}", f"{g['algo']}/{g['protocol']}", lo if lo == hi else f"{lo}-{hi}",
               _span(g["time_us_min"], g["time_us_max"], ".1f"), _span(g["busbw_gbps_min"], g["busbw_gbps_max"], ".0f"),
               str(g["count"])]
        t.add_row(*row, *([str(g["source"])] if measured else []))
    return t


def print_report(r: StepResult, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(headline(r))
    for table in (memory_table(r), time_table(r), top_ops_table(r), collectives_table(r)):
        console.print(table)


def results_json_text(r: StepResult) -> str:
    """The results JSON: indented headline fields, then the long lists with one item per line (the
    critical path has one entry per op on it; json's indenting encoder is ~5x slower than this)."""
    data = r.to_dict()
    lists = {key: data.pop(key) for key in ("collectives", "critical_path")}
    text = json.dumps(data, indent=1)[:-2]  # drop the closing "\n}"
    for key, items in lists.items():
        rows = json.dumps(items)[1:-1].replace("}, {", "},\n  {")  # items hold scalars only
        text += f',\n "{key}": [\n  {rows}\n ]' if items else f',\n "{key}": []'
    return text + "\n}\n"


def write_results_json(r: StepResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results_json_text(r))
    return path


def write_outputs(r: StepResult, events: Iterable[Event], out_dir: str | Path, *, html: bool = True
                  ) -> dict[str, Path]:
    """Write results.json, trace.json and (unless html=False) timeline.html into out_dir; only those."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    events = list(events)
    paths = {"results": write_results_json(r, out / OUTPUT_FILES["results"]),
             "trace": write_trace(out / OUTPUT_FILES["trace"], events, r.critical_path,
                                  steady_state=r.steady_state)}
    if html:
        title = f"{r.scenario}: step {r.step_time_s * 1e3:.2f} ms"
        paths["timeline"] = write_timeline(out / OUTPUT_FILES["timeline"], events, r.critical_path, title,
                                           steady_state=r.steady_state)
    return paths
