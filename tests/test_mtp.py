"""Multi-token prediction (model.mtp_layers; sim/schedule/mtp_ops.py): the ops it adds, its FLOPs, parameters
and memory in closed form, its placement with pipelining, and the layout / overlap checks."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.pipeline_split import expand_layout
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.flops import (
    layer_forward_flops_per_token,
    megatron_flops_per_token,
    model_flops_per_step,
)
from meshsim.sim.cost.memory import memory_per_gpu, stage_param_split
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import Collective
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.pipeline_layout import pipeline_layout

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu",
       "parallel.sp": True}


def tiny(overrides: dict, gpus: int = 2):
    """tiny-2gpu (tp 2 + SP unless overridden) with `overrides`."""
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": gpus, "parallel.global_batch": 2 * gpus, **copy.deepcopy(overrides)}
    return resolve(with_overrides(scenario, base, source), source)


def head_ops(schedule, mb: int = 0):
    return [op for op in schedule.ops if op.micro_batch == mb and op.name.startswith(f"{K.HEAD_BLOCK}.mb{mb}.")]


def keys(ops, prefix: str) -> list[str]:
    return [op.name.split(prefix, 1)[1] for op in ops if prefix in op.name]


def test_no_mtp_ops_without_mtp_layers():
    assert not any(".mtp" in op.name for op in build_schedule(tiny({})).ops)


def test_one_depth_runs_one_more_layer_its_projection_and_a_second_head():
    rs0, rs1 = tiny({"parallel.sp": True}), tiny({"parallel.sp": True, "model.mtp_layers": 1})
    s0, s1 = build_schedule(rs0), build_schedule(rs1)
    layer = [op.name.split("L0.mb0.", 1)[1] for op in s0.ops if op.name.startswith("L0.mb0.")]
    head = keys(head_ops(s0), "head.mb0.")
    mtp = keys(head_ops(s1), "head.mb0.mtp0.")
    embed = [op.name.split("embed.mb0.", 1)[1] for op in s0.ops if op.name.startswith("embed.mb0.")]
    proj_fwd = ["fwd.mtp_enorm", "fwd.mtp_hnorm", "fwd.mtp_concat", f"fwd.{K.MTP_EH_IN}", "fwd.eh_proj",
                f"fwd.{K.MTP_EH_OUT}"]
    proj_bwd = [f"bwd.{K.MTP_SP_SPLIT}", f"bwd.{K.MTP_EH_IN}{K.REGATHER}", "bwd.eh_proj_dgrad", "bwd.eh_proj_wgrad",
                f"bwd.{K.MTP_EH_IN}", "bwd.mtp_enorm", "bwd.mtp_hnorm"]
    fwd = lambda names: [n for n in names if n.startswith("fwd.")]  # noqa: E731
    bwd = lambda names: [n for n in names if n.startswith("bwd.")]  # noqa: E731
    assert sorted(mtp) == sorted(fwd(embed) + proj_fwd + fwd(layer) + fwd(head)
                                 + bwd(head) + bwd(layer) + proj_bwd + bwd(embed))
    assert keys(head_ops(s1), "head.mb0.").count("fwd.mtp_loss_add") == 1
    # the main head's own ops are unchanged
    assert [n for n in keys(head_ops(s1), "head.mb0.") if not n.startswith("mtp0.")] == \
        head[:len(fwd(head))] + ["fwd.mtp_loss_add"] + head[len(fwd(head)):] + ["bwd.mtp_grad_add"]


def test_eh_proj_collectives_move_the_concatenated_input():
    rs = tiny({"parallel.sp": True, "model.mtp_layers": 1})
    m, tokens = rs.scenario.model, rs.scenario.model.seq_len * rs.scenario.parallel.micro_batch
    act = tokens * m.hidden * 2
    by_name = {op.name: op.work for op in head_ops(build_schedule(rs))}
    assert by_name[f"head.mb0.mtp0.fwd.{K.MTP_EH_IN}"] == Collective("all_gather", "tp", 2 * act, K.MTP_EH_IN)
    assert by_name[f"head.mb0.mtp0.bwd.{K.MTP_EH_IN}"] == Collective("reduce_scatter", "tp", 2 * act, K.MTP_EH_IN)
    assert by_name[f"head.mb0.mtp0.fwd.{K.MTP_EH_OUT}"] == Collective("all_gather", "tp", act, K.MTP_EH_OUT)
    gemm = by_name["head.mb0.mtp0.fwd.eh_proj"]
    assert (gemm.m, gemm.n, gemm.k) == (tokens, m.hidden // rs.tp, 2 * m.hidden)


def test_without_sp_the_entry_is_f_and_its_backward_all_reduces():
    rs = tiny({"parallel.sp": False, "model.mtp_layers": 1})
    names = {op.name: op.work for op in head_ops(build_schedule(rs))}
    assert f"head.mb0.mtp0.fwd.{K.MTP_EH_IN}" not in names  # f: identity forward
    assert names[f"head.mb0.mtp0.bwd.{K.MTP_EH_IN}"].op == "all_reduce"
    assert f"head.mb0.mtp0.bwd.{K.MTP_SP_SPLIT}" not in names


def test_two_depths_chain_their_hidden_states():
    ops = head_ops(build_schedule(tiny({"model.mtp_layers": 2})))
    by_name = {op.name: op for op in ops}
    depth1_hnorm = by_name["head.mb0.mtp1.fwd.mtp_hnorm"]
    depth0_out = max(op.id for op in ops if op.name.startswith("head.mb0.mtp0.fwd.") and "xent" not in op.name
                     and "logits" not in op.name and "final_ln" not in op.name and "head_in" not in op.name)
    assert depth1_hnorm.deps == (depth0_out,)
    assert "head.mb0.mtp0.bwd.mtp_grad_add" in by_name  # depth 1's gradient joins depth 0's head gradient


def test_model_flops_add_a_layer_a_projection_and_a_logits_gemm():
    rs0, rs1 = tiny({}), tiny({"model.mtp_layers": 1})
    m = rs0.scenario.model
    tokens = rs0.scenario.parallel.global_batch * m.seq_len
    extra = 3.0 * tokens * (layer_forward_flops_per_token(m) + 2.0 * m.hidden * m.vocab + 4.0 * m.hidden ** 2)
    assert model_flops_per_step(rs1) - model_flops_per_step(rs0) == pytest.approx(extra, rel=1e-12)


def test_megatron_count_adds_the_last_layers_kind():
    """Megatron's num_floating_point_operations: mtp layers of the last layer's kind, eh_proj + 3 norms, logits."""
    rs0, rs1 = tiny({**MOE, "model.moe.dense_layers": 1}), tiny({**MOE, "model.moe.dense_layers": 1,
                                                                  "model.mtp_layers": 1})
    m = rs0.scenario.model
    h, vocab = m.hidden, build_schedule(rs0).meta["padded_vocab"]
    q, kv = m.kv_channels * m.heads, m.kv_channels * m.num_kv_heads
    moe_layer = h * m.moe.ffn_hidden * m.moe.top_k * 3 + h * (q + 2 * kv) + q * h + m.seq_len * q
    extra = 6.0 * (moe_layer + 3 * h + 2 * h * h + h * vocab)
    assert megatron_flops_per_token(rs1) - megatron_flops_per_token(rs0) == pytest.approx(extra, rel=1e-12)


def test_parameters_add_the_layer_and_projection_and_pipelined_stages_hold_an_embedding_copy():
    rs0, rs1 = tiny({"parallel.sp": True}), tiny({"parallel.sp": True, "model.mtp_layers": 1})
    d_h, tp = rs0.scenario.model.hidden, rs0.tp
    layer_params = (stage_param_split(tiny({"parallel.sp": True, "model.layers": 3}), 0)[0]
                    - stage_param_split(tiny({"parallel.sp": True, "model.layers": 2}), 0)[0])
    norm = 2 * d_h  # LayerNorm: weight and bias
    mtp = layer_params + 2 * d_h * (d_h // tp) + 3 * norm
    assert stage_param_split(rs1, 0)[0] - stage_param_split(rs0, 0)[0] == mtp
    assert build_schedule(rs1).meta["params_per_rank"] - build_schedule(rs0).meta["params_per_rank"] == mtp
    pp0, pp1 = (tiny({"parallel.pp": 2, "parallel.sp": True, **extra}, gpus=4)
                for extra in ({}, {"model.mtp_layers": 1}))
    table = build_schedule(rs0).meta["padded_vocab"] // tp * d_h
    assert stage_param_split(pp1, 0) == stage_param_split(pp0, 0)
    assert stage_param_split(pp1, 1)[0] - stage_param_split(pp0, 1)[0] == mtp + table


def test_pipelined_mtp_runs_on_the_last_stage_and_all_reduces_its_embedding_copy():
    rs = tiny({"parallel.pp": 2, "parallel.sp": True, "model.mtp_layers": 1}, gpus=4)
    first, last = build_stage_schedules(rs)
    assert not any(".mtp0." in op.name for op in first.ops)
    assert any(".mtp0." in op.name for op in last.ops)
    embed_grad = [op for s in (first, last) for op in s.ops if op.name.endswith(K.EMBED_GRAD)]
    assert len(embed_grad) == 2  # one on each end stage, over the embedding group
    plain = tiny({"parallel.pp": 2, "parallel.sp": True}, gpus=4)
    assert not any(op.name.endswith(K.EMBED_GRAD) for s in build_stage_schedules(plain) for op in s.ops)
    assert last.meta["params_per_rank"] == sum(stage_param_split(rs, 1))


def test_memory_grows_by_the_depths_activations():
    m0, m1 = memory_per_gpu(tiny({})), memory_per_gpu(tiny({"model.mtp_layers": 1}))
    assert m1.activations_gb > m0.activations_gb and m1.weights_gb > m0.weights_gb


def test_mtp_moe_layer_records_its_expert_gradients():
    rs0, rs1 = tiny({**MOE, "parallel.ep": 2}), tiny({**MOE, "parallel.ep": 2, "model.mtp_layers": 1})
    e0, e1 = build_schedule(rs0).meta["expert_params_per_rank"], build_schedule(rs1).meta["expert_params_per_rank"]
    assert e1 - e0 == e0 // rs0.scenario.model.layers  # one more MoE layer's local experts
    assert stage_param_split(rs1, 0)[1] == e1


@pytest.mark.parametrize("overrides,words", [
    ({"parallel.pipeline_layout": "Et|tmL"}, "model.mtp_layers = 0"),
    ({"parallel.pipeline_layout": "Et|tL", "model.mtp_layers": 1}, "'m' layers (0)"),
    ({"parallel.pipeline_layout": "Etm|tL", "model.mtp_layers": 1}, "last segment"),
])
def test_layout_m_must_match_mtp_layers_in_the_last_segment(overrides, words):
    with pytest.raises(UserError) as err:
        tiny({"parallel.pp": 2, **overrides}, gpus=4)
    assert err.value.field == "parallel.pipeline_layout" and words in str(err.value)
    tiny({"parallel.pp": 2, "parallel.pipeline_layout": "Et|tmL", "model.mtp_layers": 1}, gpus=4)  # accepted


def test_ep_overlap_allows_at_most_one_depth():
    base = {**MOE, "parallel.ep": 2, "parallel.moe_ep_overlap": True}
    tiny({**base, "model.mtp_layers": 1})
    with pytest.raises(UserError) as err:
        tiny({**base, "model.mtp_layers": 2})
    assert err.value.field == "parallel.moe_ep_overlap" and "model.mtp_layers: 1" in str(err.value)


@pytest.mark.parametrize("layout,segments", [
    # Megatron's own examples (pipeline_parallel_layer_layout.py parse_str_to_list @d98e8a64)
    ("Ettt|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),
    ("tt(tt|tt|tt)*2,tt", ["tttt", "tt", "tttt", "tt", "tttt"]),  # its "xy(ab|cd|ef)*2,pq", in layer symbols
    # DeepSeek-V3's GB300 recipe (reference section 1.4): x*n inside and outside a repetition
    ("Et*4|(t*4|)*14tmL", ["Etttt"] + ["tttt"] * 14 + ["tmL"]),
])
def test_layouts_expand_as_megatron_parses_them(layout, segments):
    assert expand_layout(layout) == segments


def test_deepseek_gb300_layout_is_accepted_with_one_mtp_depth():
    rs = tiny({"model.layers": 61, "parallel.pp": 2, "parallel.vp": 8, "parallel.global_batch": 16,
               "parallel.micro_batch": 1, "parallel.pipeline_layout": "Et*4|(t*4|)*14tmL", "model.mtp_layers": 1,
               "parallel.p2p_overlap": False},
              gpus=4)
    assert [len(ch.layers) for stage in pipeline_layout(rs.scenario.parallel, 61) for ch in stage] == \
        [4, 4] * 7 + [4, 1]  # stage 0: virtual stages 0, 2, ..., 14; stage 1: 1, 3, ..., 15 (the loss's, with MTP)


def test_the_report_and_results_echo_the_depths():
    from meshsim.sim.outputs.step_report import config_line
    from meshsim.sim.results.step_result import config_echo

    on, off = config_echo(tiny({"model.mtp_layers": 1})), config_echo(tiny({}))
    assert on.to_json()["mtp_layers"] == 1 and "mtp_layers" not in off.to_json()
    assert " mtp=1," in config_line(on) and "mtp" not in config_line(off)


def test_fp8_weight_cast_covers_the_depth_layer_on_its_stage():
    def cast(rs, stage: int | None = None):
        ops = build_schedule(rs).ops if stage is None else build_stage_schedules(rs)[stage].ops
        return next(op.work.bytes_read for op in ops if op.name == f"opt.{K.FP8_WEIGHT_CAST}")

    fp8 = {"run.fp8": "tensorwise", "parallel.sp": True}
    one, two = cast(tiny({**fp8, "model.layers": 1})), cast(tiny({**fp8, "model.layers": 2}))
    assert cast(tiny({**fp8, "model.mtp_layers": 1})) - cast(tiny(fp8)) == two - one  # one more layer's linears
    pp = {**fp8, "parallel.pp": 2}
    assert cast(tiny({**pp, "model.mtp_layers": 1}, gpus=4), 0) == cast(tiny(pp, gpus=4), 0)
    assert cast(tiny({**pp, "model.mtp_layers": 1}, gpus=4), 1) - cast(tiny(pp, gpus=4), 1) == two - one


@pytest.mark.parametrize("extra", [
    {"parallel.gpus": 8, "parallel.ep": 4, "parallel.global_batch": 64},
    {"parallel.gpus": 8, "parallel.ep": 2, "parallel.pp": 2, "parallel.vp": 2, "model.layers": 4,
     "parallel.p2p_overlap": False, "parallel.global_batch": 64, "parallel.micro_batch": 1},
])
def test_an_mtp_moe_depth_under_ep_overlap_extrapolates_to_the_full_step(extra):
    """The combined 1F1B schedules run the depth inside the head block; the proven extrapolation still holds."""
    from meshsim.sim.results.simulate import simulate

    rs = tiny({**MOE, **extra, "parallel.moe_ep_overlap": True, "model.mtp_layers": 1}, gpus=8)
    short, full = simulate(rs), simulate(rs, full=True)
    assert short.steady_state.path == "extrapolated"
    assert short.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    last = build_schedule(rs) if rs.pp == 1 else build_stage_schedules(rs)[-1]
    assert any(".mtp0." in op.name and op.name.endswith(f".{K.MOE_DISPATCH}") for op in last.ops)  # its MoE layer


def test_eh_proj_runs_fp8_as_a_te_column_linear():
    from meshsim.sim.schedule.fp8_rules import fp8_tensor_bytes

    def ops(overrides):
        rs = tiny({"parallel.sp": True, "model.mtp_layers": 1, "topology.preset": "dgx-b200", **overrides})
        return {op.name.split("head.mb0.mtp0.", 1)[1]: op.work for op in head_ops(build_schedule(rs))
                if ".mtp0." in op.name}

    on, no_wgrad, off = ops({"run.fp8": "mxfp8"}), ops({"run.fp8": "mxfp8", "run.fp8_wgrad": False}), ops({})
    assert on["fwd.eh_proj"].fp8 and on["bwd.eh_proj_dgrad"].fp8 and on["bwd.eh_proj_wgrad"].fp8
    assert f"fwd.eh_proj_{K.FP8_QUANT}" in on and f"bwd.eh_proj_{K.FP8_QUANT}" in on
    assert not no_wgrad["bwd.eh_proj_wgrad"].fp8 and no_wgrad["bwd.eh_proj_dgrad"].fp8
    assert not off["fwd.eh_proj"].fp8 and not any(K.FP8_QUANT in key for key in off)
    rs = tiny({})
    elements = 2 * rs.scenario.model.seq_len * rs.scenario.parallel.micro_batch * rs.scenario.model.hidden
    assert on[f"fwd.{K.MTP_EH_IN}"].nbytes == fp8_tensor_bytes(elements, "mxfp8")
    assert off[f"fwd.{K.MTP_EH_IN}"].nbytes == 2 * elements
