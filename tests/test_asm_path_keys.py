"""A StepResult's critical path keeps the columns it was built from (path_columns.SegmentTuple), and the trace
and timeline writers read its (rank, op id) pairs off them (sim/outputs/row_fields.path_keys, trace_rows'
RowsContext._chain) instead of the Segment records. Checked against the records' way:
- path_keys is, as a set, pair_keys(critical_ops(path)), and _chain is the dict-of-last-rows chain, over
  generated paths with repeated pairs, pairs that miss every row, rows repeating a key (the dict keeps the
  last), and ranks / op ids that do not pack (the records' way is taken);
- a SegmentTuple is the plain tuple for everything else (equal, hashed, pickled as it);
- on library scenarios, trace.json and the timeline written with the result's path and with the plain tuple
  of its Segments are the same bytes, and results.json is unchanged."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.outputs import trace, trace_rows
from meshsim.sim.outputs.row_fields import pair_keys, path_keys, row_keys
from meshsim.sim.outputs.step_report import write_results_json
from meshsim.sim.outputs.timeline import write_timeline
from meshsim.sim.results import path_columns as pc
from meshsim.sim.results.critical_path import Segment, critical_ops

_rank = st.one_of(st.integers(0, 3), st.just(2**31 + 1))
_op = st.one_of(st.none(), st.integers(0, 6), st.just(2**33))
_segment = st.builds(Segment, st.sampled_from(("L0.fwd.a", "wait")), st.just("compute"), _rank,
                     st.just(0.0), st.just(1.0), _op)


def _kept(path: list[Segment]) -> pc.SegmentTuple:
    return pc.from_segments(path).segment_tuple()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=st.lists(_segment, max_size=30))
def test_path_keys_are_the_records_keys(path):
    kept = _kept(path)
    assert kept == tuple(path) and hash(kept) == hash(tuple(path)) and kept.columns is not None
    assert set(path_keys(kept).tolist()) == set(path_keys(tuple(path)).tolist()) \
        == set(pair_keys(list(critical_ops(path))).tolist())
    assert type(pickle.loads(pickle.dumps(kept))) is tuple


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=st.lists(_segment, max_size=30), rows=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=30))
def test_chain_is_the_dict_of_last_rows(path, rows):
    """Rows: (rank, op id) per critical row, repeats allowed; the chain the dict way (hops' reference)."""
    rank = np.array([r for r, _ in rows], np.int64)
    op = np.array([o for _, o in rows], np.int64)
    ctx = SimpleNamespace(keys=row_keys(rank, op))
    at = np.arange(len(rows), dtype=np.int64)
    chain = trace_rows.RowsContext._chain(ctx, at, _kept(path))
    row_of = dict(zip(rows, range(len(rows)), strict=True))
    want = [row_of[(s.rank, s.op_id)] for s in path if s.op_id is not None and (s.rank, s.op_id) in row_of]
    fits = all(s.rank < 2**31 and s.op_id < 2**32 for s in path if s.op_id is not None)
    assert (chain.tolist() if chain is not None else None) == (want if fits else None)


@pytest.mark.parametrize("name", ["llama2-70b-h100-pp4", "default"])
def test_writers_read_the_kept_columns_as_the_records(tmp_path, name):
    from meshsim.scenarios.library import DEFAULT_SCENARIO
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.results.simulate import simulate

    result = simulate(load_and_resolve(DEFAULT_SCENARIO if name == "default" else name))
    assert isinstance(result.critical_path, pc.SegmentTuple) and result.critical_path.columns is not None
    plain = tuple(result.critical_path)
    for tag, path in (("kept", result.critical_path), ("plain", plain)):
        trace.write_trace(tmp_path / f"{tag}.json", result.events, path, result=result)
        write_timeline(tmp_path / f"{tag}.html", result.events, path, "t", result=result)
    for ext in ("json", "html"):
        assert (tmp_path / f"kept.{ext}").read_bytes() == (tmp_path / f"plain.{ext}").read_bytes()
    write_results_json(result, tmp_path / "r.json")
    assert result.to_dict(full_critical_path=True)["critical_path"] == [s.to_json() for s in plain]
