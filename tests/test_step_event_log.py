"""The exact event log of a real 2-rank, 1-layer scenario (tiny-2gpu cut to one layer, one micro-batch).

The schedule comes from the builder; durations are fixed by the test (compute 10 us on rank 0 and 12 us on
rank 1, every collective 1 us latency + 4 us bandwidth on disjoint links), so every start and end follows
from arithmetic. The oracle is the closed form of FIFO streams over a dependency DAG:

    issue(op, r) = max(end of op's deps on r, end of the previous op of op's stream on r)
    start(op, r) = issue(op, r)                       for compute ops
    end(op, r)   = start(op, r) + compute_s(op, r)
    end(coll)    = max_r issue(coll, r) + 5 us        (a collective starts when both ranks issued it)

plus hand-counted anchors (the forward of the layer is a chain of its ops).
"""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.engine.events import run, symmetric_groups
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import Collective

US = 1e-6
COMPUTE_US = {0: 10.0, 1: 12.0}
LAT_US, BW_US = 1.0, 4.0


@pytest.fixture(scope="module")
def schedule():
    scenario, source = load_scenario("tiny-2gpu")
    scenario = with_overrides(scenario, {"model.layers": 1, "parallel.global_batch": 2, "parallel.sp": False},
                              source)
    return build_schedule(resolve(scenario, source))


def engine_log(schedule):
    def compute_s(op, rank):
        return COMPUTE_US[rank] * US

    def collective(op, group):
        return LAT_US * US, BW_US * US, {op.id: 1.0}  # a private link per op: no contention

    return run(schedule, [0, 1], compute_s, collective, symmetric_groups(2, 1))


def oracle(schedule) -> dict[tuple[int, int], tuple[float, float]]:
    """(rank, op id) -> (start_us, end_us) from the FIFO/DAG recurrence (collectives synchronise ranks)."""
    end: dict[tuple[int, int], float] = {}
    start: dict[tuple[int, int], float] = {}
    stream_free: dict[tuple[int, str], float] = {}
    for op in schedule.ops:  # schedule order is a topological order within and across streams
        issue = {r: max([stream_free.get((r, op.stream), 0.0)] + [end[(r, d)] for d in op.deps]) for r in (0, 1)}
        if isinstance(op.work, Collective):
            begin = max(issue.values())
            for r in (0, 1):
                start[(r, op.id)], end[(r, op.id)] = issue[r], begin + LAT_US + BW_US
        else:
            for r in (0, 1):
                start[(r, op.id)], end[(r, op.id)] = issue[r], issue[r] + COMPUTE_US[r]
        for r in (0, 1):
            stream_free[(r, op.stream)] = end[(r, op.id)]
    return {k: (start[k], end[k]) for k in end}


def test_event_log_equals_the_fifo_dag_recurrence(schedule):
    log = engine_log(schedule)
    expected = oracle(schedule)
    got = {(e.rank, e.op_id): (e.start_s / US, e.end_s / US) for e in log.events}
    assert got.keys() == expected.keys()
    for key, (s, e) in expected.items():
        assert got[key] == pytest.approx((s, e), abs=1e-6), schedule.ops[key[1]].name
    assert log.step_time_s / US == pytest.approx(max(e for _, e in expected.values()), abs=1e-6)


def test_forward_of_the_layer_is_its_chain(schedule):
    """Rank 1 (the slower) sets the pace: the layer's forward is 10 compute ops x 12 us + 2 all-reduces x 5 us
    (ln1 qkv attn proj | g | res ln2 fc1 act fc2 | g | res: without SP, f issues nothing forward)."""
    log = engine_log(schedule)
    layer_fwd = [e for e in log.events if e.rank == 1 and e.layer == 0 and e.phase == "fwd"]
    names = [e.name.split(".")[-1] for e in sorted(layer_fwd, key=lambda e: e.start_s)]
    assert names == ["ln1", "qkv", "attn", "proj", "attn_out", "attn_res", "ln2", "fc1", "act", "fc2",
                     "mlp_out", "mlp_res"]
    span_us = (max(e.end_s for e in layer_fwd) - min(e.start_s for e in layer_fwd)) / US
    assert span_us == pytest.approx(10 * 12.0 + 2 * (LAT_US + BW_US))


def test_rank0_waits_for_rank1_at_every_forward_all_reduce(schedule):
    """Rank 0 computes 2 us faster per op, so it reaches each collective early and waits: the wait equals
    the gap in issue times, which the oracle gives exactly."""
    log = engine_log(schedule)
    expected = oracle(schedule)
    for op in schedule.ops:
        if isinstance(op.work, Collective):
            ev0 = log.get(0, op.id)
            gap_us = expected[(1, op.id)][0] - expected[(0, op.id)][0]
            assert ev0.wait_s / US == pytest.approx(max(0.0, gap_us), abs=1e-6), op.name
            assert log.get(1, op.id).wait_s == pytest.approx(0.0, abs=1e-12)
