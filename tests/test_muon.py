"""optimizer.name: muon (Megatron --optimizer muon): which parameters Muon owns, their 8-byte states, the
Newton-Schulz GEMMs and the TP momentum gather before the step, in closed form on the tiny model (2 layers,
hidden 256, 4 heads of 64, gelu ffn 1024, tp 2), with Adam as the negative control, and the rules."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.units import GB
from meshsim.sim.cost.memory import memory_per_gpu, params_per_rank
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.muon import owned_muon_params
from meshsim.sim.schedule.ops import Collective, Gemm, OptimizerStep
from meshsim.sim.schedule.optimizer_states import MUON_STATE_BYTES, MUON_STEP_BYTES
from meshsim.sim.schedule.shapes import layer_dims

MUON = {"optimizer.name": "muon"}


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, copy.deepcopy(overrides), source), source)


def ns_flops(m: int, n: int, count: int, steps: int = 5) -> float:
    """Newton-Schulz on `count` m x n matrices (m <= n): steps x (2 m^2 n + 2 m^3 + 2 m^2 n)."""
    return count * steps * (4 * m * m * n + 2 * m**3)


def muon_ops(schedule) -> list:
    return [op for op in schedule.ops if op.name.startswith(f"{K.OPT_BLOCK}.muon_")]


def test_muon_owns_every_layer_linear_and_adam_the_rest():
    """Per layer q, k, v, proj, fc1, fc2 (this rank's TP shards): the four linears' weights; the embedding,
    norms and biases stay with Adam. States: 8 B per Muon parameter, 12 per Adam one."""
    rs, adam = tiny(MUON), tiny({})
    d = layer_dims(rs)
    muon = owned_muon_params(rs, d, range(2))
    assert muon == 2 * d.linear_weights and owned_muon_params(adam, d, range(2)) == 0
    total = params_per_rank(rs)
    assert memory_per_gpu(rs).optimizer_gb == pytest.approx(((total - muon) * 12 + muon * MUON_STATE_BYTES) / GB)
    assert memory_per_gpu(adam).optimizer_gb == pytest.approx(total * 12 / GB)


def test_newton_schulz_gemms_and_the_tp_gather_in_closed_form():
    """Whole matrices (duplicated TP mode): q, k, v, proj are 256 x 256, fc1 1024 x 256 and fc2 256 x 1024;
    each TP rank gathers every sharded momentum (fp32) and orthogonalizes all of them (no distributed
    optimizer): 8 square and 4 oblong matrices, 5 iterations."""
    sched = build_schedule(tiny(MUON))
    ops = muon_ops(sched)
    gather = [op.work for op in ops if isinstance(op.work, Collective)]
    assert len(gather) == 1 and (gather[0].op, gather[0].group) == ("all_gather", "tp")
    assert gather[0].nbytes == 2 * (4 * 256 * 256 + 2 * 1024 * 256) * 4
    gemms = [op.work for op in ops if isinstance(op.work, Gemm)]
    assert sum(g.flops for g in gemms) == ns_flops(256, 256, 8) + ns_flops(256, 1024, 4)
    assert {(g.m, g.n, g.k, g.batch) for g in gemms} == {
        (256, 256, 256, 40), (256, 256, 1024, 20), (256, 256, 256, 20), (256, 1024, 256, 20)}


def test_the_step_waits_for_newton_schulz_which_waits_for_the_reductions():
    sched = build_schedule(tiny(MUON))
    ops = muon_ops(sched)
    step = next(op for op in sched.ops if op.name == "opt.step")
    assert step.deps == (ops[-1].id,) and all(b.id == a.id + 1 for a, b in zip(ops, ops[1:], strict=False))
    backward_end = max(op.id for op in sched.ops if op.micro_batch is not None)  # the last backward op
    assert backward_end in ops[0].deps and ops[0].id > backward_end
    work = step.work
    assert isinstance(work, OptimizerStep)
    muon, total = owned_muon_params(tiny(MUON), layer_dims(tiny(MUON)), range(2)), params_per_rank(tiny(MUON))
    assert work.bytes_per_param == pytest.approx(((total - muon) * 32 + muon * MUON_STEP_BYTES) / total)
    assert not muon_ops(build_schedule(tiny({})))  # negative control: Adam


def test_the_layer_wise_distributed_optimizer_splits_the_matrices_over_dp():
    """tp 1, dp 2 with the distributed optimizer: each rank orthogonalizes half the matrices (rounded up per
    shape) and gathers nothing over TP."""
    rs = tiny({**MUON, "parallel.tp": 1, "parallel.distributed_optimizer": True, "parallel.global_batch": 8})
    ops = muon_ops(build_schedule(rs))
    assert not [op for op in ops if isinstance(op.work, Collective)]
    gemms = [op.work for op in ops if isinstance(op.work, Gemm)]
    assert sum(g.flops for g in gemms) == ns_flops(256, 256, 4) + ns_flops(256, 1024, 2)
    assert owned_muon_params(rs, layer_dims(rs), range(2)) == layer_dims(rs).linear_weights  # 2 layers / 2


@pytest.mark.parametrize("overrides,field", [
    ({**MUON, "parallel.tp": 1, "parallel.distributed_optimizer": True, "parallel.fsdp": True,
      "parallel.global_batch": 8}, "optimizer.name"),
    ({**MUON, "optimizer.precision_aware": True}, "optimizer.precision_aware"),
    ({"optimizer.muon_ns_steps": 3}, "optimizer.muon_ns_steps"),
])
def test_muon_rules(overrides, field):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert err.value.field == field and "\n" not in str(err.value)


def test_the_error_band_says_no_published_run_checks_muon():
    from meshsim.sim.results.error_band import band_for

    assert "none of them runs Muon" in band_for(tiny(MUON).scenario).sentence()
    assert "unchecked" not in band_for(tiny({}).scenario).sentence()
