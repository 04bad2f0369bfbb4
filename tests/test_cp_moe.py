"""Context parallelism with MoE layers, as Megatron-Core folds them (parallel_state.py L859-895 @d98e8a64):
attention on tp-cp-dp-pp, experts on etp-ep-edp-pp over the same ranks. Each rank routes its s / cp tokens
(closed form), the expert groups are Megatron's RankGenerator's with cp folded in, the mesh is symmetric
(explicit ranks give the representative's step), the default run equals --full, and memory and dispatch
bytes scale as 1 / cp. Negative controls: MLA and sliding windows with cp stay refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.results.simulate import simulate, simulate_steady
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.moe_shapes import moe_dims
from meshsim.sim.schedule.ops import Collective
from tests.test_moe_config import expert_reference
from tests.test_steady_state import assert_same_step, resolved
from tests.test_steady_state_generated import HOST, check, host

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def tiny(cp: int, **extra):
    """tiny-2gpu (seq 128, micro-batch 2) as an MoE model on 8 GPUs: tp 2 + SP, cp `cp`, ep 4."""
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": True, "parallel.cp": cp, "parallel.ep": 4,
            "parallel.global_batch": 8, **MOE, **extra}
    return resolve(with_overrides(scenario, over, source), source)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_each_rank_routes_its_cp_share_of_the_tokens(cp):
    """T = s b / (cp tp) = 128 x 2 / (cp x 2); the dispatch all-to-all sends T k rows of h bf16 elements."""
    rs = tiny(cp)
    dims = moe_dims(rs)
    assert dims.tokens == 128 * 2 // (cp * 2)
    hidden = rs.scenario.model.hidden
    dispatch = [op.work for op in build_schedule(rs).ops if op.name == "L0.mb0.fwd.dispatch"]
    assert [w.nbytes for w in dispatch] == [dims.tokens * 2 * hidden * 2]
    assert dispatch[0].group == "ep" and rs.group("ep", 0) == (0, 1, 2, 3)


@pytest.mark.parametrize("tp,dp,cp,ep,etp", [(1, 4, 2, 8, 1), (2, 2, 2, 4, 1), (2, 2, 2, 4, 2), (2, 1, 4, 8, 1),
                                             (1, 2, 4, 2, 2)])
def test_the_expert_mesh_folds_cp_in_as_megatron_does(tp, dp, cp, ep, etp):
    """Megatron's expert generator runs over the stage's tp cp dp contiguous ranks with cp = 1: the same
    groups as a mesh of dp' = cp dp replicas; the attention cp group is tp apart (tp-cp-dp order)."""
    for kind, rank in itertools.product(("etp", "ep", "etp_ep", "edp"), range(2 * tp * cp * dp)):
        assert mesh_group(kind, rank, tp, dp, pp=2, ep=ep, etp=etp, cp=cp) == \
            expert_reference(kind, rank, tp, cp * dp, ep, etp)
    assert mesh_group("cp", 0, tp, dp, pp=2, cp=cp) == tuple(range(0, tp * cp, tp))


def test_the_step_is_symmetric_and_extrapolates_exactly():
    """Explicit ranks (one tp group x 2 replicas, real rendezvous) give the representative rank's step;
    the default (extrapolated) run equals --full."""
    rs = tiny(2)
    assert simulate(rs, explicit_ranks=True, full=True).step_time_s == \
        pytest.approx(simulate(rs, full=True).step_time_s, rel=1e-12)
    rs = resolved("tiny-2gpu", {"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": True, "parallel.cp": 2,
                                "parallel.ep": 4, **MOE})
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    assert_same_step(ex, simulate(rs, full=True))


def test_cp_halves_the_moe_activations_and_keeps_the_expert_states():
    """Mixtral 8x7B on one DGX H100 (ep 8), cp 2 against cp 1 at the same GPUs: every layer holds half the
    tokens, so activations halve; experts stay sharded over ep 8 (weights and grads unchanged) and dense
    gradients reduce over dp x cp = 8 either way."""
    scenario, source = load_scenario("mixtral-8x7b-h100-ep8")
    mem = {cp: memory_per_gpu(resolve(with_overrides(scenario, {"parallel.cp": cp}, source), source))
           for cp in (1, 2)}
    assert mem[2].activations_gb == pytest.approx(mem[1].activations_gb / 2, rel=0.02)
    assert (mem[2].weights_gb, mem[2].grads_gb) == (mem[1].weights_gb, mem[1].grads_gb)
    rs = resolve(with_overrides(scenario, {"parallel.cp": 2}, source), source)
    assert (rs.dp, rs.grad_dp, rs.edp) == (4, 8, 1)
    groups = {op.work.group for op in build_schedule(rs).ops if isinstance(op.work, Collective)}
    assert {"cp", "ep"} <= groups


@pytest.mark.parametrize("extra", [{"model.sliding_window": 32},
                                   {"model.mla": {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_head_dim": 32,
                                                  "qk_rope_head_dim": 16, "v_head_dim": 32}}])
def test_cp_with_mla_or_windows_stays_refused(extra):
    with pytest.raises(UserError) as err:
        tiny(2, **extra)
    assert err.value.field == "parallel.cp" and "does not model context parallelism" in str(err.value)


moe_cp = st.fixed_dictionaries({
    "parallel.tp": st.sampled_from([1, 2]),
    "parallel.cp": st.sampled_from([1, 2, 4]),
    "parallel.cp_comm": st.sampled_from(["p2p", "a2a", "allgather"]),
    "parallel.ep": st.sampled_from([2, 4, 8]),
    "parallel.moe_dispatcher": st.sampled_from(["alltoall", "alltoall", "flex"]),
    "parallel.moe_ep_overlap": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective"]),
    "parallel.dp_overlap": st.booleans(),
    "model.layers": st.integers(1, 2),
    "model.seq_len": st.sampled_from([128, 512]),
    "hardware.compute.comm_interference": st.sampled_from([0.0, 0.3]),
})


@settings(max_examples=24, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=moe_cp, host_mode=HOST)
def test_default_equals_full_on_generated_moe_cp_scenarios(overrides, host_mode):
    """The steady-state differential test (tests/test_steady_state_generated.py) over MoE x CP layouts on
    16 GPUs of two DGX H100: tp, cp, cp_comm, ep (inside a node or across), dispatcher, EP overlap, hosts."""
    o = {**overrides, **MOE, "parallel.gpus": 16, "topology.nodes": 2, "parallel.dp": "auto",
         "parallel.sp": overrides["parallel.tp"] > 1, "parallel.micro_batch": 1}
    if o["parallel.moe_ep_overlap"]:
        o["parallel.delay_wgrad_compute"] = True
    check({**o, **host(o, *host_mode)}, 0)
