"""The timeline's vectorised runs (sim/outputs/timeline.py: merged_runs, _segments; timeline_zoom.py: lane_runs,
Busy) equal the loops over sorted tuples they replaced (kept here as the reference, as they stood at 46da508), float for
float, over generated events: exact ties, zero durations, nested and overlapping ops, gaps just under, at and
over MERGE_GAP_S, one and many lanes; and the typed-array bytes of numpy and list input agree."""

from __future__ import annotations

import random
from bisect import bisect_right
from itertools import accumulate

import numpy as np
import pytest

from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.outputs import timeline, timeline_zoom
from meshsim.sim.outputs.plotly_page import typed_array


def reference_runs(events, lanes):
    runs: list[list] = []
    last: dict[int, list] = {}
    for lane, start, end in sorted((lanes[(e.rank, e.stream)], e.start_s, e.end_s) for e in events):
        run = last.get(lane)
        if run is not None and start <= run[2] + timeline.MERGE_GAP_S:
            run[2] = max(run[2], end)
        else:
            run = last[lane] = [lane, start, end]
            runs.append(run)
    return [tuple(r) for r in runs]


def reference_segments(events, lanes):
    nan = float("nan")
    runs = reference_runs(events, lanes)
    x = [v for r in runs for v in (r[1] * 1e3, r[2] * 1e3, nan)]
    y = [v for r in runs for v in (r[0], r[0], nan)]
    return typed_array(x), typed_array(y)


class ReferenceBusy:
    def __init__(self, events):
        runs: list[list[float]] = []
        for start, end in sorted((e.start_s, e.end_s) for e in events if e.category == "compute"):
            if runs and start <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], end)
            else:
                runs.append([start, end])
        self.starts = [r[0] for r in runs]
        self.ends = [r[1] for r in runs]
        self.before = list(accumulate((e - s for s, e in runs), initial=0.0))

    def within(self, a, b):
        def upto(t):
            i = bisect_right(self.starts, t)
            return self.before[i] - max(0.0, self.ends[i - 1] - t) if i else 0.0
        return upto(b) - upto(a)


def generated(seed: int, n: int) -> list[Event]:
    rng = random.Random(seed)
    ranks = rng.choice((1, 2, 5))
    grid = [k * 0.25e-6 for k in range(400)]  # coarse times: many exact ties and touching ends
    events = []
    for i in range(n):
        start = rng.choice(grid) if rng.random() < 0.5 else rng.uniform(0, 1e-4)
        dur = rng.choice((0.0, 0.25e-6, 1e-6, rng.uniform(0, 2e-5)))
        if rng.random() < 0.2:  # the next op starts within, at or just past the merge gap
            dur = rng.choice((0.0, 1e-6)) + rng.choice((0.0, 0.5e-9, 1e-9, 1.5e-9))
        stream = rng.choice(STREAMS)
        category = "compute" if stream == "compute" else rng.choice(("tp_comm", "dp_comm", "compute"))
        events.append(Event(rng.randrange(ranks), i, f"op{i}", stream, category, "fwd", None, None, start,
                            start + dur))
    return events


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_runs_equal_the_sorted_loop(seed):
    events = generated(seed, random.Random(seed).choice((0, 1, 2, 7, 60, 400)))
    lanes = timeline._lane_names(events)
    assert timeline.merged_runs(events, lanes) == reference_runs(events, lanes)
    assert timeline._segments(events, lanes) == reference_segments(events, lanes)
    for rank in {e.rank for e in events}:
        mine = [e for e in events if e.rank == rank]
        new, old = timeline_zoom.Busy(mine), ReferenceBusy(mine)
        assert (new.starts, new.ends, new.before) == (old.starts, old.ends, old.before)
        for a, b in ((0.0, 1e-4), (1e-5, 3e-5), (2.5e-6, 2.5e-6)):
            assert new.within(a, b) == old.within(a, b)


def test_runs_merge_within_the_gap_and_split_past_it():
    """Closed form: three ops on one lane, the second starting exactly MERGE_GAP_S after the first ends (one
    run), the third 2 x MERGE_GAP_S after the second (a new run); a nested op does not end a run early."""
    g = timeline.MERGE_GAP_S
    ev = [Event(0, 0, "a", "compute", "compute", "fwd", None, None, 0.0, 1.0),
          Event(0, 1, "n", "compute", "compute", "fwd", None, None, 0.2, 0.3),
          Event(0, 2, "b", "compute", "compute", "fwd", None, None, 1.0 + g, 2.0),
          Event(0, 3, "c", "compute", "compute", "fwd", None, None, 2.0 + 2 * g, 3.0)]
    assert timeline.merged_runs(ev, {(0, "compute"): 0}) == [(0, 0.0, 2.0), (0, 2.0 + 2 * g, 3.0)]


def test_numpy_and_list_input_give_the_same_typed_array():
    values = [0.1, 1e3 / 3, float("nan"), 7.0, 1e-40, 3.4e38]
    assert typed_array(np.array(values)) == typed_array(values)
