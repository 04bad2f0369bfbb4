"""The engine's per-work lookups by object identity (simulate.compute_fn's times, events.run's bytes and
flops per event) equal the long way, op by op, on the pipelined MoE library scenario (ops stamped from
shared templates, so most lookups hit, and works equal by value in distinct objects), and an equal but
distinct work object is not confused with another work."""

from __future__ import annotations

from dataclasses import replace

from test_steady_state import resolved

from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.engine.events import work_bytes
from meshsim.sim.results.costers import compute_fn
from meshsim.sim.results.simulate import simulate_with_events
from meshsim.sim.schedule.ops import P2P, Collective, Elementwise
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules


def test_identity_lookups_equal_the_long_way():
    rs = resolved("qwen3-30b-a3b-h100-ep16")
    schedules = build_stage_schedules(rs)
    model = ComputeModel(rs.gpu, rs.scenario.hardware.compute, rs.profile,
                         fill_uninitialized=rs.scenario.run.deterministic)
    compute_s = compute_fn(rs)
    ops = [op for s in schedules for op in s.ops if not isinstance(op.work, Collective | P2P)]
    assert len({id(op.work) for op in ops}) < len(ops)  # shared works: the lookup is exercised
    for op in ops + ops[::-1]:
        assert compute_s(op, 0) == model.time_s(op.work)
    _, log, _ = simulate_with_events(rs)
    by = {(s.stage, op.id): op for s in schedules for op in s.ops}
    for e in log.events:
        op = by[(rs.stage_of(e.rank), e.op_id)]
        assert (e.bytes, e.flops) == (work_bytes(op), op.flops)


def test_an_equal_work_in_another_object_gets_its_own_entry():
    rs = resolved("tiny-2gpu")
    compute_s = compute_fn(rs)
    op = next(op for op in build_stage_schedules(rs)[0].ops if isinstance(op.work, Elementwise))
    bigger = replace(op, work=replace(op.work, bytes_read=op.work.bytes_read * 4 + 1))
    same = replace(op, work=replace(op.work))
    assert compute_s(op, 0) == compute_s(same, 0) < compute_s(bigger, 0)
