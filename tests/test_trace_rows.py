"""trace.json from an EventRows' arrays (sim/outputs/trace_rows.py, the compiled writer sim/outputs/_trace.pyx)
is, byte for byte, the file the Python writer (trace.py's iter_trace_json, the reference) writes for the same
events: over generated logs (waits and pipeline bubbles, collectives with and without args, critical-path
flows, steady-state slices, zero / float / huge bytes and FLOPs, None and huge layers, names that need JSON
escapes, times whose nanoseconds leave the fast decimal rule) and on library scenarios; fields the compiled
writer has no exact rule for fall back to the Python way, with the same bytes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.sim.engine.event_columns import EventColumns
from meshsim.sim.engine.event_rows import EventRows
from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.outputs import trace, trace_rows
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.results.records import CollectiveRow, ConfigEcho
from meshsim.sim.results.steady_state import SteadyState
from meshsim.sim.schedule.ops import Op

pytestmark = pytest.mark.skipif(not trace_rows.AVAILABLE or EventRows is None,
                                reason="the compiled trace writer or the compiled event rows is not built")

NAMES = st.one_of(st.sampled_from(["L0.mb0.fwd.attn_in", "dp.bucket3.all_gather", "pp.recv_fwd_c0.mb1"]),
                  st.text(max_size=6))
SCALARS = st.one_of(st.just(0), st.just(0.0), st.integers(-5, 2**70), st.floats(allow_nan=False, allow_infinity=False))
ROWS = (CollectiveRow("all_gather", "dp", 8, 4096, algo="ring", protocol="ll", busbw_gbps=0.9474),
        CollectiveRow("all_reduce", "tp", 4, 1 << 20, algo="nvls", protocol="simple", busbw_gbps=123.4567),
        CollectiveRow("", "ep", 2, 0))


@st.composite
def ops_of_stage(draw, stage: int) -> tuple[list[Op], list[tuple]]:
    n = draw(st.integers(1, 6))
    ops, sizes = [], []
    for i in range(n):
        stream = draw(st.sampled_from(STREAMS))
        category = draw(st.sampled_from(["compute", stream, "tp_comm"]))
        layer = draw(st.one_of(st.none(), st.integers(0, 200), st.just(2**64 + stage)))
        mb = draw(st.one_of(st.none(), st.integers(0, 300)))
        ops.append(Op(i, draw(NAMES), stream, category, draw(st.sampled_from(["fwd", "bwd", "opt", "é"])), None, (),
                      layer, mb))
        sizes.append((draw(SCALARS), draw(SCALARS)))
    return ops, sizes


def _time(draw) -> float:
    return draw(st.one_of(st.integers(0, 10**7).map(lambda k: k / 1e9), st.floats(0, 4e9, allow_nan=False),
                          st.sampled_from([0.0, 1e-9, 4.9e-10, 999_999.999_999_5, 1e6, 4.5e9, 4.7e9])))


@st.composite
def logs(draw):
    stages = [draw(ops_of_stage(s)) for s in range(draw(st.integers(1, 3)))]
    ranks = draw(st.lists(st.integers(0, 600), min_size=1, max_size=4, unique=True))
    cols = {k: [] for k in ("rank", "op_id", "start", "end", "wait", "peer", "stage", "index")}
    for _ in range(draw(st.integers(0, 25))):
        rank = draw(st.sampled_from(ranks))
        s = draw(st.integers(0, len(stages) - 1))
        k = draw(st.integers(0, len(stages[s][0]) - 1))
        start = _time(draw)
        end = start + draw(st.one_of(st.just(0.0), st.floats(0, 1e-3), st.integers(0, 10**6).map(lambda d: d / 1e9)))
        wait = draw(st.one_of(st.just(0.0), st.just(-1.0), st.floats(0, end - start + 1e-6)))
        for key, value in zip(cols, (rank, k, start, end, wait, draw(st.sampled_from([-1, 0, 7])), s, k),
                              strict=True):
            cols[key].append(value)
    columns = EventColumns(np.array(cols["rank"], np.int64), np.array(cols["op_id"], np.int64),
                           np.array(cols["start"], np.float64), np.array(cols["end"], np.float64),
                           np.array(cols["wait"], np.float64), np.array(cols["peer"], np.int64),
                           np.full(len(cols["rank"]), -1, np.int64))
    events = EventRows(columns, np.array(cols["stage"], np.intc), np.array(cols["index"], np.intc),
                       [ops for ops, _ in stages], [sizes for _, sizes in stages], Event)
    keys = sorted({(e.rank, e.op_id) for e in events})
    picked = draw(st.lists(st.sampled_from(keys), max_size=8)) if keys else []
    path = [Segment("x", "compute", r, 0.0, 1.0, op_id=o) for r, o in picked] + [Segment("w", "waiting", 0, 0, 1)]
    by_op = {key: draw(st.sampled_from(ROWS)) for key in keys if draw(st.booleans())}
    groups = {(row.group, r): tuple(range(r, r + row.ranks)) for row in ROWS for r in ranks if draw(st.booleans())}
    config = ConfigEcho(gpus=1024, tp=8, dp=4, pp=len(stages), gpus_per_node=draw(st.sampled_from([0, 8, None])))
    steady = draw(st.sampled_from([None, SteadyState("extrapolated", micro_batches=64, simulated_micro_batches=12,
                                                     unit=4, period_s=0.0123456, periods=13, gap_start_s=0.5),
                                   SteadyState("full", reason="requested")]))
    result = SimpleNamespace(op_collectives=by_op, rank_groups=groups, config=config, steady_state=steady)
    return events, path, result


def both(tmp_path, events, path, monkeypatch, **kw) -> tuple[bytes, bytes, int]:
    """(compiled file, Python file, how many times the Python way ran for the compiled one)."""
    calls = []
    python = trace._write_python
    monkeypatch.setattr(trace, "_write_python", lambda *a: calls.append(1) or python(*a))
    fast = trace.write_trace(tmp_path / "fast.json", events, path, **kw).read_bytes()
    python_runs = len(calls)
    monkeypatch.setattr(trace_rows, "applies", lambda *a: False)
    slow = trace.write_trace(tmp_path / "slow.json", events, path, **kw).read_bytes()
    monkeypatch.undo()
    return fast, slow, python_runs


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs(), pid_offset=st.sampled_from([0, 1000]), flow_id_base=st.sampled_from([0, 5]))
def test_compiled_trace_is_the_python_trace(tmp_path, monkeypatch, log, pid_offset, flow_id_base):
    events, path, result = log
    fast, slow, python_runs = both(tmp_path, events, path, monkeypatch, result=result, pid_offset=pid_offset,
                                   flow_id_base=flow_id_base, process_prefix="sim")
    assert fast == slow
    # every generated field has an exact compiled rule: the compiled writer wrote it unless a time is beyond 2**62 ns
    assert python_runs == (0 if trace_rows.applies(events, pid_offset) else 1)
    json.loads(fast)


def test_fields_without_a_compiled_rule_fall_back_to_the_same_bytes(tmp_path, monkeypatch):
    """A category that is not a str, an op id other than the row's, a NaN time: the Python way writes the file
    (a NaN refused as before)."""
    ops = [Op(0, "a", "compute", ("compute",), "fwd", None, (), 1, 0), Op(1, "b", "tp_comm", "tp_comm", "fwd", None,
                                                                       (), 1, 0)]
    columns = EventColumns(np.array([0, 0], np.int64), np.array([0, 7], np.int64), np.array([0.0, 1e-6]),
                           np.array([1e-6, 2e-6]), np.array([0.0, 1e-7]), np.array([-1, 3], np.int64),
                           np.array([-1, -1], np.int64))
    events = EventRows(columns, np.zeros(2, np.intc), np.array([0, 1], np.intc), [ops], [[(0, 1.5), (64, 0)]], Event)
    fast, slow, python_runs = both(tmp_path, events, [], monkeypatch)
    assert fast == slow and python_runs == 1
    nan = EventRows(EventColumns(columns.rank, np.array([0, 1], np.int64), np.array([0.0, float("nan")]),
                                 columns.end_s, columns.wait_s, columns.peer, columns.peer_op),
                    np.zeros(2, np.intc), np.array([0, 1], np.intc), [ops[1:] * 2], [[(0, 0), (0, 0)]], Event)
    assert not trace_rows.applies(nan, 0)


@pytest.mark.parametrize("name", ["llama2-70b-h100-pp4", "gpt3-175b-a100-16node"])
def test_library_scenarios_write_the_same_trace(tmp_path, monkeypatch, name):
    """Real steps (the pipeline's bubbles, its extrapolated steady state, collectives with args)."""
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.results.simulate import simulate

    result = simulate(load_and_resolve(name))
    assert isinstance(result.events, EventRows)
    fast, slow, python_runs = both(tmp_path, result.events, result.critical_path, monkeypatch, result=result)
    assert fast == slow and python_runs == 0
    assert b'"pipeline bubble"' in fast or name != "llama2-70b-h100-pp4"


@given(st.integers(-10**18, 10**18) | st.integers(0, 10**6) | st.integers(10**15 - 10**6, 10**15 + 10**6))
@settings(max_examples=2000, deadline=None)
def test_whole_nanoseconds_print_as_repr(k):
    """The compiled writer's decimal rule for ns / 1e3 is repr's, on both sides of its 10**15 bound."""
    assert trace_rows._trace.micros_text(k) == repr(k / 1e3)
