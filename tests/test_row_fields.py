"""sim/results/row_fields.py against sim/results/breakdown.py on generated schedules of every builder path
(test_schedule_arrays.scenarios: dense and MoE models, pipelines, recompute, overlap switches): for each
simulated rank of a compiled run, the middle layer, the layer spans of every phase set a result reads (and
of phases no op has, and of a layer no op has) and the EP all-to-all times equal breakdown.py's, both over
the same EventRows and over its Event tuples (the reference pass)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from test_schedule_arrays import resolved_case, scenarios
from test_steady_state import resolved

from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.results import breakdown as bd
from meshsim.sim.results import row_fields as rf
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.simulate import run_stages, simulated_ranks
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

PHASE_SETS = (("fwd",), ("bwd", "recompute"), ("recompute",), ("optimizer", "fwd"), ("no such phase",))


def _run(case):
    rs = resolved_case(case)
    schedules = build_stage_schedules(rs)
    log = run_stages(rs, schedules, simulated_ranks(rs, False), CollectiveCoster(rs), "compiled")
    return schedules, log


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_row_fields_equal_breakdown(case):
    schedules, log = _run(case)
    for rank in log.ranks:
        rows = log.of_rank(rank)
        if not is_rows(rows):
            pytest.skip("the compiled core is not built: every log is a tuple of events")
        fields = rf.row_fields(rows, schedules)
        assert fields is not None
        events = list(rows)
        layer = bd.middle_layer(rows)
        assert rf.middle_layer(fields) == layer == bd.middle_layer(events)
        for which in (layer, -7, None):
            for phases in PHASE_SETS:
                want = bd.layer_span_ms(rows, which, phases)
                assert rf.layer_span_ms(fields, which, phases) == want == bd.layer_span_ms(events, which, phases)
        assert rf.ep_layer_ms(fields) == bd.ep_layer_ms(rows) == bd.ep_layer_ms(events)


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_row_fields_need_the_rows_own_schedules(case):
    """Negative control: rows whose stages are not among the schedules given (another build of the same
    scenario: equal ops, other objects), or a tuple of events, get no fields (the caller takes the long way)."""
    schedules, log = _run(case)
    rows = log.of_rank(log.ranks[0])
    assert rf.row_fields(list(rows), schedules) is None
    if is_rows(rows):
        name, over, micro_batches = case
        assert rf.row_fields(rows, build_stage_schedules(resolved(name, over, micro_batches))) is None
        assert rf.row_fields(rows, ()) is None


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_breakdown_from_stream_columns_equals_breakdown(case):
    """breakdown with the schedules (each row's stream read off the tiled stream column) gives the same
    dict, bit for bit and key for key, as without them and as over the Event tuples."""
    schedules, log = _run(case)
    pipeline = len(schedules) > 1
    for rank in log.ranks:
        rows = log.of_rank(rank)
        for step_s in (log.step_time_s, log.step_time_s * 1.5):
            want = bd.breakdown(rows, step_s, pipeline=pipeline)
            got = bd.breakdown(rows, step_s, pipeline=pipeline, schedules=schedules)
            assert list(got.items()) == list(want.items())
            assert list(want.items()) == list(bd.breakdown(list(rows), step_s, pipeline=pipeline).items())
