"""Plotly figures of a sweep and one self-contained report page (report.html).

- throughput_figure: tokens/s and MFU against tp, one line per setting of the other axes (sp, overlap,
  micro-batch, recompute); configurations that do not fit drawn as open markers; the sweet spot starred.
- breakdown_figure: step time per configuration split along the critical path
  (critical_path_share x step_time_s, every category), one horizontal bar per configuration.
- memory_figure: memory per GPU against tp with the GPU capacity as a dashed line.
- report_html: the three figures, the results table and the explanation in one HTML file that embeds
  plotly.js exactly once (no network needed to open it).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from meshsim.sim.core.fmt import fmt_count, fmt_gb_as_gib, fmt_s, gb_to_gib, time_unit
from meshsim.sim.results.critical_path import CATEGORY_COLORS
from meshsim.sim.sweep.axes import AXES
from meshsim.sim.sweep.explain_terms import AXIS_LABELS, fits, label, ok, sweet_spot, varying_axes
from meshsim.sim.sweep.record import SweepRecord
from meshsim.sim.sweep.table import category_name, report_columns, report_rows, share_categories

if TYPE_CHECKING:
    import plotly.graph_objects as go


def _series(records: list[SweepRecord]) -> dict[str, list[SweepRecord]]:
    """Ran configurations grouped by every varying axis except tp -> {series label: records by tp}."""
    axes = [a for a in varying_axes(records) if a != "tp"]
    groups: dict[str, list[SweepRecord]] = {}
    for rec in records:
        if ok(rec):
            groups.setdefault(label(rec, axes) or "all", []).append(rec)
    return {name: sorted(recs, key=lambda r: r.point.tp) for name, recs in groups.items()}


def _tp_axis(records: list[SweepRecord]) -> dict:
    tps = sorted({r.point.tp for r in records})
    return dict(type="log", tickvals=tps, ticktext=[str(t) for t in tps], title="tensor-parallel degree (tp)")


def _hover(rec: SweepRecord, axes: list[str]) -> str:
    r = rec.result
    state = "fits" if fits(rec) else "does NOT fit"
    return (f"{label(rec, axes)}<br>{fmt_count(r.tokens_per_s)} tokens/s, MFU {100 * r.mfu:.1f}%<br>"
            f"step {fmt_s(r.step_time_s)}<br>{fmt_gb_as_gib(r.memory_gb.total)} per GPU ({state})")


def throughput_figure(records: list[SweepRecord]) -> go.Figure:
    """tokens/s (left) and MFU (right) against tp, per series; the sweet spot starred."""
    import plotly.graph_objects as go  # heavy (~0.3 s): imported only when a sweep report is drawn
    from plotly.subplots import make_subplots  # heavy, as above

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Throughput (tokens/s)", "MFU"))
    axes, best = varying_axes(records), sweet_spot(records)
    for i, (name, recs) in enumerate(_series(records).items()):
        for col, metric in ((1, "tokens_per_s"), (2, "mfu")):
            fig.add_trace(go.Scatter(
                x=[r.point.tp for r in recs], y=[r.result[metric] for r in recs], mode="lines+markers",
                name=name, legendgroup=name, showlegend=col == 1, line=dict(color=_color(i)),
                marker=dict(size=9, symbol=["circle" if fits(r) else "circle-open" for r in recs]),
                hovertext=[_hover(r, axes) for r in recs], hoverinfo="text"), row=1, col=col)
    if best is not None:
        for col, metric in ((1, "tokens_per_s"), (2, "mfu")):
            fig.add_trace(go.Scatter(
                x=[best.point.tp], y=[best.result[metric]], mode="markers", name="sweet spot",
                legendgroup="best", showlegend=col == 1, hovertext=[_hover(best, axes)], hoverinfo="text",
                marker=dict(symbol="star", size=18, color="gold", line=dict(color="black", width=1))),
                row=1, col=col)
    fig.update_xaxes(**_tp_axis(records))
    fig.update_yaxes(tickformat=",~r", row=1, col=1)  # 100,000 rather than 100k or 1e+5
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_layout(title="Throughput and MFU against tp (open markers: does not fit in memory)", height=430)
    return fig


BAR_PX = 24  # height per configuration of the breakdown: a label per bar, whatever their number
BAR_MARGIN_PX = 160  # title, legend and axis


def breakdown_figure(records: list[SweepRecord]) -> go.Figure:
    """Stacked step time per configuration, split by the critical path's categories (the one category list,
    then any other a result carries), in the time unit of the table's step column. Horizontal bars, one
    row of BAR_PX per configuration, labels on the y axis: every label stays readable at 40 bars or 400."""
    import plotly.graph_objects as go  # heavy (~0.3 s): imported only when a sweep report is drawn

    axes, best = varying_axes(records), sweet_spot(records)
    ran = [r for r in records if ok(r)]
    names = [label(r, axes) + (" *" if r is best else "") for r in ran]
    unit, scale = time_unit([r.result.step_time_s for r in ran] or [1.0])
    fig = go.Figure()
    for cat in share_categories(ran):
        values = [r.result.step_time_s * r.result.critical_path_share.get(cat, 0.0) / scale for r in ran]
        fig.add_trace(go.Bar(y=names, x=values, orientation="h", name=category_name(cat),
                             marker_color=CATEGORY_COLORS.get(cat, "#888888")))
    fig.update_yaxes(autorange="reversed", automargin=True, type="category")
    fig.update_layout(barmode="stack", height=BAR_MARGIN_PX + BAR_PX * max(1, len(ran)),
                      xaxis_title=f"step time ({unit})",
                      title="Step time along the critical path per configuration (* = sweet spot)")
    return fig


def memory_figure(records: list[SweepRecord]) -> go.Figure:
    """Memory per GPU against tp with the capacity line."""
    import plotly.graph_objects as go  # heavy (~0.3 s): imported only when a sweep report is drawn

    fig = go.Figure()
    axes, best = varying_axes(records), sweet_spot(records)
    for i, (name, recs) in enumerate(_series(records).items()):
        fig.add_trace(go.Scatter(
            x=[r.point.tp for r in recs], y=[gb_to_gib(r.result.memory_gb.total) for r in recs],
            mode="lines+markers", name=name, line=dict(color=_color(i)),
            hovertext=[_memory_hover(r, axes) for r in recs], hoverinfo="text"))
    ran = [r for r in records if ok(r)]
    if ran:
        capacity = ran[0].result.memory_gb.capacity
        fig.add_hline(y=gb_to_gib(capacity), line_dash="dash", line_color="red",
                      annotation_text=f"capacity {fmt_gb_as_gib(capacity)}", annotation_position="top left")
    if best is not None:
        fig.add_trace(go.Scatter(x=[best.point.tp], y=[gb_to_gib(best.result.memory_gb.total)],
                                 mode="markers", name="sweet spot", hovertext=[_memory_hover(best, axes)],
                                 hoverinfo="text", marker=dict(symbol="star", size=18, color="gold",
                                                               line=dict(color="black", width=1))))
    fig.update_xaxes(**_tp_axis(records))
    fig.update_layout(title="Memory per GPU against tp", yaxis_title="GiB per GPU", height=430)
    return fig


def _memory_hover(rec: SweepRecord, axes: list[str]) -> str:
    m = rec.result.memory_gb
    parts = ", ".join(f"{k} {fmt_gb_as_gib(getattr(m, k))}" for k in ("weights", "grads", "optimizer", "activations", "workspace"))
    return f"{label(rec, axes)}<br>total {fmt_gb_as_gib(m.total)} of {fmt_gb_as_gib(m.capacity)}<br>{parts}"


def _color(i: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
    return palette[i % len(palette)]


def figures(records: list[SweepRecord]) -> list[go.Figure]:
    return [throughput_figure(records), breakdown_figure(records), memory_figure(records)]


def report_html(records: list[SweepRecord], explanation: list[str], title: str) -> str:
    """One self-contained page: explanation, figures (plotly.js embedded once) and the table."""
    best = sweet_spot(records)
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures(records))]
    header = "".join(f"<th>{html.escape(c)}</th>" for c in report_columns(records))
    rows = "".join(
        ("<tr class='best'>" if r is best else "<tr>") + "".join(f"<td>{html.escape(v)}</td>" for v in row)
        + "</tr>" for r, row in zip(records, report_rows(records), strict=True))
    reasons = "".join(f"<li>{html.escape(s)}</li>" for s in explanation)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<h2>Why</h2><ul>{reasons}</ul>" + "".join(f"<div class='fig'>{p}</div>" for p in parts)
            + f"<h2>All configurations</h2><table><tr>{header}</tr>{rows}</table></body></html>")


def sweep_title(records: list[SweepRecord], name: str) -> str:
    """'tp x pp x sp sweep of NAME': the axes that take more than one value (sweep order), not a fixed word."""
    swept = [AXIS_LABELS[a] for a in AXES if len({getattr(r.point, a) for r in records}) > 1]
    what = " x ".join(swept) + " sweep" if swept else f"{len(records)}-configuration sweep"
    return f"{what} of {name}"


REPORT_NAME = "report.html"


def write_report(records: list[SweepRecord], explanation: list[str], title: str, out_dir: str | Path) -> Path:
    path = Path(out_dir) / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html(records, explanation, title))
    return path


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right} tr.best{background:#fff3b0}"
        "li{margin:.3em 0}")
