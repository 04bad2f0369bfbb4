"""The pipeline's fill and drain read off the tiled arrays (sim/search/pipeline_arrays.py) equal the long
way (Pipeline.long_way, the graph built op by op): ok, and on the fill and drain sets every est, tail and
dur, and every stage's and stream's (fill, drain), to the bit (float.hex), on generated pipelines (the
generator of tests/test_search_pipeline.py), on schedules whose deps leave the schedule (ok False), on
schedules without tiled arrays (the long way taken) and on tiled schedules without tiled fields."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshsim.sim.schedule.ops import FIFO_STREAMS, STREAMS, Op, ScheduleArrays, kind_of
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.search.bound import short_micro_batches
from meshsim.sim.search.bound_types import Pricer
from meshsim.sim.search.pipeline_arrays import closure, graph_from_arrays
from meshsim.sim.search.pipeline_bound import Pipeline, _closure, _partners
from tests.test_search_pipeline import pipelines, resolved


class OpsAsArrays:
    """A Tiling that reads the arrays off the ops with their deps as they are (ids = positions, a dep
    outside the list kept as its out-of-range position) and gives no fields: the array path on schedules
    the builder did not tile."""

    def tiled(self, ops: tuple[Op, ...]) -> ScheduleArrays:
        col = lambda v: np.array(v, dtype=np.intc)  # noqa: E731
        ptr = np.zeros(len(ops) + 1, dtype=np.intc)
        np.cumsum([len(op.deps) for op in ops], out=ptr[1:])
        return ScheduleArrays(col([kind_of(op.work) for op in ops]), col([STREAMS.index(op.stream) for op in ops]),
                              ptr, col([d for op in ops for d in op.deps]), col([op.host_calls for op in ops]),
                              col([-1] * len(ops)))

    def fields(self, ops: tuple[Op, ...]) -> None:
        return None


def _hex(d: dict[int, float]) -> dict[int, str]:
    return {k: float.hex(v) for k, v in d.items()}


def assert_same(schedules, duration) -> Pipeline:
    """The array path's Pipeline equals the long way's, to the bit; returns the array path's."""
    fast, ref = Pipeline(schedules, duration), Pipeline.long_way(schedules, duration)
    assert fast.ok == ref.ok
    if not ref.ok:
        return fast
    assert _hex(fast.est) == _hex(ref.est) and _hex(fast.tail) == _hex(ref.tail) and _hex(fast.dur) == _hex(ref.dur)
    assert fast.ancestors_first == ref.ancestors_first and fast.descendants_last == ref.descendants_last
    for s in schedules:
        for x in FIFO_STREAMS:
            assert tuple(map(float.hex, fast.fill_drain(s.stage, x))) == tuple(map(float.hex, ref.fill_drain(s.stage, x)))
    return fast


def _short(p: dict):
    rs = resolved(p)
    assume(rs is not None)
    return short_schedules(rs)


def short_schedules(rs):
    """The short schedules of the bound (bound.py) and their priced duration."""
    price = Pricer(rs)
    return build_stage_schedules(replace(rs, micro_batches=short_micro_batches(rs))), \
        (lambda op, stage: price(op, stage * rs.stage_size))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(p=pipelines)
def test_the_array_path_equals_the_long_way_on_generated_pipelines(p):
    schedules, duration = _short(p)
    assert all(s.tiled_arrays is not None for s in schedules)  # the builder tiles them: the array path is taken
    assert graph_from_arrays(schedules, _partners) is not None
    fast = assert_same(schedules, duration)
    assert fast.ok or p["vp"] > 1  # only a short interleaved schedule leaves itself


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(p=pipelines, how=st.sampled_from(["untiled", "one untiled", "no fields"]))
def test_schedules_without_tiled_arrays_or_fields(p, how):
    schedules, duration = _short(p)
    if how == "untiled":
        schedules = [replace(s, tiling=None) for s in schedules]
    elif how == "one untiled":
        schedules = [replace(s, tiling=None) if s.stage == 0 else s for s in schedules]
    else:
        schedules = [replace(s, ops=tuple(s.ops), tiling=OpsAsArrays()) for s in schedules]
    assert (graph_from_arrays(schedules, _partners) is None) == (how != "no fields")
    assert_same(schedules, duration)


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(p=pipelines, which=st.integers(0, 10**6), beyond=st.sampled_from([0, 1, 7]), tiled=st.booleans())
def test_a_dep_outside_the_schedule_is_not_ok(p, which, beyond, tiled):
    schedules, duration = _short(p)
    s = schedules[which % len(schedules)]
    i = which % len(s.ops)
    ops = list(s.ops)
    ops[i] = ops[i]._replace(deps=(*ops[i].deps, len(ops) + beyond))  # an id that is no position of the list
    broken = replace(s, ops=tuple(ops), tiling=OpsAsArrays() if tiled else None)
    schedules = [broken if x is s else x for x in schedules]
    fast = assert_same(schedules, duration)
    assert not fast.ok


def test_negative_control_a_changed_duration_is_seen():
    """The comparison can fail: one op's duration changed on one side shows in est, tail or fill_drain."""
    p = {"pp": 2, "vp": 1, "layers_per_chunk": 1, "tp": 1, "micro_batches": 4, "group": None, "recompute": "none",
         "dp": 1, "dist_opt": False, "host": None, "split": False, "moe": False}
    schedules, duration = short_schedules(resolved(p))
    fast = Pipeline(schedules, duration)
    bumped = Pipeline.long_way(schedules, lambda op, stage: duration(op, stage) * (1 + 2**-40))
    assert fast.ok and bumped.ok
    assert _hex(fast.est) != _hex(bumped.est) or _hex(fast.tail) != _hex(bumped.tail)


graphs = st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.lists(st.booleans(), min_size=n, max_size=n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n)))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(g=graphs)
def test_the_array_closure_equals_kahns_op_by_op(g):
    """On small graphs with repeated links, self-loops and cycles: the same members, each after its links."""
    member, edges = g
    links: list[list[int]] = [[] for _ in member]
    for node, link in edges:
        links[node].append(link)
    nodes = [n for n, m in enumerate(member) if m]
    back: dict[int, set[int]] = {}
    for n in nodes:
        for p in links[n]:
            if member[p]:
                back.setdefault(p, set()).add(n)
    want = _closure(nodes, links, back)
    node = np.array([e[0] for e in edges], dtype=np.int64)
    link = np.array([e[1] for e in edges], dtype=np.int64)
    got = closure(np.array(member, dtype=bool), node, link)
    assert sorted(got) == sorted(want) and len(got) == len(set(got))
    seen: set[int] = set()
    for n in got:
        assert all(p in seen for p in links[n])
        seen.add(n)
