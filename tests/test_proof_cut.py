"""The proof's cheaper cut search and narrower arrays against the long way.

- period_state.choose_cut (only the changes before lo + T sorted, the candidates taken widest first in
  blocks, each one's neighbours one period later found by a scan for the first _SCANNED and by a sort
  after) against the per-event reference (tests/results_reference/period_state.py: every change sorted,
  every gap sorted), on generated runs of both engines, at several windows and tolerances, with `good`
  refusing some candidates (a hash of the time: past the scanned ones and past the first blocks) or all.
- change_times holds exactly the values of time_values (the reference's sorted list), repeats aside.
- run_arrays.times_of_rank (gathered through the log's op id -> row index) equals the reference's per-event
  times, and refuses a rank whose events are not one per op, as rank_times did.
- period_keys.index_array narrows to np.intc exactly when every value fits (edges 2^31 - 1, -2^31).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from results_reference import period_state as ref_state
from test_period_path_settled import short_run_of
from test_schedule_arrays import scenarios

from meshsim.sim.results import period_state
from meshsim.sim.results.period_keys import index_array
from meshsim.sim.results.run_arrays import times_of_rank


def _refuses(share: float, salt: int):
    """A `good` that refuses about `share` of the times, decided by a hash of the time's bits."""

    def good(c: float) -> bool:
        digest = hashlib.blake2b(float(c).hex().encode() + bytes([salt]), digest_size=2).digest()
        return int.from_bytes(digest, "big") >= share * 65536

    return good


def _windows(log) -> list[tuple[float, float]]:
    """(lo, period) pairs across the run: a tenth, a third, a half of it as the period, from three starts."""
    step = log.step_time_s
    return [(0.0, 0.3 * step), (0.2 * step, 0.1 * step), (0.45 * step, 0.5 * step)]


def test_choose_cut_equals_the_reference():
    """The same cut (or None) as the reference on every window, tolerance and `good`; not vacuous: some
    searches went past the scanned candidates and found one there, some found none."""
    seen = {"past_scanned": 0, "none": 0, "found": 0}

    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
    def check(case, engine):
        _, _, run = short_run_of(case, engine)
        log = run.log
        for lo, period_s in _windows(log):
            for rel in (1e-9, 1e-3):
                tol_s = rel * log.step_time_s
                refs = [(lambda c: True), _refuses(0.5, 1), _refuses(0.97, 2), (lambda c: False)]
                for good in refs:
                    calls = []

                    def counted(c, good=good, calls=calls):
                        calls.append(c)
                        return good(c)

                    fast = period_state.choose_cut(log, lo, period_s, tol_s, counted)
                    slow = ref_state.choose_cut(log, lo, period_s, tol_s, good)
                    assert (fast is None and slow is None) or float(fast).hex() == float(slow).hex()
                    seen["none"] += fast is None
                    seen["found"] += fast is not None
                    seen["past_scanned"] += len(calls) > period_state._SCANNED

    check()
    assert seen["past_scanned"] and seen["none"] and seen["found"]


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
def test_change_times_are_the_time_values(case, engine):
    _, _, run = short_run_of(case, engine)
    log = run.log
    for lo, period_s in _windows(log):
        hi = lo + 2 * period_s
        want = ref_state.time_values(log, lo, hi)
        got = period_state.change_times(log, lo, hi)
        assert sorted(set(got.tolist())) == sorted(set(want))
        assert len(got) <= len(want)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
def test_times_of_rank_are_the_events_times(case, engine):
    rs, _, run = short_run_of(case, engine)
    log = run.log
    by = log.by_rank()
    for rank in log.ranks:
        n = len(run.schedules[rs.stage_of(rank)].ops)
        t = times_of_rank(log, rank, n)
        events = by[rank]
        for name, field in (("start", "start_s"), ("end", "end_s"), ("wait", "wait_s")):
            want = [getattr(events[i], field) for i in range(n)]
            assert list(map(float.hex, getattr(t, name).tolist())) == list(map(float.hex, want))
        for wrong in (n - 1, n + 1):
            with pytest.raises(ValueError, match="not one per op"):
                times_of_rank(log, rank, wrong)


def test_index_array_narrows_only_what_fits():
    top, bottom = np.iinfo(np.intc).max, np.iinfo(np.intc).min
    for values in ([0, top], [bottom, -1], [], [5]):
        got = index_array(np.array(values, np.int64))
        assert got.dtype == np.intc and got.tolist() == values
    for values in ([0, top + 1], [bottom - 1, 0]):
        got = index_array(np.array(values, np.int64))
        assert got.dtype == np.int64 and got.tolist() == values
    same = np.arange(4, dtype=np.intc)
    assert index_array(same) is same


def test_a_run_without_changes_in_the_window_gets_the_middle():
    """No change in [lo, lo + 2T]: the one gap [lo, lo + T) gives its middle, near = T (both ways)."""

    class Empty:
        transfers, jobs, step_time_s = (), (), 1.0

        @staticmethod
        def columns():
            z = np.zeros(0)
            return type("C", (), {"start_s": z, "end_s": z, "wait_s": z})()

        @property
        def events(self):
            return ()

    got = period_state.choose_cut(Empty(), 2.0, 1.0, 1e-9)
    assert got == ref_state.choose_cut(Empty(), 2.0, 1.0, 1e-9) == 2.5
