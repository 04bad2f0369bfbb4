"""A self-contained interactive timeline (plotly HTML, plotly.js embedded, works offline).

One horizontal lane per (rank, stream), labelled with the rank's tp/dp/pp/node position; each op is a
bar from its start to its end, coloured by category. Critical-path ops carry a thin dark line through
their bar ("critical path" legend entry, toggleable). The page opens zoomed on the forward pass of one
representative layer (the middle layer, micro-batch 0; with a pipeline, past the warm-up, where every stage
is busy); a range slider under the plot reaches the rest
of the step. Hovering a bar's centre shows the op, its duration and whether it is on the critical path;
a collective adds its kind, algorithm/protocol, group, size and busbw; a compute op its FLOPs.

Sized for a browser: hover text is kept for micro-batches 0 and last and the ops outside micro-batches
(DP reduction, optimizer), HOVER_OPS at most; the other micro-batches repeat them and are drawn
without hover, and back-to-back ops of one category on one lane are drawn as one bar (merged_runs),
which keeps a 20k-op step to a few MB.

Scales to hundreds of thousands of ops: bars are WebGL line segments (scattergl, segments separated by
NaN), one trace per category, plus one invisible marker trace per category carrying the hover text,
never one trace object per op; coordinates are embedded as base64 float32 typed arrays. The runs of
back-to-back ops and the busy intervals are found with numpy (`lane_runs`: a sort and a per-lane
running maximum, in sim/outputs/timeline_zoom.py), giving the same floats as the loop over sorted tuples they replace
(tests/test_timeline_runs.py checks the two over generated events).

The figure is a plain dict in plotly.js's schema (`timeline_spec`), written to HTML without importing
plotly (sim/outputs/plotly_page.py); `timeline_figure` wraps it in a plotly Figure for notebooks and tests.
An extrapolated step (sim/results/steady_state.py) shows its simulated micro-batches, and a shaded band where the
extrapolated periods go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import is_not
from pathlib import Path
from typing import Any

import numpy as np

from meshsim.sim.core.fmt import fmt_bytes, fmt_gbps, fmt_s
from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.outputs import timeline_rows as rows
from meshsim.sim.outputs.plotly_page import template, typed_array, write_page
from meshsim.sim.outputs.timeline_zoom import event_times, lane_runs, zoom_range_ms
from meshsim.sim.results.critical_path import CATEGORY_COLORS, Segment, critical_ops
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.results.steady_state import SteadyState
from meshsim.sim.results.step_result import StepResult

COLOURS = CATEGORY_COLORS
BAR_PX = 16
HOVER_OPS = 20_000
MERGE_GAP_S = 1e-9  # ops closer than this on one lane are drawn as one bar


def _lane_names(events: Sequence[Event]) -> dict[tuple[int, str], int]:
    keys = sorted({(e.rank, e.stream) for e in events}, key=lambda k: (k[0], STREAMS.index(k[1])))
    return {k: i for i, k in enumerate(keys)}


def _hover_detail(ev: Event, critical: bool, row: CollectiveRow | None) -> str:
    """The hover text after the op's name: duration, wait, collective or bytes, FLOPs. Kept short: every
    '<' and '>' costs 6 bytes in the HTML (plotly escapes them)."""
    text = f"{fmt_s(ev.dur_s)}{' critical' if critical else ''}"
    if ev.wait_s > 0:
        text += f" (waited {fmt_s(ev.wait_s)})"
    if row is not None:
        text += (f"<br>{row.op} {row.algo}/{row.protocol} on {row.group}"
                 f"[{row.ranks}], {fmt_bytes(ev.bytes)}, busbw {fmt_gbps(float(row.busbw_gbps))}")
    elif ev.bytes:
        text += f", {fmt_bytes(ev.bytes)}"
    if ev.flops:
        text += f", {ev.flops / 1e9:,.1f} GFLOP"
    return text


def _hover_texts(events: Sequence[Event], picked: Sequence[int], hovered: set[int], crit: set, by_op: Mapping
                 ) -> list[str | None]:
    """Hover text ("name<br>detail") of each picked event that keeps one (None for the others). The detail
    is the same for every micro-batch's copy of an op, so it is formatted once per distinct
    (duration, critical, wait, collective row, bytes, FLOPs)."""
    at = [k for k, i in enumerate(picked) if i in hovered]
    return _fill_texts([None] * len(picked), at, (events[picked[k]] for k in at), crit, by_op)


def _hover_texts_rows(events, picked: np.ndarray, shown: np.ndarray, crit: set, by_op: Mapping) -> list[str | None]:
    """_hover_texts over an EventRows: `shown` a bool mask over rows (timeline_rows.with_hover); only the
    shown events are built, in order, and formatted as _hover_texts formats them."""
    texts: list[str | None] = [None] * len(picked)
    at = np.flatnonzero(shown[picked])
    hovered = events.take(picked[at])
    return _fill_texts(texts, at.tolist(), hovered, crit, by_op)


def _fill_texts(texts: list, at: Sequence[int], hovered: Iterable[Event], crit: set, by_op: Mapping) -> list:
    """texts[at[k]] = the hover text ("name<br>detail") of the k-th hovered event; the detail is formatted once
    per distinct (duration, critical, wait, collective row, bytes, FLOPs)."""
    details: dict[tuple, str] = {}
    for k, ev in zip(at, hovered, strict=True):
        key = (ev.rank, ev.op_id)
        critical, row = key in crit, by_op.get(key)
        memo = (ev.end_s - ev.start_s, critical, ev.wait_s, id(row) if row is not None else None, ev.bytes, ev.flops)
        detail = details.get(memo)
        if detail is None:
            detail = details[memo] = _hover_detail(ev, critical, row)
        texts[k] = f"{ev.name}<br>{detail}"
    return texts


def _with_hover(events: Sequence[Event]) -> set[int]:
    """Indexes of the events that keep hover text: micro-batches 0 and last and the ops outside any
    micro-batch, then the rest in order, HOVER_OPS at most."""
    mbs = [e.micro_batch for e in events if e.micro_batch is not None]
    keep = {0, max(mbs)} if mbs else set()
    first = [i for i, e in enumerate(events) if e.micro_batch is None or e.micro_batch in keep]
    return set(first[:HOVER_OPS])


class _Columns:
    """Every event's lane, start and end as arrays, built once per timeline and sliced per trace."""

    def __init__(self, events: Sequence[Event], lanes: dict[tuple[int, str], int], view: rows.RowView | None = None):
        if view is not None:  # an EventRows' arrays
            self.lane = rows.lanes_of(view, lanes)
        else:
            self.lane = np.fromiter((lanes[(e.rank, e.stream)] for e in events), np.int64, len(events))
        self.start, self.end = event_times(events, "start_s"), event_times(events, "end_s")
        if np.any(self.end < self.start):  # the vectorised merge assumes end >= start, as an event log has
            raise ValueError("an event ends before it starts")

    def runs(self, picked: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """lane_runs of the picked events (all by default), MERGE_GAP_S apart."""
        if picked is None:
            return lane_runs(self.lane, self.start, self.end, MERGE_GAP_S)
        return lane_runs(self.lane, self.start, self.end, MERGE_GAP_S, picked)


def merged_runs(events: Sequence[Event], lanes: dict[tuple[int, str], int]) -> list[tuple[int, float, float]]:
    """(lane, start_s, end_s) of maximal runs of back-to-back events on one lane: drawn in one colour,
    a run looks exactly like its ops side by side, at a fraction of the bytes (a compute stream is
    mostly one run per gap)."""
    lane, start, end = _Columns(events, lanes).runs()
    return list(zip(lane.tolist(), start.tolist(), end.tolist(), strict=True))


def _segment_arrays(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[dict, dict]:
    """x = [start, end, NaN] per run of ops (ms), y = [lane, lane, NaN]: NaN breaks the line between bars.
    float32 typed arrays: lane ids are exact, times (ms) keep ~7 digits (0.5 us at 7 s), a fraction of
    the bytes of JSON lists."""
    x = np.full((len(lane), 3), np.nan)
    x[:, 0], x[:, 1] = start * 1e3, end * 1e3
    y = np.full((len(lane), 3), np.nan)
    y[:, 0] = y[:, 1] = lane
    return typed_array(x.ravel()), typed_array(y.ravel())


def _segments(events: Sequence[Event], lanes: dict[tuple[int, str], int]) -> tuple[dict, dict]:
    """_segment_arrays of the events' merged runs."""
    return _segment_arrays(*_Columns(events, lanes).runs())


def _category_traces(category: str, cols: _Columns, picked: np.ndarray, hover_texts: Sequence[str | None]
                     ) -> list[dict]:
    """The bars of the picked events (indexes into cols) and the invisible markers carrying their hover."""
    colour = COLOURS.get(category, "#888888")
    x, y = _segment_arrays(*cols.runs(picked))
    bars = {"type": "scattergl", "x": x, "y": y, "mode": "lines", "line": {"color": colour, "width": BAR_PX},
            "name": category, "legendgroup": category, "hoverinfo": "skip", "connectgaps": False}
    idx = list(compress(range(len(hover_texts)), map(is_not, hover_texts, repeat(None))))  # those with a text
    shown = picked[idx]
    hover = {"type": "scattergl", "x": typed_array((cols.start[shown] + cols.end[shown]) * 5e2),
             "y": typed_array(cols.lane[shown].astype(np.float64)), "mode": "markers",
             "marker": {"color": colour, "size": BAR_PX, "opacity": 0},
             "hovertext": [hover_texts[i] for i in idx], "hoverinfo": "text", "legendgroup": category,
             "showlegend": False, "name": category}
    return [bars, hover]


def _steady_state_band(layout: dict, steady_state: SteadyState | None) -> None:
    """A shaded band over the periods an extrapolated step did not simulate (sim/results/steady_state.py)."""
    if steady_state is None or not steady_state.periods:
        return
    start_ms = steady_state.gap_start_s * 1e3
    span_ms = steady_state.periods * steady_state.period_s * 1e3
    layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "y domain", "x0": start_ms, "x1": start_ms + span_ms,
                         "y0": 0, "y1": 1, "fillcolor": "#dddddd", "opacity": 0.5, "line": {"width": 0}}]
    layout["annotations"] = [{"text": f"{steady_state.periods} x {steady_state.period_s * 1e3:.4g} ms periods "
                              "extrapolated", "x": start_ms, "xref": "x", "xanchor": "left", "y": 1,
                              "yref": "y domain", "yanchor": "top", "showarrow": False}]


def timeline_spec(events: Iterable[Event], critical_path: Sequence[Segment] = (), title: str = "",
                  result: StepResult | None = None, steady_state: SteadyState | None = None) -> dict[str, Any]:
    """The figure as a plotly.js dict {"data": [...], "layout": {...}}. `result` (the run's StepResult,
    optional) adds collective details to the hover, mesh positions to the lane labels and, for an
    extrapolated step, the band of periods not simulated (or give `steady_state`)."""
    if steady_state is None and result is not None:
        steady_state = result.steady_state
    events = events if isinstance(events, Sequence) else list(events)  # an EventRows: read, never listed
    view = rows.RowView(events) if is_rows(events) else None
    # first, on a view of its own: its temporaries and the op codes only it reads (layer, phase) are freed
    # before the traces' data is built
    zoom = zoom_range_ms(events, rows.RowView(events) if view is not None else None)
    lanes = _lane_names(events) if view is None else rows.lane_names(view)
    crit = critical_ops(critical_path)
    by_op = result.op_collectives if result is not None else {}
    data: list[dict] = []
    cols = _Columns(events, lanes, view)
    if view is None:
        hovered = _with_hover(events)
        by_category: dict[str, list[int]] = {}
        for i, e in enumerate(events):
            by_category.setdefault(e.category, []).append(i)
        for category in COLOURS:
            picked = by_category.get(category)
            if picked:
                data += _category_traces(category, cols, np.array(picked, dtype=np.int64),
                                         _hover_texts(events, picked, hovered, crit, by_op))
        on_path = np.array([i for i, e in enumerate(events) if (e.rank, e.op_id) in crit], dtype=np.int64)
    else:
        shown = rows.with_hover(view, HOVER_OPS)
        grouped = rows.by_category(view)
        for category in COLOURS:
            picked = grouped.get(category)
            if picked is not None and len(picked):
                data += _category_traces(category, cols, picked, _hover_texts_rows(events, picked, shown, crit, by_op))
        on_path = rows.on_path(view, critical_path)
    if len(on_path):
        x, y = _segment_arrays(*cols.runs(on_path))
        data.append({"type": "scattergl", "x": x, "y": y, "mode": "lines", "line": {"color": "#222222", "width": 3},
                     "name": "critical path", "hoverinfo": "skip", "connectgaps": False})
    config = result.config if result is not None else None
    layout: dict[str, Any] = {
        "template": template("plotly_white"), "title": {"text": title}, "hovermode": "closest",
        "height": max(420, 200 + 40 * len(lanes)), "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        "xaxis": {"title": {"text": "time (ms)"}, "rangeslider": {"visible": True, "thickness": 0.08},
                  **({"range": list(zoom)} if zoom else {})},
        "yaxis": {"tickvals": list(lanes.values()),
                  "ticktext": [f"{config.rank_label(r) if config is not None else f'rank {r}'} · {s}" for r, s in lanes],
                  "autorange": "reversed", "zeroline": False, "showgrid": False, "fixedrange": True}}
    _steady_state_band(layout, steady_state)
    return {"data": data, "layout": layout}


def timeline_figure(events: Iterable[Event], critical_path: Sequence[Segment] = (), title: str = "",
                    result: StepResult | None = None, steady_state: SteadyState | None = None):
    """timeline_spec as a plotly Figure (validated), for notebooks and tests."""
    import plotly.graph_objects as go  # heavy (~0.3 s): only for callers who want a Figure object

    return go.Figure(timeline_spec(events, critical_path, title, result, steady_state))


def write_timeline(path: str | Path, events: Iterable[Event], critical_path: Sequence[Segment] = (),
                   title: str = "", result: StepResult | None = None, steady_state: SteadyState | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = timeline_spec(events, critical_path, title, result, steady_state)
    return write_page(path, spec, spec["layout"]["height"])
