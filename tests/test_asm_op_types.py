"""The critical path's op types from the names' parts (sim/results/path_columns.py op_types_of_parts) against
critical_path.op_type of each whole name, and the columns' top_op_types (np.unique / np.bincount over type
and category codes) against critical_path.top_op_types over the Segments, on generated names aimed at the
split's edges: prefixes that end in "." (a stamp's "L3.mb0."), "" (a loose op), a lone ".", prefixes that
end elsewhere (the split inside a dotted part: "L3" + "x" is "L3x", not "L3" then "x"), index parts ("L3",
"mb0", "bucket7", "_c2") on either side of the split, empty parts ("a..b"), and equal types from different
names (the codes must merge them)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.results import critical_path as cp
from meshsim.sim.results import path_columns as pc

PARTS = ("L3", "L", "mb0", "mb12", "mb", "bucket7", "bucket", "fwd", "bwd", "fc1_c2", "qkv_c0", "_c1", "x",
         "", "3", "recv_bwd_c7", "dp", "L3x", "wait", "pipeline bubble")
_part = st.sampled_from(PARTS)
_dotted = st.lists(_part, min_size=1, max_size=4).map(".".join)
_prefix = st.one_of(st.just(""), st.just("."), _dotted.map(lambda s: s + "."), _dotted,
                    st.text("Lmb0123._cx", max_size=8))
_suffix = st.one_of(_dotted, st.text("Lmb0123._cx", max_size=8))


def _decoded(code: np.ndarray, types: list[str]) -> list[str]:
    return [types[k] for k in code.tolist()]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(pairs=st.lists(st.tuples(_prefix, _suffix), max_size=40))
def test_types_from_parts_are_the_whole_names_types(pairs):
    prefixes, suffixes = [p for p, _ in pairs], [s for _, s in pairs]
    names = [p + s for p, s in pairs]
    code, types = pc.op_types_of_parts(prefixes, suffixes)
    assert _decoded(code, types) == [cp.op_type(name) for name in names]
    # numbered in order of first appearance, each type once: the codes op_types_of gives from the names
    want_code, want_types = pc.op_types_of(names)
    assert types == want_types and code.tolist() == want_code.tolist()
    assert len(set(types)) == len(types)


def test_a_split_inside_a_dotted_part_is_typed_whole():
    """Negative control: typing "L3" and "x" apart and joining would give "x"; the name "L3x" is its own type."""
    code, types = pc.op_types_of_parts(["L3", "L3.", "L3.mb0."], ["x", "x", "fwd.fc1_c2"])
    assert _decoded(code, types) == ["L3x", "x", "fwd.fc1"]
    assert pc.join_types("", "x") == "x" and pc.join_types("fwd", "") == "fwd" and pc.join_types("a", "b") == "a.b"


_segment = st.builds(
    cp.Segment, st.tuples(_prefix, _suffix).map("".join),
    st.sampled_from(("compute", "tp_comm", "waiting", "pp_comm", "ep_comm")), st.integers(0, 3),
    st.floats(0.0, 1e6, allow_nan=False), st.sampled_from((0.0, 0.5, 1.25, 3.0, 1e-9, 7.1, 1e5 / 3)),
    st.one_of(st.none(), st.integers(0, 50)), st.integers(1, 5))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(path=st.lists(_segment, max_size=40), n=st.integers(0, 45))
def test_column_top_op_types_equal_the_segments(path, n):
    """Ties in total time (equal durations, types met under several categories) keep first appearance, as the
    stable sort over the loop's rows does; totals are the loop's sums bit for bit."""
    cols = pc.from_segments(path)
    assert pc.top_op_types(cols, n) == cp.top_op_types(path, n) == cp.top_op_types_per_segment(path, n)
    parts = pc.PathColumns(cols.rank, cols.op_id, cols.start_us, cols.dur_us, cols.count, cols.category,
                           cols.categories, cols.name_list,
                           lambda: pc.op_types_of_parts([""] * len(path), [s.name for s in path]))
    assert pc.top_op_types(parts, n) == cp.top_op_types(path, n)


def test_equal_categories_under_two_codes_are_one_key():
    """A categories tuple naming one category twice (no maker writes one; the key is the str, not the code)."""
    path = [cp.Segment("L0.fwd.a", "compute", 0, 0.0, 1.0, 1), cp.Segment("L1.fwd.a", "compute", 0, 1.0, 2.0, 2)]
    cols = pc.from_segments(path)
    twice = pc.PathColumns(cols.rank, cols.op_id, cols.start_us, cols.dur_us, cols.count, np.array([0, 1]),
                           ("compute", "compute"), cols.name_list)
    assert pc.top_op_types(twice, 5) == cp.top_op_types(path, 5) == [("fwd.a", "compute", 3.0, 2)]
