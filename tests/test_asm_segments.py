"""critical_path.segment_records (the compiled walk's `records`: each Segment made by __new__ and its slots set
by object.__setattr__) against Segment's own __init__, record by record: equal, of type Segment, each field
the very object passed (ints stay ints, floats floats, None None), the same repr and hash, and frozen; over
generated columns (empty, odd values of every field) and on a library scenario's path. The shortcut is taken
only for a class whose __init__ just stores its arguments; a column of another length or type is refused."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.results import critical_path as cp
from meshsim.sim.results.critical_path import Segment

_value = st.one_of(st.none(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=4), st.booleans())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(rows=st.lists(st.tuples(*([_value] * 7)), max_size=20))
def test_records_are_the_inits_records(rows):
    columns = [[row[j] for row in rows] for j in range(7)]
    fast, slow = cp.segment_records(*columns), [Segment(*row) for row in rows]
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        assert type(a) is Segment
        for f in cp._SEGMENT_FIELDS:
            assert getattr(a, f) is getattr(b, f)
        assert repr(a) == repr(b)
        if all(v == v for v in dataclasses.astuple(b)):  # NaN != NaN: such records equal no copy
            assert a == b and hash(a) == hash(b)
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.count = 2


@pytest.mark.skipif(cp._walk is None, reason="the compiled walk is not built")
def test_columns_of_another_length_or_type_are_refused():
    with pytest.raises(ValueError):
        cp._walk.records(Segment, cp._SEGMENT_FIELDS, [["a"]] * 6 + [[]])
    with pytest.raises(ValueError):
        cp._walk.records(Segment, cp._SEGMENT_FIELDS, [["a"]] * 6 + [("b",)])
    with pytest.raises(ValueError):
        cp._walk.records(Segment, cp._SEGMENT_FIELDS, [["a"]] * 6)


def test_the_shortcut_is_taken_only_for_a_plain_init():
    assert cp._PLAIN_INIT  # Segment's fields: init, no factories; no __post_init__
    assert cp._SEGMENT_FIELDS == ("name", "category", "rank", "start_us", "dur_us", "op_id", "count")


def test_a_library_path_is_the_inits():
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.results.simulate import simulate

    path = simulate(load_and_resolve("llama2-70b-h100-pp4")).critical_path
    assert path and all(type(s) is Segment for s in path)
    assert list(path) == [Segment(s.name, s.category, s.rank, s.start_us, s.dur_us, s.op_id, s.count) for s in path]
