"""A self-contained interactive timeline (plotly HTML, plotly.js embedded, works offline).

One horizontal lane per (rank, stream); each op is a bar from its start to its end, coloured by
category. Critical-path ops carry a thin dark line through their bar ("critical path" legend entry,
toggleable). Hovering a bar's centre shows op name, duration, bytes and FLOPs.

Scales to tens of thousands of ops: bars are WebGL line segments (go.Scattergl, segments separated by
NaN), one trace per category, plus one invisible marker trace per category carrying the hover text,
never one trace object per op; coordinates are numpy arrays, embedded as base64 typed arrays.
An extrapolated step (sim/results/steady_state.py) shows its simulated micro-batches, and a shaded band where the
extrapolated periods go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.results.critical_path import CATEGORY_COLORS, critical_ops

COLOURS = CATEGORY_COLORS
BAR_PX = 16


def _lane_names(events: Sequence[Event]) -> dict[tuple[int, str], int]:
    keys = sorted({(e.rank, e.stream) for e in events}, key=lambda k: (k[0], STREAMS.index(k[1])))
    return {k: i for i, k in enumerate(keys)}


def _hover(ev: Event) -> str:
    """Kept short: every '<' and '>' costs 6 bytes in the HTML (plotly escapes them)."""
    text = f"{ev.name}<br>{ev.category} {ev.phase} {ev.dur_s * 1e3:.4g} ms"
    if ev.wait_s > 0:
        text += f" (waited {ev.wait_s * 1e3:.4g})"
    if ev.bytes:
        text += f", {ev.bytes / 1e6:.4g} MB"
    if ev.flops:
        text += f", {ev.flops / 1e9:.4g} GFLOP"
    return text


def _segments(events: Sequence[Event], lanes: dict[tuple[int, str], int]) -> tuple[np.ndarray, np.ndarray]:
    """x = [start, end, NaN] per op (ms), y = [lane, lane, NaN]: NaN breaks the line between bars.
    numpy arrays travel as base64 typed arrays in the HTML (plotly >= 6), a fraction of JSON lists."""
    n = len(events)
    x, y = np.full(3 * n, np.nan), np.full(3 * n, np.nan, dtype=np.float32)  # lane ids are exact in f4
    x[0::3] = [e.start_s * 1e3 for e in events]
    x[1::3] = [e.end_s * 1e3 for e in events]
    y[0::3] = y[1::3] = [lanes[(e.rank, e.stream)] for e in events]
    return x, y


def _category_traces(category: str, events: Sequence[Event], lanes: dict) -> list[go.Scattergl]:
    colour = COLOURS.get(category, "#888888")
    x, y = _segments(events, lanes)
    bars = go.Scattergl(x=x, y=y, mode="lines", line={"color": colour, "width": BAR_PX}, name=category,
                        legendgroup=category, hoverinfo="skip", connectgaps=False)
    mid = np.array([(e.start_s + e.end_s) * 5e2 for e in events])
    hover = go.Scattergl(x=mid, y=y[0::3], mode="markers", marker={"color": colour, "size": BAR_PX, "opacity": 0},
                         hovertext=[_hover(e) for e in events], hoverinfo="text", legendgroup=category,
                         showlegend=False, name=category)
    return [bars, hover]


def _steady_state_band(fig: go.Figure, steady_state: Mapping | None) -> None:
    """A shaded band over the periods an extrapolated step did not simulate (sim/results/steady_state.py)."""
    if not steady_state or not steady_state.get("periods"):
        return
    start_ms = steady_state["gap_start_s"] * 1e3
    span_ms = steady_state["periods"] * steady_state["period_s"] * 1e3
    fig.add_vrect(x0=start_ms, x1=start_ms + span_ms, fillcolor="#dddddd", opacity=0.5, line_width=0,
                  annotation_text=f"{steady_state['periods']} x {steady_state['period_s'] * 1e3:.4g} ms periods "
                                  "extrapolated", annotation_position="top left")


def timeline_figure(events: Iterable[Event], critical_path: Sequence[Mapping] = (), title: str = "",
                    steady_state: Mapping | None = None) -> go.Figure:
    events = list(events)
    lanes = _lane_names(events)
    fig = go.Figure()
    for category in COLOURS:
        sel = [e for e in events if e.category == category]
        if sel:
            fig.add_traces(_category_traces(category, sel, lanes))
    crit = critical_ops(critical_path)
    on_path = [e for e in events if (e.rank, e.op_id) in crit]
    if on_path:
        x, y = _segments(on_path, lanes)
        fig.add_trace(go.Scattergl(x=x, y=y, mode="lines", line={"color": "#222222", "width": 3},
                                   name="critical path", hoverinfo="skip", connectgaps=False))
    _steady_state_band(fig, steady_state)
    fig.update_layout(title=title, xaxis_title="time (ms)", hovermode="closest", template="plotly_white",
                      height=max(320, 120 + 34 * len(lanes)),
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    fig.update_yaxes(tickvals=list(lanes.values()), ticktext=[f"rank {r} · {s}" for r, s in lanes],
                     autorange="reversed", zeroline=False, showgrid=False)
    return fig


def write_timeline(path: str | Path, events: Iterable[Event], critical_path: Sequence[Mapping] = (),
                   title: str = "", steady_state: Mapping | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = timeline_figure(events, critical_path, title, steady_state)
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
    return path
