"""parallel.fsdp (Megatron-FSDP, ZeRO-3): every block gathers its weights before its forward and backward and
reduce-scatters its gradients after its backward, every micro-batch; the gathers run one block ahead in two
buffers; the step end has no DP buckets; weights and gradients are sharded in memory; the rules refuse what
is not modeled. Closed forms on the tiny model (2 layers, hidden 256, tp 1, dp 2, 2 micro-batches)."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.units import GB
from meshsim.sim.cost.fsdp_memory import largest_unit_params
from meshsim.sim.cost.memory import memory_per_gpu, params_per_rank
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import OptimizerStep
from meshsim.sim.schedule.shapes import layer_dims

FSDP = {"parallel.tp": 1, "parallel.fsdp": True, "parallel.distributed_optimizer": True,
        "parallel.global_batch": 8}  # 2 GPUs: dp 2, micro-batch 2, 2 micro-batches


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, copy.deepcopy(overrides), source), source)


def fsdp_ops(schedule) -> list:
    return [op for op in schedule.ops if K.FSDP_GATHER in op.name or K.FSDP_GRAD in op.name]


def by_name(schedule) -> dict:
    return {op.name: op for op in schedule.ops}


def test_each_block_gathers_its_weights_and_reduce_scatters_its_gradients_every_micro_batch():
    rs = tiny(FSDP)
    sched, d = build_schedule(rs), layer_dims(rs)
    ops = by_name(sched)
    assert rs.dp == 2 and rs.micro_batches == 2
    for mb in range(2):
        for layer in range(2):
            for phase in ("fwd", "bwd"):
                gather = ops[f"L{layer}.mb{mb}.{phase}.{K.FSDP_GATHER}"].work
                assert (gather.op, gather.group, gather.nbytes) == ("all_gather", "dp", 2 * d.layer_params)
            grad = ops[f"L{layer}.mb{mb}.bwd.{K.FSDP_GRAD}"].work
            assert (grad.op, grad.group, grad.nbytes) == ("reduce_scatter", "dp", 4 * d.layer_params)  # fp32
        # the embedding twice (forward, backward), the head once: its backward follows its forward
        for name in (f"embed.mb{mb}.fwd.", f"embed.mb{mb}.bwd.", f"head.mb{mb}.fwd."):
            assert name + K.FSDP_GATHER in ops
        assert f"head.mb{mb}.bwd.{K.FSDP_GATHER}" not in ops
        for block in ("embed", "head"):  # what is gathered is what is reduce-scattered
            gathered = ops[f"{block}.mb{mb}.{'fwd' if block == 'head' else 'bwd'}.{K.FSDP_GATHER}"].work.nbytes
            assert ops[f"{block}.mb{mb}.bwd.{K.FSDP_GRAD}"].work.nbytes == 2 * gathered
    assert len(fsdp_ops(sched)) == 2 * (2 * 2 + 3) + 2 * (2 + 2)  # per mb: 7 gathers, 4 reduce-scatters
    total = sum(op.work.nbytes for op in fsdp_ops(sched) if op.work.op == "reduce_scatter") // 4
    assert total == 2 * params_per_rank(rs)  # every parameter's gradient, once per micro-batch


def test_the_dp_stream_issues_the_next_gather_before_the_last_reduce_scatter():
    """Exact dp_comm order of micro-batch 0 (Megatron-FSDP's prefetch: AG(i-1) before RS(i))."""
    names = [op.name for op in build_schedule(tiny(FSDP)).ops if op.stream == "dp_comm"]
    g, r = K.FSDP_GATHER, K.FSDP_GRAD
    assert names[:12] == [f"embed.mb0.fwd.{g}", f"L0.mb0.fwd.{g}", f"L1.mb0.fwd.{g}", f"head.mb0.fwd.{g}",
                          f"L1.mb0.bwd.{g}", f"head.mb0.bwd.{r}", f"L0.mb0.bwd.{g}", f"L1.mb0.bwd.{r}",
                          f"embed.mb0.bwd.{g}", f"L0.mb0.bwd.{r}", f"embed.mb1.fwd.{g}", f"embed.mb0.bwd.{r}"]


def test_two_buffers_a_gather_waits_for_the_block_two_before_and_gates_its_own_block():
    sched = build_schedule(tiny(FSDP))
    ops, names = by_name(sched), [op.name for op in sched.ops]
    for gather, two_before in ((f"L1.mb0.fwd.{K.FSDP_GATHER}", "embed.mb0.fwd."),
                               (f"head.mb0.fwd.{K.FSDP_GATHER}", "L0.mb0.fwd."),
                               (f"L0.mb0.bwd.{K.FSDP_GATHER}", "head.mb0.")):
        deps = ops[gather].deps
        assert deps and all(names[i].startswith(two_before) for i in deps)
    assert not ops[f"embed.mb0.fwd.{K.FSDP_GATHER}"].deps and not ops[f"L0.mb0.fwd.{K.FSDP_GATHER}"].deps
    gate = ops[f"L1.mb0.fwd.{K.FSDP_GATHER}"].id
    block = [op for op in sched.ops if op.name.startswith("L1.mb0.fwd.") and op.stream == "compute"]
    assert gate in block[0].deps and all(op.id > gate for op in block)  # the block's entry op waits for it
    ungated = build_schedule(tiny({**FSDP, "parallel.fsdp": False, "parallel.distributed_optimizer": False}))
    assert not [i for op in ungated.ops if op.name == block[0].name for i in op.deps if ungated.ops[i].stream == "dp_comm"]


def test_the_step_ends_without_dp_buckets_and_the_optimizer_updates_its_shard():
    rs = tiny(FSDP)
    sched = build_schedule(rs)
    assert not [op for op in sched.ops if op.name.startswith("dp.bucket")]
    step = next(op for op in sched.ops if op.name == "opt.step").work
    assert isinstance(step, OptimizerStep) and step.params == -(-params_per_rank(rs) // 2)
    plain = build_schedule(tiny({**FSDP, "parallel.fsdp": False}))  # negative control: the distributed optimizer
    assert not fsdp_ops(plain) and [op for op in plain.ops if op.name.startswith("dp.bucket")]


def test_fp8_casts_the_gathered_weights_every_forward_unless_the_weights_are_fp8():
    fp8 = {**FSDP, "run.fp8": "tensorwise"}
    ops = by_name(build_schedule(tiny(fp8)))
    assert all(f"L{layer}.mb{mb}.fwd.{K.FP8_WEIGHT_CAST}" in ops for layer in range(2) for mb in range(2))
    assert f"{K.OPT_BLOCK}.{K.FP8_WEIGHT_CAST}" not in ops
    ops = by_name(build_schedule(tiny({**fp8, "run.fp8_param_gather": True})))
    assert f"L0.mb0.fwd.{K.FP8_WEIGHT_CAST}" not in ops and f"{K.OPT_BLOCK}.{K.FP8_WEIGHT_CAST}" in ops
    assert ops[f"L0.mb0.fwd.{K.FSDP_GATHER}"].work.nbytes < 2 * layer_dims(tiny(fp8)).layer_params  # 1 B weights


def test_memory_holds_a_shard_plus_two_whole_units():
    rs, plain = tiny(FSDP), tiny({**FSDP, "parallel.fsdp": False})
    params, d = params_per_rank(rs), layer_dims(rs)
    assert largest_unit_params(rs) == max(d.layer_params, d.vocab * d.hidden + d.norm_params)
    resident = params / 2 + 2 * largest_unit_params(rs)
    mem, base = memory_per_gpu(rs), memory_per_gpu(plain)
    assert mem.weights_gb == pytest.approx(resident * 2 / GB) and mem.grads_gb == pytest.approx(resident * 4 / GB)
    assert base.weights_gb == pytest.approx(params * 2 / GB) and mem.optimizer_gb == base.optimizer_gb


@pytest.mark.parametrize("overrides,field,words", [
    ({"parallel.distributed_optimizer": False}, "parallel.distributed_optimizer", "Megatron-FSDP"),
    ({"parallel.gpus": 2, "parallel.pp": 2, "parallel.global_batch": 4}, "parallel.fsdp", "pipeline"),
    ({"model.moe": {"experts": 2, "top_k": 1, "ffn_hidden": 512}, "parallel.ep": 2, "parallel.moe_ep_overlap": True},
     "parallel.fsdp", "moe_ep_overlap"),
])
def test_fsdp_rules(overrides, field, words):
    with pytest.raises(UserError) as err:
        tiny({**FSDP, **overrides})
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)


def test_a_sweep_over_fsdp_runs_both_and_says_what_fsdp_changed():
    """--fsdp both: every point twice; an FSDP point runs the distributed optimizer (Megatron-FSDP turns it
    on); the explanation's FSDP sentence carries the records' memory and speed. Negative control: at dp 1
    there is nothing to shard, so the twins are the same step."""
    from meshsim.sim.sweep.axes import configurations, sweep_axes
    from meshsim.sim.sweep.explain import explain
    from meshsim.sim.sweep.fsdp_explain import fsdp_sentence
    from meshsim.sim.sweep.runner import run_sweep

    scenario, source = load_scenario("tiny-2gpu")
    scenario = with_overrides(scenario, {"parallel.global_batch": 8}, source)
    points = configurations(sweep_axes(scenario, {"tp": "1,2", "sp": "off", "fsdp": "both"}))
    assert [(p.tp, p.fsdp) for p in points] == [(1, False), (1, True), (2, False), (2, True)]
    assert points[1].key.endswith(",fsdp=on") and "fsdp" not in points[0].key
    assert points[1].overrides()["parallel.distributed_optimizer"] is True
    records = {(r.point.tp, r.point.fsdp): r for r in run_sweep(scenario, source, points, progress=False)}
    on, off = records[(1, True)], records[(1, False)]
    assert on.ok and off.ok and on.result.memory_gb.total < off.result.memory_gb.total  # dp 2 shards
    text = fsdp_sentence(on, off)
    assert f"{on.result.memory_gb.total * 1e9 / 2**30:.2f}" in text and "DP communication" in text
    assert records[(2, True)].result.step_time_s == records[(2, False)].result.step_time_s  # dp 1
    assert text in explain([on, off])  # the sweet spot's FSDP twin is explained


def test_out_of_memory_advice_offers_fsdp_only_where_it_applies():
    from meshsim.sim.outputs.advice import memory_fixes

    def offers(**settings) -> bool:
        return any("parallel.fsdp" in fix for fix in memory_fixes({"tp": 1, "pp": 1, **settings}))

    assert offers(distributed_optimizer=True, fsdp=False)
    assert not offers(distributed_optimizer=True, fsdp=True)  # already sharded
    assert not offers(distributed_optimizer=True, fsdp=False, pp=2)  # not modelled with pipelining
    assert not offers(distributed_optimizer=False, fsdp=False)  # the distributed optimizer is offered first
    assert not offers(distributed_optimizer=True)  # unknown: not offered


def test_validate_times_fsdp_schedules_and_checks_numerics_without_it():
    """The timing shrink keeps fsdp (the executor runs the schedule's gathers and reduce-scatters); the
    numerics shrink drops it (its real model has none)."""
    from meshsim.validate.launch.shrink import NUMERICS, TIMING, shrink

    scenario, source = load_scenario("tiny-2gpu")
    scenario = with_overrides(scenario, {k: v for k, v in FSDP.items()}, source)
    timed, checked = shrink(scenario, 2, TIMING, source), shrink(scenario, 2, NUMERICS, source)
    assert timed.parallel.fsdp and timed.parallel.distributed_optimizer
    assert not checked.parallel.fsdp and not checked.parallel.distributed_optimizer
    sched = build_schedule(resolve(timed, source))
    assert fsdp_ops(sched)  # what the timing run executes


def test_tied_embeddings_the_head_gathers_the_shared_table_and_the_embedding_reduces_it():
    rs = tiny({**FSDP, "model.tied_embeddings": True})
    ops, d = by_name(build_schedule(rs)), layer_dims(rs)
    table = d.vocab * d.hidden
    gathered = ops[f"head.mb0.fwd.{K.FSDP_GATHER}"].work.nbytes
    reduced = ops[f"head.mb0.bwd.{K.FSDP_GRAD}"].work.nbytes if f"head.mb0.bwd.{K.FSDP_GRAD}" in ops else 0
    assert gathered == 2 * table + reduced // 2  # the table plus the head's own (final norm), in bf16
    assert ops[f"embed.mb0.bwd.{K.FSDP_GRAD}"].work.nbytes >= 4 * table  # the shared gradient, reduced once
    untied = by_name(build_schedule(tiny(FSDP)))  # negative control: the head's own output layer
    assert untied[f"head.mb0.fwd.{K.FSDP_GATHER}"].work.nbytes == untied[f"head.mb0.bwd.{K.FSDP_GRAD}"].work.nbytes // 2
