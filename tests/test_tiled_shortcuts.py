"""Every pass that reads a built schedule's tiled arrays (Schedule.tiled_arrays, sim/schedule/tiling.py) or
counts per work object instead of per op gives what the long way gives, op by op, on generated schedules of
every builder path (test_schedule_arrays.scenarios): the same schedule with its tiling record dropped
(`replace(s, tiling=None)`) takes the long way through the same functions. Compared: the engine's per-stream
op lists and the compiled core's stage arrays, the run arrays' stream predecessors and deps, the critical
path's stream predecessors, the proof's keys, later keys, regular masks and stage maps, the host's issue times
(bit for bit), the collective counts (values and key order) and the op -> collective row map (and order)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from results_reference import period_state as ref_state
from test_schedule_arrays import resolved_case, scenarios
from test_steady_state import resolved

from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import compiled, events
from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.engine.host import HostSyncs, host_syncs
from meshsim.sim.results import breakdown as bd
from meshsim.sim.results import critical_path as cp
from meshsim.sim.results.costers import (
    CollectiveCoster,
    collective_counts,
    count_collectives,
    count_collectives_per_op,
)
from meshsim.sim.results.period_keys import key_index, key_parts, later, later_keys, mb_codes, regular_mask
from meshsim.sim.results.period_path import by_end, by_end_sorted
from meshsim.sim.results.period_state import Cut, StageMap, change_times, jobs_repeat, stage_map
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.results.run_arrays import StageOps, distinct_ints
from meshsim.sim.results.simulate import run_stages, simulated_ranks, steady_plan
from meshsim.sim.results.step_result import all_op_types, op_collectives, op_collectives_per_op
from meshsim.sim.schedule.ops import Collective, Schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.tiling import OpList


def _pairs(case) -> list[tuple[Schedule, Schedule]]:
    rs = resolved_case(case)
    out = []
    for s in build_stage_schedules(rs):
        assert s.tiled_arrays is not None  # the fast path is taken ...
        long = replace(s, tiling=None)
        assert long.tiled_arrays is None  # ... and the twin takes the long way
        out.append((s, long))
    return out


def _same_arrays(a, b) -> None:
    assert a.dtype == b.dtype and np.array_equal(a, b)


def _same_map(a: StageMap | str, b: StageMap | str) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    assert (a.keys, a.id_of, a.unit, a.period_ops, a.first_regular, a.end_regular) == \
        (b.keys, b.id_of, b.unit, b.period_ops, b.first_regular, b.end_regular)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_tiled_passes_equal_the_long_way(case):
    for s, long in _pairs(case):
        fast_streams, long_streams = events._by_stream(s), events._by_stream(long)
        assert list(fast_streams) == list(long_streams)
        for k, ops in fast_streams.items():
            # equal records (a StampedOps builds a record again each time it is read: sim/schedule/stamped_ops.py)
            assert len(ops) == len(long_streams[k]) and all(map(lambda a, b: a == b, ops, long_streams[k]))
        assert events._valid_ops(s.ops, s.tiled_arrays) and events._valid_ops(long.ops)
        kind, ptr, idx = compiled._kind_and_deps(s.ops, [op.work for op in s.ops], None)
        for a, b in ((s.tiled_arrays.kind, kind), (s.tiled_arrays.dep_ptr, ptr), (s.tiled_arrays.dep_idx, idx)):
            _same_arrays(a, b)
        fast, slow = StageOps.of(s), StageOps.of(long)
        for a, b in ((fast.dep_ptr, slow.dep_ptr), (fast.dep_ids, slow.dep_ids), (fast.prev, slow.prev),
                     (fast.p2p, slow.p2p)):
            _same_arrays(a, b)
        assert cp._stream_prev(s) == cp._stream_prev(long)
        parts = key_parts(s)
        assert parts == key_parts(long)
        keys, mbs, p2p = parts
        assert keys == ref_state.op_keys(s)
        id_of = dict(zip(keys, range(len(keys)), strict=True))
        index = key_index(s)
        assert index.kid.tolist() == [id_of[k] for k in keys]
        per_mb = max(1, len(s.ops) // max(1, s.micro_batches))
        for unit in (1, 2):
            shifted = later_keys(keys, mbs, p2p, unit)
            assert shifted == [later(k, unit) for k in keys]
            assert index.later_ids(unit).tolist() == [id_of.get(k, -1) for k in shifted]
            probes = {*shifted, *(later(k, -unit) for k in keys), (None, 0), (None, len(keys)), (-5, 0), (0, -1)}
            assert all(index.id_of(k) == id_of.get(k) for k in probes)
            for p in (0, 1, per_mb // 2, per_mb, 2 * per_mb, len(s.ops) - 1, len(s.ops)):
                _same_arrays(regular_mask(s.ops, index, p, unit, tiled=s.tiled_arrays),
                             regular_mask(long.ops, key_index(long), p, unit))
            for lead in (0, 1, 2):
                fast, slow, ref = stage_map(s, lead, unit), stage_map(long, lead, unit), ref_state.stage_map(s, lead, unit)
                _same_map(fast, slow)
                _same_map(fast, ref)
                if not isinstance(fast, str):
                    assert [fast.mu(i) for i in range(len(keys))] == [ref.mu(i) for i in range(len(keys))]
                    assert [fast.mu_inv(i) for i in range(len(keys))] == [ref.mu_inv(i) for i in range(len(keys))]
        for dispatch_s in (20e-6, 7.3e-6, 1.0):
            fast_t, long_t = issue_times_s(s, dispatch_s), issue_times_s(long, dispatch_s)
            assert type(fast_t) is tuple and list(map(float.hex, fast_t)) == list(map(float.hex, long_t))
            assert host_syncs(s.ops, fast_t) == _host_syncs_per_op(long.ops, long_t)


def _host_syncs_per_op(ops, static_s) -> HostSyncs | None:
    """host.host_syncs op by op (its code before the C-level passes): the reference."""
    waits = [op for op in ops if op.host_wait is not None]
    if not waits or not static_s:
        return None
    point_of, last = [], -1
    for op in ops:
        last += op.host_wait is not None
        point_of.append(last)
    bases = tuple(static_s[op.id - 1] if op.id else 0.0 for op in waits)
    return HostSyncs(tuple(point_of), tuple(op.id for op in waits), tuple(op.host_wait for op in waits), bases)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), keep=st.integers(0, 7))
def test_per_work_counts_and_rows_equal_op_by_op(case, keep):
    for s, long in _pairs(case):
        table = s.work_table
        assert all(map(lambda op, k: op.work is table.works[k], s.ops, table.index.tolist()))
        firsts = {}
        for i, op in enumerate(s.ops):
            firsts.setdefault(id(op.work), i)
        assert list(firsts) == list(map(id, table.works)) and table.first.tolist() == list(firsts.values())
        counts, reference = count_collectives(s.ops), count_collectives_per_op(s.ops)
        assert list(counts.items()) == list(reference.items())  # the same counts, keys in the same order
        assert list(collective_counts(s).items()) == list(reference.items())
        assert count_collectives(iter(s.ops)) == reference  # any iterable, read once
        # rows for some of the keys only (an op whose key has no row is left out)
        rows = [CollectiveRow(k[0], k[1], 8, k[2], *(k[3:] or ("nccl",))) for i, k in enumerate(counts) if i % 8 != keep]
        slow = op_collectives_per_op(s, rows)
        for fast in (op_collectives(s, rows), op_collectives(long, rows)):
            assert list(fast) == list(slow) and all(fast[k] is slow[k] for k in slow)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(mbs=st.lists(st.one_of(st.none(), st.integers(0, 2**40)), max_size=30))
def test_mb_codes_equal_the_list_comprehension(mbs):
    known = [m for m in mbs if m is not None]
    none_code = min(known, default=0) - 1
    _same_arrays(mb_codes(mbs), np.array([none_code if m is None else m for m in mbs], np.int64)
                 if mbs else np.zeros(0, np.int64))


def test_negative_controls():
    """The comparisons see a changed value: a collective counted once more, a changed stream, a later key."""
    s = build_stage_schedules(resolved("tiny-2gpu"))[0]
    ops = list(s.ops)
    first = next(i for i, op in enumerate(ops) if isinstance(op.work, Collective))
    assert count_collectives(ops + [ops[first]]) != count_collectives_per_op(ops)
    moved = replace(s, ops=tuple(ops[:first] + [ops[first]._replace(stream="dp_comm")] + ops[first + 1:]), tiling=None)
    assert events._by_stream(moved) != events._by_stream(s)
    keys = key_parts(s)[0]
    assert later_keys(keys, key_parts(s)[1], key_parts(s)[2], 1) != [later(k, 2) for k in keys]


@pytest.mark.parametrize("name", ["llama31-405b-h100-tp8-pp8-cp2"])
def test_library_schedule_takes_the_tiled_path(name):
    """Every stage of a library run is tiled (else the shortcuts would silently take the long way)."""
    assert all(s.tiled_arrays is not None for s in build_stage_schedules(resolved(name, {}, 16)))


@pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled core is not built")
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_events_by_end_equal_sorted_events(case):
    """period_path.by_end over the compiled core's rows (a stable argsort of the end column) equals sorting
    each rank's events by end (ties in completion order), events and ends alike; breakdown's middle layer
    and layer spans over rows equal those over the Event tuples."""
    rs = resolved_case(case)
    schedules = build_stage_schedules(rs)
    log = run_stages(rs, schedules, simulated_ranks(rs, False), CollectiveCoster(rs), "compiled")
    assert is_rows(log.events)  # the compiled core's rows: by_end takes the argsort
    by = log.by_rank()
    for rank in log.ranks:
        fast, fast_ends = by_end(log, rank, by[rank])
        slow, slow_ends = by_end_sorted(by[rank])
        assert list(fast) == slow and fast_ends == slow_ends
    # the proof's arbiter-job window and time values from the log's span arrays equal the per-job loops
    if log.jobs:
        starts = sorted(j.start_s for j in log.jobs)
        for q in (0.1, 0.35, 0.5, 0.8):
            c1 = starts[int(q * (len(starts) - 1))] + 1e-9
            for period_s in (starts[-1] / 7, starts[-1] / 3):
                cut = Cut(c1, period_s, 1e-12, 0.0)
                for shift in (lambda x: x, lambda x: None):
                    assert jobs_repeat(log.jobs, cut, shift, shift, log.span_times("jobs")) == \
                        ref_state.jobs_repeat(log.jobs, cut, shift, shift)
                got = change_times(log, c1, c1 + period_s).tolist()
                assert sorted(set(got)) == sorted(set(ref_state.time_values(log, c1, c1 + period_s)))
    # the critical path's top op types summed per key with np.add.at equal the per-segment loop's, to the bit
    path = cp.critical_path(schedules, log)
    counted = [replace(seg, count=1 + i % 3) for i, seg in enumerate(path)]
    for segments in (path, counted, path[:1], []):
        for n in (8, 10**6):
            fast, slow = cp.top_op_types(segments, n), cp.top_op_types_per_segment(segments, n)
            assert [(k, c, float.hex(t), m) for k, c, t, m in fast] == [(k, c, float.hex(t), m) for k, c, t, m in slow]
            # the result's list, computed once with every type, cut at n: the same rows
            assert list(all_op_types(segments)[:n]) == fast
    # breakdown's layer figures over rows (op fields read off the ops) equal those over Event tuples
    for rows in (*(log.of_rank(r) for r in log.ranks), log.events):
        assert is_rows(rows)
        events_list = list(rows)
        middle = bd.middle_layer(rows)
        assert middle == bd.middle_layer(events_list)
        for layer in (middle, None, 0, 10**6):
            for phases in (("fwd",), ("bwd", "recompute"), ()):
                assert float.hex(bd.layer_span_ms(rows, layer, phases)) == \
                    float.hex(bd.layer_span_ms(events_list, layer, phases))


@pytest.mark.parametrize("name", ["llama2-70b-h100-pp4", "mixtral-8x7b-h100-ep8", "gpt-oss-120b-h100-pp4-ep8"])
def test_stage_maps_at_the_plan_equal_the_reference(name):
    """At the steady plan's lead (where the proof builds them) every stage's map is found, and equals the
    per-op reference (tests/results_reference/period_state.py): regular part, mu and mu^-1 of every op."""
    rs = resolved(name, {}, 16)
    plan = steady_plan(rs)
    for s in build_stage_schedules(rs):
        fast, ref = stage_map(s, plan.lead, plan.unit), ref_state.stage_map(s, plan.lead, plan.unit)
        assert isinstance(fast, StageMap)
        _same_map(fast, ref)
        assert [fast.mu(i) for i in range(len(s.ops))] == [ref.mu(i) for i in range(len(s.ops))]
        assert [fast.mu_inv(i) for i in range(len(s.ops))] == [ref.mu_inv(i) for i in range(len(s.ops))]


@pytest.mark.parametrize("dep", [-1, 10**6])
def test_a_tiled_schedule_with_an_unknown_dep_is_refused_alike(dep):
    """The tiled validity check (deps in [0, n)) refuses what the per-op check refuses, with its message."""
    s = build_stage_schedules(resolved("tiny-2gpu"))[0]
    assert events._valid_ops(s.ops, s.tiled_arrays) and events._valid_ops(s.ops)
    ops = OpList(s.ops)
    ops[5] = ops[5]._replace(deps=(*ops[5].deps, dep))  # a replaced op: read off its record (loose)
    bad = tuple(ops)
    sched = replace(s, ops=bad, tiling=ops.sealed(bad))
    assert sched.tiled_arrays is not None and sched.tiled_arrays.dep_idx.tolist().count(dep) == 1
    assert not events._valid_ops(bad, sched.tiled_arrays) and not events._valid_ops(bad)
    with pytest.raises(ValueError, match="depends on unknown op ids"):
        events.check_inputs(sched, [0, 1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 2**40), max_size=40), st.sampled_from([np.int64, np.int32, np.intp]))
def test_distinct_ints_equal_np_unique(values, dtype):
    """distinct_ints (sort and compare, no numpy.ma import) gives np.unique's values and order."""
    arr = np.asarray([v % 2**31 if dtype is np.int32 else v for v in values], dtype)
    assert distinct_ints(arr) == np.unique(arr).tolist()
