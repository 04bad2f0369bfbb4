"""The timeline's lean reads of an EventRows (sim/outputs/timeline_zoom.event_times, timeline_rows.lanes_of):
the time columns read in place, read-only (no copy, and no writer can change the log through them), and the
lanes int32 with the same values as the int64 lanes the Event path computes; the page itself is compared
byte for byte with the Event path in tests/test_output_shortcuts.py."""

from __future__ import annotations

import numpy as np
import pytest

from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.outputs import timeline, timeline_rows
from meshsim.sim.outputs.timeline_zoom import event_times
from meshsim.sim.results.simulate import simulate


@pytest.fixture(scope="module")
def events():
    ev = simulate(load_and_resolve("llama2-70b-h100-pp4")).events
    assert is_rows(ev)
    return ev


def test_time_columns_are_read_in_place_and_read_only(events):
    for field in ("start_s", "end_s"):
        t = event_times(events, field)
        column = getattr(events.columns, field)
        assert np.shares_memory(t, column) and not t.flags.writeable
        assert np.array_equal(t, np.fromiter((getattr(e, field) for e in events), np.float64, len(events)))
        with pytest.raises(ValueError):
            t[0] = 1.0


def test_lanes_are_int32_and_the_event_paths_lanes(events):
    view = timeline_rows.RowView(events)
    lanes = timeline_rows.lane_names(view)
    lane = timeline_rows.lanes_of(view, lanes)
    want = np.fromiter((lanes[(e.rank, e.stream)] for e in events), np.int64, len(events))
    assert lane.dtype == np.int32 and np.array_equal(lane, want)
    cols, slow = timeline._Columns(events, lanes, view), timeline._Columns(list(events), lanes)
    for got, ref in zip(cols.runs(), slow.runs(), strict=True):
        assert np.array_equal(got, ref)


def test_runs_of_picked_intervals_are_the_runs_of_their_copies():
    from meshsim.sim.outputs.timeline_zoom import lane_runs

    rng = np.random.default_rng(7)
    for n in (0, 1, 5, 200):
        lane = rng.integers(0, 3, n).astype(np.int32)
        start = np.round(rng.random(n) * 10, 1)
        end = start + np.round(rng.random(n), 1) * (rng.random(n) < 0.8)
        for picked in (np.arange(n), np.flatnonzero(rng.random(n) < 0.5), np.zeros(0, np.intp)):
            got = lane_runs(lane, start, end, 0.05, picked)
            want = lane_runs(lane[picked], start[picked], end[picked], 0.05)
            assert all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want, strict=True))
