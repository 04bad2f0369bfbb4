"""The timeline read from an EventRows' arrays (sim/outputs/timeline_rows.py) is the figure the per-event
Python path (sim/outputs/timeline.py over Event tuples, the reference) makes for the same events: the same
plotly.js dict, typed-array bytes included, over generated logs (several ranks and stages, None and huge
layers and micro-batches, waits, collectives with rows, critical paths, steady-state bands) and on library
scenarios with and without a pipeline (the zoom's two branches)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from meshsim.sim.engine.event_rows import EventRows
from meshsim.sim.outputs import timeline
from tests.test_trace_rows import logs

pytestmark = pytest.mark.skipif(EventRows is None, reason="the compiled event rows is not built")


def spec_or_error(events, path, result):
    try:
        return json.dumps(timeline.timeline_spec(events, path, "t", result))
    except Exception as exc:  # noqa: BLE001 - both ways must fail alike on what they cannot draw
        return type(exc).__name__


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs())
def test_timeline_from_rows_is_the_timeline_from_events(log):
    events, path, result = log
    assert spec_or_error(events, path, result) == spec_or_error(tuple(events), path, result)


@pytest.mark.parametrize("name", ["llama2-70b-h100-pp4", "gpt3-175b-a100-16node", "default"])
def test_library_scenarios_draw_the_same_timeline(name):
    from meshsim.scenarios.library import DEFAULT_SCENARIO
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.results.simulate import simulate

    result = simulate(load_and_resolve(DEFAULT_SCENARIO if name == "default" else name))
    assert isinstance(result.events, EventRows)
    rows = timeline.timeline_spec(result.events, result.critical_path, "t", result)
    assert rows == timeline.timeline_spec(tuple(result.events), result.critical_path, "t", result)
    assert rows["layout"]["xaxis"]["range"]  # the zoom window was found


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs())
def test_op_codes_without_the_compiled_writer_are_the_same(monkeypatch, log):
    """row_fields.op_codes' Python pass (no C compiler at install) gives the compiled pass's codes and values."""
    from meshsim.sim.outputs import row_fields

    events = log[0]
    for field in ("stream", "category", "layer", "micro_batch", "phase", "name", "id"):
        codes, values = row_fields.op_codes(events, field)
        with monkeypatch.context() as m:
            m.setattr(row_fields, "_trace", None)
            py_codes, py_values = row_fields.op_codes(events, field)
        assert codes.tolist() == py_codes.tolist() and values == py_values
        assert [values[c] for c in codes.tolist()] == [getattr(e, "op_id" if field == "id" else field) for e in events]
