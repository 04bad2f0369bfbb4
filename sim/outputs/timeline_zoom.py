"""Where the timeline opens, and the vectorised runs of back-to-back ops it draws.

`zoom_range_ms` picks the window the page opens on: the middle layer's forward pass of micro-batch 0, or with
a pipeline the first window of the last stage's middle layer where every stage is busy (never the warm-up).
`lane_runs` merges the intervals of one lane that touch or overlap, with numpy, into the floats the loop over
sorted tuples gives (tests/test_timeline_runs.py checks the two over generated events); `Busy` answers a
rank's compute time inside any window from those runs' prefix sums.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter

import numpy as np

from meshsim.sim.engine.event_rows import events_of_rank, is_rows
from meshsim.sim.engine.events import Event
from meshsim.sim.outputs import timeline_rows as rows
from meshsim.sim.results.breakdown import middle_layer

ZOOM_MARGIN = 0.05  # of the zoomed span, either side
NEAR_BEST = 0.9  # a pipeline opens on the first window whose least busy stage is this close to the best


def pipeline_stages(events: Sequence[Event]) -> list[int]:
    """One rank per pipeline stage (the lowest of the ranks that hold the same layers), in stage order;
    one rank when the step has no pipeline."""
    layers: dict[int, set] = {}
    for e in events:
        if e.layer is not None:
            layers.setdefault(e.rank, set()).add(e.layer)
    stages: dict[frozenset, int] = {}
    for rank in sorted(layers):
        stages.setdefault(frozenset(layers[rank]), rank)
    return sorted(stages.values(), key=lambda r: min(layers[r]))


class Busy:
    """A rank's compute time inside any window [a, b], from its merged compute intervals and their prefix
    sums (bisect: O(log n) a query)."""

    def __init__(self, events: Sequence[Event], times: tuple[np.ndarray, np.ndarray] | None = None):
        """From the events, or from `times`: (start, end) of the compute events, in their order."""
        if times is None:
            compute = [e for e in events if e.category == "compute"]
            times = event_times(compute, "start_s"), event_times(compute, "end_s")
        lane, starts, ends = lane_runs(np.zeros(len(times[0]), np.int64), times[0], times[1], 0.0)
        self.starts = starts.tolist()
        self.ends = ends.tolist()
        self.before = list(accumulate((e - s for s, e in zip(self.starts, self.ends, strict=True)), initial=0.0))

    def _upto(self, t: float) -> float:
        """Compute time in [0, t]."""
        i = bisect_right(self.starts, t)
        return self.before[i] - max(0.0, self.ends[i - 1] - t) if i else 0.0

    def within(self, a: float, b: float) -> float:
        return self._upto(b) - self._upto(a)


def spans(mine: Sequence[Event]) -> list[tuple[float, float]]:
    """[start, end] of the middle layer's ops among one rank's events, per (micro-batch, phase), in time order."""
    layer = middle_layer(mine)
    spans: dict[tuple, list[float]] = {}
    for e in mine:
        if e.layer == layer and e.phase in ("fwd", "bwd"):
            span = spans.setdefault((e.micro_batch, e.phase), [e.start_s, e.end_s])
            span[0], span[1] = min(span[0], e.start_s), max(span[1], e.end_s)
    return sorted((a, b) for a, b in spans.values() if b > a)


def zoom_range_ms(events: Sequence[Event], view: rows.RowView | None = None) -> tuple[float, float] | None:
    """[start, end] (ms) of the window the timeline opens on, padded by ZOOM_MARGIN. Without a pipeline,
    the middle layer's forward ops of micro-batch 0 on the lowest rank. With one, a window where every
    stage is busy: among the spans of the last stage's middle layer (one per micro-batch and phase), the
    earliest where the least busy stage computes at least NEAR_BEST of the largest such fraction: never
    the warm-up, where the later stages have not started. An EventRows (or its `view`) is read as arrays."""
    if view is not None or is_rows(events):
        return zoom_rows(view or rows.RowView(events))
    stages = pipeline_stages(events)
    if not stages:
        return None
    if len(stages) == 1:
        rank, layer = stages[0], middle_layer(events_of_rank(events, stages[0]))
        sel = [e for e in events if e.rank == rank and e.layer == layer and e.phase == "fwd"
               and e.micro_batch in (0, None)]
        if not sel:
            return None
        lo, hi = min(e.start_s for e in sel), max(e.end_s for e in sel)
    else:
        by_rank = {r: events_of_rank(events, r) for r in stages}
        busy = [Busy(by_rank[r]) for r in stages]
        windows = spans(by_rank[stages[-1]])
        if not windows:
            return None
        lo, hi = busiest(busy, windows)
    return padded(lo, hi)


def busiest(busy: Sequence[Busy], windows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The first window whose least busy stage computes at least NEAR_BEST of the best such fraction."""
    score = [min(b.within(*w) for b in busy) / (w[1] - w[0]) for w in windows]
    return next(w for w, sc in zip(windows, score, strict=True) if sc >= NEAR_BEST * max(score))


def zoom_rows(view: rows.RowView) -> tuple[float, float] | None:
    """zoom_range_ms over an EventRows' arrays (sim/outputs/timeline_rows.py), the same window."""
    stages = rows.pipeline_stages(view)
    if not stages:
        return None
    if len(stages) == 1:
        window = rows.forward_window(view, stages[0])
        return padded(*window) if window else None
    busy = [Busy((), rows.compute_times(view, r)) for r in stages]
    windows = rows.spans(view, stages[-1])
    return padded(*busiest(busy, windows)) if windows else None


def padded(lo: float, hi: float) -> tuple[float, float]:
    pad = (hi - lo) * ZOOM_MARGIN
    return (lo - pad) * 1e3, (hi + pad) * 1e3


def event_times(events: Sequence[Event], field: str) -> np.ndarray:
    """The events' `field` (start_s, end_s) as float64: the column itself, read-only, when they are an
    EventRows (no copy: 8 bytes an event, ~7 MB each at 10^6 events)."""
    if is_rows(events):
        column = getattr(events.columns, field).view()
        column.flags.writeable = False
        return column
    return np.fromiter(map(attrgetter(field), events), np.float64, len(events))


def lane_runs(lane: np.ndarray, start: np.ndarray, end: np.ndarray, gap_s: float, picked: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lane, start, end) of the maximal runs of intervals on one lane that touch or overlap (the next
    starts at most gap_s after the run's end so far), in (lane, start) order: the loop

        for lane, start, end in sorted(zip(lane, start, end)):
            if the lane's open run ends at e and start <= e + gap_s: e = max(e, end)   else: open a run

    vectorised. With every end >= its start, the run's end so far is the running maximum of the lane's ends
    (an earlier run ended before the current one's first start, which is <= every later end), so a run
    starts where the lane changes or start > (running max before it) + gap_s, and ends at the running max of
    its last interval: the same floats, no arithmetic but the comparison's one addition. `picked`: the
    runs of the intervals at those indexes only (lane_runs(lane[picked], start[picked], end[picked]))."""
    if picked is not None:  # the picked intervals only: sorted by index, no picked copy held beside the sorted one
        order = picked[np.lexsort((end[picked], start[picked], lane[picked]))]
    else:
        order = np.lexsort((end, start, lane))
    lane, start, end = lane[order], start[order], end[order]
    del order
    n = len(lane)
    if n == 0:
        return lane, start, end
    cummax = np.empty(n)
    edges = [0, *(np.flatnonzero(lane[1:] != lane[:-1]) + 1).tolist(), n]
    for a, b in zip(edges, edges[1:], strict=False):
        np.maximum.accumulate(end[a:b], out=cummax[a:b])
    first = np.ones(n, dtype=bool)
    first[1:] = (lane[1:] != lane[:-1]) | (start[1:] > cummax[:-1] + gap_s)
    heads = np.flatnonzero(first)
    lasts = np.append(heads[1:] - 1, n - 1)
    return lane[heads], start[heads], cummax[lasts]
