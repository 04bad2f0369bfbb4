"""The memory shortcuts of issue 40 (peak RSS) against their long way, over generated inputs:
event_rows.retimed over every row of a compiled log shares the log's other columns instead of copying them
(take(rows) with new times is the long way), and simulate.issue_columns packs host_issue_times as doubles."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.engine import compiled
from meshsim.sim.engine.event_rows import _every_row, retimed
from meshsim.sim.results.costers import CollectiveCoster, host_issue_times
from meshsim.sim.results.simulate import issue_columns, run_stages, simulated_ranks
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

pytestmark = pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled core is not built")


@pytest.fixture(scope="module")
def tiny():
    rs = load_and_resolve("tiny-2gpu")
    schedules = build_stage_schedules(rs)
    log = run_stages(rs, schedules, simulated_ranks(rs, False), CollectiveCoster(rs), "compiled")
    return rs, schedules, log


def test_issue_columns_are_host_issue_times(tiny):
    rs, schedules, _ = tiny
    for packed, s in zip(issue_columns(rs, schedules), schedules, strict=True):
        plain = host_issue_times(rs, s)
        assert len(packed) == len(plain) and all(type(x) is float for x in packed[:5])
        assert list(packed) == list(plain)  # the same doubles, read back as floats


@settings(max_examples=40, deadline=None)
@given(shift=st.floats(-1.0, 1.0, allow_nan=False), every=st.booleans(), seed=st.integers(0, 2**16))
def test_retimed_every_row_equals_take(tiny, shift, every, seed):
    events = tiny[2].events
    n = len(events)
    rng = np.random.default_rng(seed)
    rows = np.arange(n, dtype=np.int64) if every else np.sort(rng.choice(n, size=n, replace=True))
    start = events.columns.start_s[rows] + shift
    end = events.columns.end_s[rows] + 2 * shift
    fast, slow = retimed(events, rows, start, end), events.retimed(rows, start, end)
    assert _every_row(rows, n) == (every or np.array_equal(rows, np.arange(n)))
    assert len(fast) == len(slow) and list(fast) == list(slow)  # every Event field equal


def test_every_row_edges():
    assert _every_row(np.zeros(0, np.int64), 0)
    assert _every_row(np.arange(3), 3)
    assert not _every_row(np.arange(3), 4)
    assert not _every_row(np.array([0, 2, 1]), 3)
    assert not _every_row(np.array([1, 2, 3]), 3)
    assert not _every_row(np.array([0, 0, 1]), 3)

