"""parallel.dist_opt_instances (Megatron's --num-distributed-optimizer-instances): the DP group is cut into
contiguous instances; each bucket is reduce-scattered inside its instance and its shard all-reduced across
them; the optimizer states shard inside an instance; the rules refuse what Megatron refuses or meshsim does
not model. Closed forms on the tiny model (2 layers, hidden 256) at tp 1 over 8 GPUs (dp 8)."""

from __future__ import annotations

import copy
import math

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.cost.memory import memory_per_gpu, params_per_rank
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.dp_ops import GRAD_BYTES
from meshsim.sim.schedule.ops import Collective, OptimizerStep

BASE = {"parallel.tp": 1, "parallel.gpus": 8, "parallel.distributed_optimizer": True, "parallel.dp_overlap": True,
        "parallel.global_batch": 16, "parallel.dp_bucket_mib": 1}  # dp 8, one micro-batch, a few buckets


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, copy.deepcopy({**BASE, **overrides}), source), source)


def hierarchical(ranks: list[int], sizes: tuple[int, int]) -> list[list[list[int]]]:
    """Megatron-Core's create_hierarchical_groups (parallel_state.py L378-400 @d98e8a64) for two levels:
    level one the consecutive blocks of sizes[0], level two the members at stride sizes[0]."""
    k, n = sizes
    first = [ranks[i:i + k] for i in range(0, k * n, k)]
    second = [[ranks[i + j * k] for j in range(n)] for i in range(k)]
    return [first, second]


@pytest.mark.parametrize("tp,dp,cp,ep,etp,instances", [(1, 8, 1, 1, 1, 2), (2, 4, 1, 2, 1, 2), (2, 4, 2, 4, 2, 2),
                                                       (1, 16, 1, 4, 1, 4)])
def test_instance_groups_are_megatrons_hierarchy_of_the_dp_and_edp_groups(tp, dp, cp, ep, etp, instances):
    """"dp_in" / "dp_out" are the two levels of the dp-cp group cut into `instances`, "edp_in" the first of the
    edp group's, and the experts' second level is the same "dp_out" group (one inter-instance group)."""
    stage = tp * dp * cp
    for rank in range(2 * stage):  # two pipeline stages
        g = lambda kind, rank=rank: mesh_group(kind, rank, tp, dp, pp=2, ep=ep, etp=etp, cp=cp,  # noqa: E731
                                               instances=instances)
        for domain, inner in (("dp", "dp_in"), ("edp", "edp_in")):
            full = list(g(domain))
            first, second = hierarchical(full, (len(full) // instances, instances))
            assert list(g(inner)) == next(b for b in first if rank in b)
            assert list(g("dp_out")) == next(b for b in second if rank in b)


def test_each_bucket_is_reduce_scattered_in_its_instance_and_its_shard_all_reduced_across():
    rs = tiny({"parallel.dist_opt_instances": 2})
    plain = build_schedule(tiny({}))
    sched = build_schedule(rs)
    assert rs.dp == 8 and rs.instances == 2
    dp_ops = [op for op in sched.ops if op.name.startswith("dp.")]
    plain_rs = [op.work for op in plain.ops if op.name.startswith("dp.") and op.work.op == "reduce_scatter"]
    scatters = [op for op in dp_ops if op.work.op == "reduce_scatter"]
    across = [op for op in dp_ops if op.work.op == "all_reduce"]
    gathers = [op for op in dp_ops if op.work.op == "all_gather"]
    assert len(scatters) == len(across) == len(gathers) == len(plain_rs) > 1
    for s, a, p in zip(scatters, across, plain_rs, strict=True):
        params = p.nbytes // GRAD_BYTES
        assert (s.work.group, s.work.nbytes, s.work.boundary) == ("dp_in", p.nbytes, K.DP_GRAD)
        assert (a.work.group, a.work.boundary) == ("dp_out", K.DP_GRAD + K.ACROSS_INSTANCES)
        assert a.work.nbytes == math.ceil(params / 4) * GRAD_BYTES  # the shard of 8 / 2 = 4 ranks
        assert s.id in a.deps and a.stream == s.stream == "dp_comm"
    assert {op.work.group for op in gathers} == {"dp_in"}
    step = next(op for op in sched.ops if op.name == "opt.step")
    assert all(a.id in step.deps for a in across)
    plain_step = next(op for op in plain.ops if op.name == "opt.step")
    assert isinstance(step.work, OptimizerStep)
    assert step.work.params == math.ceil(params_per_rank(rs) / 4)  # owned: 1 / (dp / instances)
    assert plain_step.work.params == math.ceil(params_per_rank(rs) / 8)


def test_one_instance_is_the_plain_distributed_optimizer():
    assert build_schedule(tiny({"parallel.dist_opt_instances": 1})) == build_schedule(tiny({}))


def test_optimizer_states_shard_inside_an_instance():
    """Adam's 12 B per owned parameter: instances x the plain distributed optimizer's states; weights and
    gradients unchanged."""
    plain, two, four = (memory_per_gpu(tiny({"parallel.dist_opt_instances": n})) for n in (1, 2, 4))
    assert two.optimizer_gb == pytest.approx(2 * plain.optimizer_gb, rel=1e-3)
    assert four.optimizer_gb == pytest.approx(4 * plain.optimizer_gb, rel=1e-3)
    assert (two.weights_gb, two.grads_gb) == (plain.weights_gb, plain.grads_gb)


def test_results_echo_and_header_name_the_instances():
    from meshsim.sim.outputs.step_report import config_line
    from meshsim.sim.results.simulate import simulate

    r = simulate(tiny({"parallel.dist_opt_instances": 2}))
    assert r.config.dist_opt_instances == 2 and r.config.to_json()["dist_opt_instances"] == 2
    assert "dp=8 (2 optimizer instances)" in config_line(r.config)
    assert "dist_opt_instances" not in simulate(tiny({})).config.to_json()


@pytest.mark.parametrize("overrides,problem", [
    ({"parallel.dist_opt_instances": 2, "parallel.distributed_optimizer": False}, "distributed optimizer"),
    ({"parallel.dist_opt_instances": 3}, "does not divide dp x cp = 8"),
    ({"parallel.dist_opt_instances": 2, "optimizer.name": "muon"}, "layer-wise"),
])
def test_rules_refuse_with_the_fix(overrides, problem):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert problem in str(err.value) and "parallel.dist_opt_instances" in str(err.value)


def test_expert_buckets_use_the_experts_instance_and_the_shared_group_across():
    """An MoE model: the routed experts' buckets reduce-scatter over "edp_in" (edp / instances ranks) and
    all-reduce their shard over the same "dp_out" group as the dense buckets."""
    moe = {"model.moe": {"experts": 4, "top_k": 2, "ffn_hidden": 256}, "parallel.ep": 2}
    rs = tiny({**moe, "parallel.dist_opt_instances": 2})
    assert rs.edp == 4
    expert = [op.work for op in build_schedule(rs).ops if op.name.startswith("dp.")
              and isinstance(op.work, Collective) and K.EXPERT_GRAD in op.work.boundary]
    scatters = [w for w in expert if w.op == "reduce_scatter"]
    across = [w for w in expert if w.op == "all_reduce"]
    assert scatters and {w.group for w in scatters} == {"edp_in"} and {w.group for w in across} == {"dp_out"}
    for s, a in zip(scatters, across, strict=True):
        assert a.nbytes == math.ceil(s.nbytes // GRAD_BYTES / 2) * GRAD_BYTES  # edp / instances = 2
    with pytest.raises(UserError, match="edp = 4"):
        tiny({**moe, "parallel.ep": 2, "parallel.dist_opt_instances": 8})


def test_a_sweep_over_instances_runs_each_and_says_what_they_changed():
    """--dist-opt-instances 1,2: every point per value; a point above 1 runs the distributed optimizer; the
    explanation's sentence carries the records' memory and speed (the optimizer states double)."""
    from meshsim.sim.sweep.axes import configurations, sweep_axes
    from meshsim.sim.sweep.explain import explain
    from meshsim.sim.sweep.instances_explain import instances_sentence
    from meshsim.sim.sweep.runner import run_sweep

    scenario, source = load_scenario("tiny-2gpu")
    plain = with_overrides(scenario, {"parallel.gpus": 8, "parallel.global_batch": 16}, source)
    points = configurations(sweep_axes(plain, {"tp": "1", "dist_opt_instances": "1,2"}))
    assert [p.dist_opt_instances for p in points] == [1, 2]
    assert points[1].key.endswith(",instances=2") and "instances" not in points[0].key
    assert points[1].overrides()["parallel.distributed_optimizer"] is True  # the instances cut its shards
    assert "parallel.distributed_optimizer" not in points[0].overrides()  # one instance: the scenario's choice
    scenario = with_overrides(plain, {"parallel.distributed_optimizer": True}, source)
    one, two = run_sweep(scenario, source, points, progress=False)
    assert one.ok and two.ok and two.result.memory_gb.optimizer > one.result.memory_gb.optimizer
    text = instances_sentence(two, one)
    assert "2 optimizer instances hold" in text and f"{two.result.memory_gb.total * 1e9 / 2**30:.2f}" in text
    best = max((one, two), key=lambda r: r.result.tokens_per_s)
    other = two if best is one else one
    assert instances_sentence(best, other) in explain([one, two])


def test_out_of_memory_advice_offers_fewer_instances_and_not_fsdp_beside_them():
    from meshsim.sim.outputs.advice import memory_fixes

    fixes = " ".join(memory_fixes({"tp": 1, "pp": 1, "distributed_optimizer": True, "fsdp": False,
                                   "dist_opt_instances": 4}))
    assert "parallel.dist_opt_instances, now 4" in fixes and "parallel.fsdp" not in fixes
    assert "dist_opt_instances" not in " ".join(memory_fixes({"tp": 1, "pp": 1, "distributed_optimizer": True}))


def test_validate_times_instances_and_checks_numerics_without_them():
    from meshsim.validate.launch.shrink import NUMERICS, TIMING, shrink

    scenario, source = load_scenario("tiny-2gpu")
    scenario = with_overrides(scenario, {**BASE, "parallel.dist_opt_instances": 4}, source)
    timed, checked = shrink(scenario, 4, TIMING, source), shrink(scenario, 4, NUMERICS, source)
    assert timed.parallel.dist_opt_instances == 4 and timed.parallel.distributed_optimizer
    assert checked.parallel.dist_opt_instances == 1 and not checked.parallel.distributed_optimizer
    assert shrink(scenario, 2, TIMING, source).parallel.dist_opt_instances == 2  # gcd(4, dp' = 2)


def test_fsdp_with_instances_is_hybrid_sharding():
    """Megatron-FSDP's HSDP: each block gathers over its instance (dp / I ranks) and reduce-scatters there in
    every micro-batch; only the last micro-batch all-reduces each block's gradient shard across the
    instances; weights, gradients and states shard over dp / I (the resident shards double at I = 2)."""
    fsdp = {"parallel.fsdp": True, "parallel.global_batch": 32}  # dp 8, 2 micro-batches
    rs = tiny({**fsdp, "parallel.dist_opt_instances": 2})
    ops = build_schedule(rs).ops
    gathers = [op.work for op in ops if K.FSDP_GATHER in op.name]
    scatters = [op for op in ops if op.name.endswith("." + K.FSDP_GRAD)]
    across = [op for op in ops if (K.FSDP_GRAD + K.ACROSS_INSTANCES) in op.name]
    assert gathers and {w.group for w in gathers} == {"dp_in"}
    assert {op.work.group for op in scatters} == {"dp_in"} and {op.micro_batch for op in scatters} == {0, 1}
    assert {op.micro_batch for op in across} == {1} and len(across) == len([s for s in scatters if s.micro_batch == 1])
    by_id = {op.id: op for op in ops}
    for a in across:
        (rs_id,) = a.deps
        assert a.work.group == "dp_out" and by_id[rs_id].work.op == "reduce_scatter"
        assert a.work.nbytes == math.ceil(by_id[rs_id].work.nbytes // GRAD_BYTES / 4) * GRAD_BYTES
    assert not [op for op in ops if op.name.startswith("dp.")]  # no DDP buckets under FSDP
    one, two = (memory_per_gpu(tiny({**fsdp, "parallel.dist_opt_instances": n})) for n in (1, 2))
    assert two.optimizer_gb == pytest.approx(2 * one.optimizer_gb, rel=1e-3)
    assert two.weights_gb > one.weights_gb and two.grads_gb > one.grads_gb
