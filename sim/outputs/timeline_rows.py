"""The timeline's per-event selections over an EventRows' arrays, no Event built but the hovered ones.

sim/outputs/timeline.py picks events by their fields (lanes, categories, hovered micro-batches, pipeline
stages, the critical path, the zoom window) with one Python step per event over Event tuples: the
reference, kept for tuples of Event. Over an EventRows the same picks are numpy selections on the columns
and on the op-field codes of sim/outputs/row_fields.py, which give each row the code of its op's field
value (equal values share a code, so a test by equality or membership on values is one on codes).
Every function here returns what its counterpart in timeline.py returns for the same events (indexes in
log order, the same sets, the same floats); tests/test_timeline_rows.py checks the whole figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from meshsim.sim.engine.events import STREAMS
from meshsim.sim.outputs.row_fields import dense_unique, member, op_codes, path_keys, row_keys, used_codes


class RowView:
    """An EventRows' columns and op-field codes, each built when first read."""

    def __init__(self, events) -> None:
        self.events = events
        c = events.columns
        self.rank, self.op_id, self.start, self.end = c.rank, c.op_id, c.start_s, c.end_s
        self._codes: dict[str, tuple[np.ndarray, list]] = {}

    def codes(self, field: str) -> tuple[np.ndarray, list]:
        if field not in self._codes:
            self._codes[field] = op_codes(self.events, field)
        return self._codes[field]

    def where(self, field: str, test) -> np.ndarray:
        """Per row: test(value of its op's `field`), evaluated once per distinct value (bool array)."""
        codes, values = self.codes(field)
        passed = np.zeros(len(values), dtype=bool)
        for c in used_codes(codes, len(values)).tolist():
            passed[c] = test(values[c])
        return passed[codes]

    def present(self, field: str, rows: np.ndarray | None = None) -> list:
        """The distinct values of `field` among the rows (all by default), in code order."""
        codes, values = self.codes(field)
        return [values[c] for c in used_codes(codes if rows is None else codes[rows], len(values)).tolist()]

    @cached_property
    def lane_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct rank * S + stream code, per row its index among them), S = number of stream codes."""
        codes, values = self.codes("stream")
        return dense_unique(self.rank.astype(np.int64) * max(len(values), 1) + codes)


def lane_names(view: RowView) -> dict[tuple[int, str], int]:
    """timeline._lane_names."""
    pairs, _ = view.lane_pairs
    _, values = view.codes("stream")
    width = max(len(values), 1)
    keys = {(r, values[s]) for r, s in zip((pairs // width).tolist(), (pairs % width).tolist(), strict=True)}
    return {k: i for i, k in enumerate(sorted(keys, key=lambda k: (k[0], STREAMS.index(k[1]))))}


def lanes_of(view: RowView, lanes: dict[tuple[int, str], int]) -> np.ndarray:
    """Per row: its lane (timeline._Columns.lane), int32 where every lane id fits (they are read as exact
    numbers: sorted, compared, made floats), else int64."""
    pairs, inverse = view.lane_pairs
    _, values = view.codes("stream")
    width = max(len(values), 1)
    ids = [lanes[(r, values[s])] for r, s in zip((pairs // width).tolist(), (pairs % width).tolist(), strict=True)]
    fits = all(-2**31 <= i < 2**31 for i in ids)
    lane = np.array(ids, dtype=np.int32 if fits else np.int64)
    return lane[inverse] if len(pairs) else np.zeros(0, np.int64)


def with_hover(view: RowView, hover_ops: int) -> np.ndarray:
    """timeline._with_hover as a bool mask over rows."""
    mbs = [v for v in view.present("micro_batch") if v is not None]
    keep = {0, max(mbs)} if mbs else set()
    mask = view.where("micro_batch", lambda v: v is None or v in keep)
    first = np.flatnonzero(mask)[:hover_ops]
    out = np.zeros(len(mask), dtype=bool)
    out[first] = True
    return out


def by_category(view: RowView) -> dict:
    """category -> its rows (int64, in log order)."""
    codes, values = view.codes("category")
    return {values[c]: np.flatnonzero(codes == c) for c in used_codes(codes, len(values)).tolist()}


def on_path(view: RowView, critical_path: Sequence) -> np.ndarray:
    """Rows whose (rank, op id) is on the critical path (int64, log order)."""
    keys = row_keys(view.rank, view.op_id)
    return np.flatnonzero(member(keys, np.sort(path_keys(critical_path))) >= 0)  # repeats: found all the same


def pipeline_stages(view: RowView) -> list[int]:
    """timeline.pipeline_stages."""
    codes, values = view.codes("layer")
    has = view.where("layer", lambda v: v is not None)
    width = max(len(values), 1)
    pairs, _ = dense_unique(view.rank[has].astype(np.int64) * width + codes[has])
    layers: dict[int, set] = {}
    for rank, code in zip((pairs // width).tolist(), (pairs % width).tolist(), strict=True):
        layers.setdefault(rank, set()).add(values[code])
    stages: dict[frozenset, int] = {}
    for rank in sorted(layers):
        stages.setdefault(frozenset(layers[rank]), rank)
    return sorted(stages.values(), key=lambda r: min(layers[r]))


def middle_layer(view: RowView, rows: np.ndarray):
    """sim/results/breakdown.middle_layer of the given rows' events."""
    layers = sorted({v for v in view.present("layer", rows) if v is not None})
    return layers[len(layers) // 2] if layers else None


def _is_value(view: RowView, field: str, value) -> np.ndarray:
    return view.where(field, lambda v: v == value)


def compute_times(view: RowView, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the rank's compute events, in log order (timeline_zoom.Busy's input)."""
    sel = (view.rank == rank) & _is_value(view, "category", "compute")
    return view.start[sel], view.end[sel]


def spans(view: RowView, rank: int) -> list[tuple[float, float]]:
    """timeline._spans of the rank's events."""
    mine = np.flatnonzero(view.rank == rank)
    layer = middle_layer(view, mine)
    sel = mine[_is_value(view, "layer", layer)[mine] & view.where("phase", lambda v: v in ("fwd", "bwd"))[mine]]
    mb, phase = view.codes("micro_batch")[0][sel].tolist(), view.codes("phase")[0][sel].tolist()
    out: dict[tuple, list[float]] = {}
    for key, s, e in zip(zip(mb, phase, strict=True), view.start[sel].tolist(), view.end[sel].tolist(), strict=True):
        span = out.setdefault(key, [s, e])
        span[0], span[1] = min(span[0], s), max(span[1], e)
    return sorted((a, b) for a, b in out.values() if b > a)


def forward_window(view: RowView, rank: int) -> tuple[float, float] | None:
    """The single-stage zoom: (first start, last end) of the middle layer's forward ops of micro-batch 0 (or
    outside micro-batches) on `rank`, None if there are none."""
    mine = np.flatnonzero(view.rank == rank)
    layer = middle_layer(view, mine)
    sel = mine[_is_value(view, "layer", layer)[mine] & _is_value(view, "phase", "fwd")[mine]
               & view.where("micro_batch", lambda v: v in (0, None))[mine]]
    if not len(sel):
        return None
    return min(view.start[sel].tolist()), max(view.end[sel].tolist())
