"""A self-contained plotly HTML of bus bandwidth against message size (log x), one line per algorithm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from meshsim.sim.cost.collectives.nccl_table import Row


def busbw_figure(curves: Mapping[str, Sequence[Row]], title: str):
    import plotly.graph_objects as go  # heavy: imported only when a plot is asked for

    fig = go.Figure()
    for label, rows in curves.items():
        auto = label == "auto"
        fig.add_trace(go.Scatter(
            x=[r.bytes for r in rows], y=[r.busbw_gbps for r in rows], name=label,
            mode="lines+markers", line={"width": 4 if auto else 2, "dash": "dot" if auto else "solid"},
            text=[r.algorithm for r in rows],
            hovertemplate="%{x} B<br>busbw %{y:.1f} GB/s<br>%{text}<extra>" + label + "</extra>"))
    fig.update_layout(title=title, xaxis={"title": "message size (bytes)", "type": "log"},
                      yaxis={"title": "bus bandwidth (GB/s)"}, template="plotly_white")
    return fig


def write_busbw_html(curves: Mapping[str, Sequence[Row]], title: str, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    busbw_figure(curves, title).write_html(str(path), include_plotlyjs=True, full_html=True)
    return path
