"""Megatron-LM 2021-2022's P2P scatter-gather (parallel.p2p_scatter_gather): each TP rank sends 1/tp of the
pipeline tensor and the receiver all-gathers it over TP before the block uses it; under SP or at tp 1 the
schedule is the plain one, op for op."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.ops import P2P, Collective
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

TP, PP = 2, 2
SEQ, MB, HIDDEN, DTYPE = 128, 2, 256, 2  # tiny-2gpu's shapes, bf16
FULL_BYTES = SEQ * MB * HIDDEN * DTYPE


def rs_with(**overrides):
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": TP * PP, "parallel.tp": TP, "parallel.pp": PP, "parallel.sp": False,
            "parallel.dp": 1, "parallel.global_batch": 8, "model.layers": 4}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def gathers(schedule):
    return [op for op in schedule.ops if isinstance(op.work, Collective) and op.work.boundary == K.PP_GATHER]


def test_sends_a_tp_th_and_gathers_the_whole_tensor_after_each_receive():
    for stage in build_stage_schedules(rs_with(**{"parallel.p2p_scatter_gather": True})):
        batches = [op for op in stage.ops if isinstance(op.work, P2P)]
        assert batches and all(t.nbytes == FULL_BYTES // TP for op in batches for t in op.work.transfers)
        receives = [(op, t) for op in batches for t in op.work.transfers if not t.send]
        found = gathers(stage)
        assert len(found) == len(receives)  # one all-gather per received tensor
        for (batch, t), g in zip(receives, found, strict=True):
            assert g.work.op == "all_gather" and g.work.group == "tp" and g.work.nbytes == FULL_BYTES
            assert g.deps == (batch.id,) and g.stream == "tp_comm" and g.micro_batch == t.micro_batch
            # the block that consumes the receive depends on the gather, not on the batch
            consumers = [op for op in stage.ops if g.id in op.deps]
            assert consumers and all(batch.id not in op.deps for op in consumers if op.stream == "compute")


@pytest.mark.parametrize("overrides", [{"parallel.sp": True}, {"parallel.tp": 1, "parallel.gpus": PP}])
def test_under_sp_or_at_tp1_it_is_the_plain_schedule(overrides):
    plain = build_stage_schedules(rs_with(**overrides))
    asked = build_stage_schedules(rs_with(**{**overrides, "parallel.p2p_scatter_gather": True}))
    assert asked == plain  # negative control: nothing changes where Megatron's rule does not apply
    assert not any(gathers(s) for s in asked)


def test_blocking_p2p_waits_for_the_gather():
    """Blocking P2P (1F1B): the next op of the stage, whatever it is, waits for the gather, as
    _communicate returns only after gather_split_1d_tensor."""
    stage = build_stage_schedules(rs_with(**{"parallel.p2p_scatter_gather": True}))[1]
    for g in gathers(stage):
        nxt = next(op for op in stage.ops[g.id + 1:] if op.stream in ("compute", "pp_comm"))
        assert g.id in nxt.deps


def test_step_simulates_and_moves_fewer_bytes_between_stages():
    plain = simulate(rs_with())
    sg = simulate(rs_with(**{"parallel.p2p_scatter_gather": True}))
    assert sg.step_time_s > 0 and sg.step_time_s != plain.step_time_s
