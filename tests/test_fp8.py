"""FP8 (run.fp8): closed-form GEMM times, quantize bytes, wire bytes, memory, the delayed amax reduction,
the sweep axis, and one check test per FP8 error."""

from __future__ import annotations

import dataclasses

import pytest

from meshsim.scenarios.fp8_checks import check_fp8
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.units import GB
from meshsim.sim.cost.attention_rate import width_factor
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.fp8_memory import fp8_activation_savings
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.fp8_rules import Fp8Plan, amax_reduce_bytes, quantize_works
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.sim.sweep.axes import SweepPoint, parse_fp8
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Topology

H100 = GPUS["h100-sxm"]
L, H, A, S, B = 2, 256, 8, 128, 2
MODEL = dict(layers=L, hidden=H, heads=A, kv_heads=4, ffn_hidden=512, seq_len=S, vocab=1000, mlp="swiglu",
             dropout=False, attention="flash")


def make_rs(parallel: dict, run: dict, *, dp: int = 1, model: dict | None = None, gpu: str = "h100-sxm"
            ) -> ResolvedScenario:
    par = {"micro_batch": B, "global_batch": B * dp, **parallel}
    s = Scenario.model_validate({"name": "t", "model": model or MODEL, "topology": {"preset": "dgx-h100"},
                                 "parallel": par, "run": run})
    tp = s.parallel.tp
    topo = Topology("trivial", gpu, 1, tp * dp, (), ())
    return ResolvedScenario(s, "test", GPUS[gpu], topo, tp * dp, tp, dp, 1)


# ----- GEMM time ----------------------------------------------------------------------------------------
def test_large_fp8_gemm_runs_at_the_fp8_ceiling_of_the_fp8_peak():
    """8192^3 is the shape model's reference: efficiency = the H100 FP8 ceiling 0.62 exactly, at 1,979 TFLOP/s."""
    cm = ComputeModel(H100)
    g = Gemm(8192, 8192, 8192, fp8=True)
    assert cm.gemm_efficiency(g) == pytest.approx(0.62, rel=1e-12)
    assert cm.gemm_s(g) == pytest.approx(2 * 8192**3 / (1979e12 * 0.62) + 3e-6, rel=1e-12)
    bf16 = cm.gemm_s(Gemm(8192, 8192, 8192))
    assert bf16 / cm.gemm_s(g) == pytest.approx((2 * 8192**3 / (989e12 * 0.68) + 3e-6) /
                                                (2 * 8192**3 / (1979e12 * 0.62) + 3e-6), rel=1e-12)


def test_skinny_fp8_gemm_reaches_less_of_its_peak_than_bf16():
    """k = 256: the epilogue costs k_fill = peak / bw k-steps, about twice as many at the FP8 peak, so relative
    to its own ceiling (the 8192^3 reference) the FP8 GEMM keeps less: k / (k + k_fill8) vs k / (k + k_fill)."""
    cm = ComputeModel(H100)
    fp8 = cm.gemm_efficiency(Gemm(8192, 8192, 256, fp8=True)) / 0.62
    bf16 = cm.gemm_efficiency(Gemm(8192, 8192, 256)) / 0.68
    k_fill, k_fill8 = 989e3 / 3350.0, 1979e3 / 3350.0
    assert bf16 == pytest.approx(256 / (256 + k_fill) / (8192 / (8192 + k_fill)), rel=1e-9)
    assert fp8 == pytest.approx(256 / (256 + k_fill8) / (8192 / (8192 + k_fill8)), rel=1e-9)
    assert fp8 < bf16


def test_fp8_attention_uses_the_fp8_peak():
    d = layer_dims(make_rs({}, {"fp8": "delayed", "fp8_attention": True}))
    cm = ComputeModel(H100)
    att = d.attention(backward=False)
    assert att.fp8
    # the FP8 peak, and at a head width other than 128 the width factor of FP8's faster MMA (attention_rate.py)
    width = 4 * att.head_dim
    widths = width_factor(H100, width, fp8=True) / width_factor(H100, width)
    assert (cm.attention_s(dataclasses.replace(att, fp8=False)) - 3e-6) / (cm.attention_s(att) - 3e-6) == \
        pytest.approx(1979 / 989 * widths, rel=1e-12)


# ----- quantize kernels -----------------------------------------------------------------------------------
def test_quantize_bytes_per_recipe():
    n = 4096
    (q,) = quantize_works(n, 2, Fp8Plan("delayed"))
    assert (q.kernel, q.bytes_read, q.bytes_written) == ("fp8_cast_transpose", 2 * n, 2 * n)
    amax, q = quantize_works(n, 1, Fp8Plan("tensorwise"))
    assert (amax.kernel, amax.bytes_read, q.bytes_read, q.bytes_written) == ("fp8_amax", 2 * n, 2 * n, n)
    (q,) = quantize_works(n, 2, Fp8Plan("mxfp8"))
    assert q.bytes_written == 2 * (n + n // 32)
    (q,) = quantize_works(n, 1, Fp8Plan("blockwise"))
    assert q.bytes_written == n + n // 128 * 4


def _ops(rs):
    return build_schedule(rs).ops


def test_off_adds_no_op_and_delayed_adds_quantize_ops_per_linear():
    off = _ops(make_rs({}, {}))
    on = _ops(make_rs({}, {"fp8": "delayed"}))
    assert not any("fp8" in op.name for op in off)
    fwd_quant = [op for op in on if op.name.startswith("L0.mb0.fwd.") and op.name.endswith(K.FP8_QUANT)]
    bwd_quant = [op for op in on if op.name.startswith("L0.mb0.bwd.") and op.name.endswith(K.FP8_QUANT)]
    assert [op.name for op in fwd_quant] == [f"L0.mb0.fwd.{g}_fp8_quant" for g in ("qkv", "proj", "fc1", "fc2")]
    assert len(bwd_quant) == 4
    gemms = [op.work for op in on if op.name.startswith("L0.mb0.") and isinstance(op.work, Gemm)]
    assert len(gemms) == 12 and all(g.fp8 for g in gemms)  # 4 linears x (fwd, dgrad, wgrad)
    head = [op.work for op in on if op.name.startswith("head.") and isinstance(op.work, Gemm)]
    assert head and not any(g.fp8 for g in head)  # the LM head stays 16-bit


def test_fp8_wgrad_false_keeps_wgrad_16_bit():
    ops = _ops(make_rs({}, {"fp8": "delayed", "fp8_wgrad": False}))
    wgrads = [op.work for op in ops if op.name.startswith("L0.mb0.bwd.") and op.name.endswith("_wgrad")]
    assert len(wgrads) == 4 and not any(g.fp8 for g in wgrads)


# ----- wire bytes ---------------------------------------------------------------------------------------
def test_sp_all_gathers_move_fp8_and_reduce_scatters_stay_16_bit():
    rs = make_rs({"tp": 2, "sp": True}, {"fp8": "delayed"})
    ops = _ops(rs)
    tokens_h = S * B * H
    gathers = {op.name: op.work.nbytes for op in ops if op.name.startswith("L0.mb0.")
               and isinstance(op.work, Collective) and op.work.op == "all_gather"}
    assert gathers["L0.mb0.fwd.attn_in"] == tokens_h  # 1 byte per value (per-tensor scale)
    assert gathers["L0.mb0.bwd.attn_out"] == tokens_h  # row-parallel dY gather
    assert gathers["L0.mb0.bwd.attn_in_regather"] == tokens_h
    rs_ops = [op.work for op in ops if op.name.startswith("L0.mb0.") and isinstance(op.work, Collective)
              and op.work.op == "reduce_scatter"]
    assert rs_ops and all(w.nbytes == 2 * tokens_h for w in rs_ops)
    transposes = [op for op in ops if op.name.startswith("L0.mb0.bwd.") and op.name.endswith(K.FP8_TRANSPOSE)]
    assert len(transposes) == 4  # per-tensor recipes: each gathered rowwise tensor transposed for wgrad


def test_tensorwise_reduces_the_amax_of_sequence_sharded_tensors_over_tp():
    ops = _ops(make_rs({"tp": 2, "sp": True}, {"fp8": "tensorwise"}))
    amax = [op for op in ops if op.name.startswith("L0.mb0.") and op.name.endswith(K.FP8_AMAX + K.ALL_REDUCE)]
    # the column-parallel inputs (qkv, fc1) forward, the row-parallel dY (proj, fc2) backward
    assert sorted(op.name for op in amax) == ["L0.mb0.bwd.fc2_fp8_amax_ar", "L0.mb0.bwd.proj_fp8_amax_ar",
                                              "L0.mb0.fwd.fc1_fp8_amax_ar", "L0.mb0.fwd.qkv_fp8_amax_ar"]
    assert all(op.work.group == "tp" and op.work.nbytes == 4 for op in amax)


def test_delayed_amax_all_reduce_once_per_pass_over_the_stage():
    ops = _ops(make_rs({"tp": 2, "sp": True}, {"fp8": "delayed"}, dp=2))
    reds = [op for op in ops if op.name.endswith(K.FP8_AMAX_REDUCE)]
    assert [op.name for op in reds] == ["fp8.mb0.fwd.fp8_amax_reduce", "fp8.mb0.bwd.fp8_amax_reduce"]
    assert [op.work.nbytes for op in reds] == [L * 4 * 3 * 4, L * 4 * 2 * 4] == \
        [amax_reduce_bytes(4 * L, False), amax_reduce_bytes(4 * L, True)]  # 4 FP8 GEMMs per dense layer
    assert all(op.work.group == "stage" for op in reds)
    tp_only = _ops(make_rs({"tp": 2, "sp": True}, {"fp8": "delayed", "tp_only_amax_reduction": True}, dp=2))
    assert {op.work.group for op in tp_only if op.name.endswith(K.FP8_AMAX_REDUCE)} == {"tp"}


def test_fp8_param_gather_moves_one_byte_per_linear_weight():
    par = {"distributed_optimizer": True, "dp_overlap": False}
    rs16 = make_rs(par, {"fp8": "delayed"}, dp=2)
    rs8 = make_rs(par, {"fp8": "delayed", "fp8_param_gather": True}, dp=2)

    def gathered(rs):
        return sum(op.work.nbytes for op in _ops(rs) if isinstance(op.work, Collective)
                   and op.work.boundary == K.DP_PARAM)
    params = build_schedule(rs16).meta["params_per_rank"]
    linear = L * layer_dims(rs16).linear_weights
    assert gathered(rs16) == 2 * params
    assert gathered(rs8) == pytest.approx(2 * params - linear, abs=len(_ops(rs8)))  # rounding per bucket
    cast = [op.work for op in _ops(rs8) if op.name == f"opt.{K.FP8_WEIGHT_CAST}"]
    assert cast == [Elementwise("fp8_weight_cast", 4 * (linear // 2) + linear, linear // 2 + linear)]


# ----- memory -------------------------------------------------------------------------------------------
def test_memory_fp8_weight_copies_and_saved_activations():
    off, on = make_rs({}, {}), make_rs({}, {"fp8": "delayed"})
    gather = make_rs({"distributed_optimizer": True}, {"fp8": "delayed", "fp8_param_gather": True})
    base = make_rs({"distributed_optimizer": True}, {})
    d = layer_dims(on)
    linear = L * d.linear_weights
    m_off, m_on = memory_per_gpu(off), memory_per_gpu(on)
    assert m_on.weights_gb - m_off.weights_gb == pytest.approx(2 * linear / GB, rel=1e-12)
    assert memory_per_gpu(gather).weights_gb == pytest.approx(memory_per_gpu(base).weights_gb, rel=1e-12)
    # linear inputs at 1 byte: qkv and fc1 inputs (2 x tokens x h) and proj / fc2 inputs (tokens x (a d + f))
    saved = S * B * (2 * H + A * (H // A) + 512)
    assert fp8_activation_savings(d) == saved
    assert (m_off.activations_gb - m_on.activations_gb) == pytest.approx(L * saved / GB, rel=1e-9)


# ----- sweep ----------------------------------------------------------------------------------------------
def test_sweep_axis_sets_run_fp8():
    assert parse_fp8("off,delayed,off") == ("off", "delayed")
    with pytest.raises(UserError):
        parse_fp8("fp4")
    p = SweepPoint(2, True, 1, False, "none", fp8="delayed")
    assert p.overrides()["run.fp8"] == "delayed" and p.key.endswith(",fp8=delayed")
    assert "fp8" not in SweepPoint(2, True, 1, False, "none").key


# ----- checks: one per error ------------------------------------------------------------------------------
def _library(overrides: dict):
    s, src = load_scenario("llama3-8b-h100-fp8")
    return resolve(with_overrides(s, overrides, src), src)


@pytest.mark.parametrize("overrides, field", [
    ({"topology.preset": "dgx-a100", "parallel.tp": 2}, "run.fp8"),  # A100: no FP8 tensor cores
    ({"run.fp8": "mxfp8"}, "run.fp8"),  # MXFP8 needs Blackwell
    ({"run.fp8": "off", "run.fp8_attention": True}, "run.fp8_attention"),
    ({"run.fp8_amax_history_len": 1024}, "run.fp8_amax_history_len"),  # tensorwise: no history
    ({"run.tp_only_amax_reduction": True}, "run.tp_only_amax_reduction"),
    ({"run.fp8_param_gather": True, "parallel.distributed_optimizer": False}, "run.fp8_param_gather"),
    ({"run.fp8_attention": True, "model.attention": "unfused", "parallel.cp": 1}, "run.fp8_attention"),  # cp 1: CP refuses unfused first
])
def test_check_errors_name_the_field(overrides, field):
    with pytest.raises(UserError) as err:
        _library(overrides)
    assert err.value.field == field


def test_blockwise_needs_hopper_and_fp8_needs_fp8_tensor_cores():
    s, src = load_scenario("llama3-8b-h100-fp8")
    ada = dataclasses.replace(H100, name="ada", compute_capability=(8, 9))
    with pytest.raises(UserError) as err:
        check_fp8(with_overrides(s, {"run.fp8": "blockwise"}, src), ada, src)
    assert err.value.field == "run.fp8" and "9.0" in err.value.problem
    check_fp8(with_overrides(s, {"run.fp8": "blockwise"}, src), H100, src)  # Hopper: fine
    with pytest.raises(UserError):
        check_fp8(s, GPUS["v100-sxm2"], src)


def test_delayed_fp8_allowed_for_moe_models_refused_with_the_combined_schedule():
    """TE runs GroupedLinear under DelayedScaling (grouped_linear.py L107-108): allowed; the combined 1F1B
    schedule's amax reduction is not modeled: refused, naming the field."""
    moe = dict(MODEL, moe={"experts": 4, "top_k": 2, "ffn_hidden": 256})
    s = Scenario.model_validate({"name": "t", "model": moe, "topology": {"preset": "dgx-h100"},
                                 "parallel": {"global_batch": 8}, "run": {"fp8": "delayed"}})
    check_fp8(s, H100, "test")
    overlap = s.model_copy(update={"parallel": s.parallel.model_copy(update={"moe_ep_overlap": True})})
    with pytest.raises(UserError) as err:
        check_fp8(overlap, H100, "test")
    assert err.value.field == "run.fp8" and "combined_1f1b.py" in err.value.problem


def test_pipeline_stages_reduce_amaxes_per_chunk_pass_and_cast_their_weights():
    from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

    s, src = load_scenario("llama2-70b-h100-pp4")
    rs = resolve(with_overrides(s, {"run.fp8": "delayed"}, src), src)
    for st in build_stage_schedules(rs):
        reds = [op for op in st.ops if op.name.endswith(K.FP8_AMAX_REDUCE)]
        assert len(reds) == 2 * rs.vp * rs.micro_batches  # forward and backward of every chunk pass
        layers = len(st.meta["layers"][0])
        assert {op.work.nbytes for op in reds} == {amax_reduce_bytes(4 * layers, False),
                                                   amax_reduce_bytes(4 * layers, True)}
        assert sum(op.name == f"opt.{K.FP8_WEIGHT_CAST}" for op in st.ops) == 1


def test_mxfp8_gathers_scales_and_both_copies_of_dy():
    rs = make_rs({"tp": 2, "sp": True}, {"fp8": "mxfp8"}, gpu="b200")
    gathers = {op.name: op.work.nbytes for op in _ops(rs) if op.name.startswith("L0.mb0.")
               and isinstance(op.work, Collective) and op.work.op == "all_gather"}
    n = S * B * H
    assert gathers["L0.mb0.fwd.attn_in"] == n + n // 32  # 1 byte per value + 1 E8M0 byte per 32
    assert gathers["L0.mb0.bwd.attn_out"] == 2 * (n + n // 32)  # dY: rowwise (dgrad) and columnwise (wgrad)
    assert not any(op.name.endswith(K.FP8_TRANSPOSE) for op in _ops(rs))


def test_blackwell_per_tensor_fp8_writes_no_transpose_and_hopper_does():
    """TE's per-tensor quantizers skip the columnwise copy where FP8 GEMMs run in any layout (sm 10.x);
    blockwise / MXFP8 keep both copies there, and Hopper keeps the cast-transpose."""
    n = S * B * H

    def fc1_dy_cast(gpu: str, fp8: str):
        ops = _ops(make_rs({}, {"fp8": fp8}, gpu=gpu))
        return [op.work for op in ops if op.name.startswith("L0.mb0.bwd.fc2_fp8_quant")][0]

    hopper, blackwell = fc1_dy_cast("h100-sxm", "delayed"), fc1_dy_cast("b200", "delayed")
    assert (hopper.kernel, hopper.bytes_written) == ("fp8_cast_transpose", 2 * n)
    assert (blackwell.kernel, blackwell.bytes_written) == ("fp8_quantize", n)
    assert fc1_dy_cast("b200", "mxfp8").bytes_written == 2 * (n + n // 32)  # negative control: block scales
    sp = _ops(make_rs({"tp": 2, "sp": True}, {"fp8": "tensorwise"}, gpu="b200"))
    assert not any(op.name.endswith(K.FP8_TRANSPOSE) for op in sp)  # no transpose after the gather either
    cast = [op.work for op in sp if op.name.endswith(K.FP8_WEIGHT_CAST)][0]
    assert cast.bytes_written * 2 == cast.bytes_read  # one 1-byte copy per 2-byte weight
    from meshsim.sim.cost.fp8_memory import weight_copy_bytes

    plans = {(gpu, fp8): layer_dims(make_rs({}, {"fp8": fp8}, gpu=gpu))
             for gpu, fp8 in (("h100-sxm", "tensorwise"), ("b200", "tensorwise"), ("b200", "mxfp8"))}
    assert [weight_copy_bytes(d) for d in plans.values()] == [2, 1, 2 * (1 + 1 / 32)]  # the cached copies too


def test_non_tn_fp8_gemm_follows_transformer_engine():
    from meshsim.sim.schedule.fp8_rules import non_tn_fp8_gemm

    assert [non_tn_fp8_gemm(cc) for cc in ((9, 0), (10, 0), (11, 0), (12, 0), (13, 0))] == [
        False, True, True, False, True]


def _rec(tp: int, fp8: str, *, tokens: float, compute_s: float, tp_share: float):
    from dataclasses import asdict

    from meshsim.sim.sweep.record import SweepRecord

    point = SweepPoint(tp, True, 1, False, "none", fp8=fp8)
    result = {"scenario": "hand-made", "layer_fwd_ms": 1.0, "layer_bwd_ms": 2.0, "tp": tp, "sp": True,
              "dp": 64 // tp, "gpus_per_node": 8, "crosses_nodes": False, "tokens_per_s": tokens, "mfu": 0.4,
              "tflops_per_gpu": 400.0, "step_time_s": 1.0, "fp8": fp8,
              "memory_gb": {"weights": 1.0, "grads": 1.0, "optimizer": 1.0, "activations": 1.0, "total": 10.0,
                            "capacity": 80.0, "fits": True},
              "breakdown_s": {"compute_busy": compute_s, "tp_comm_busy": 0.2, "dp_comm_busy": 0.05,
                              "exposed_comm": 0.1, "nothing_running": 0.0, "compute_waiting": 1.0 - compute_s},
              "critical_path_share": {"compute": 1 - tp_share, "tp_comm": tp_share, "dp_comm": 0.0, "waiting": 0.0},
              "collectives": []}
    return SweepRecord.from_json({"key": point.key, "config": asdict(point), "scenario_digest": "",
                                  "status": "ok", "result": result})


def test_fp8_sentence_says_what_fp8_changed_and_that_the_sweet_spot_moved():
    from meshsim.sim.sweep import explain as ex

    records = [_rec(4, "off", tokens=90.0, compute_s=0.8, tp_share=0.2),
               _rec(4, "delayed", tokens=120.0, compute_s=0.5, tp_share=0.38),
               _rec(8, "off", tokens=100.0, compute_s=0.6, tp_share=0.3),
               _rec(8, "delayed", tokens=110.0, compute_s=0.4, tp_share=0.5)]
    text = " ".join(ex.explain(records))
    assert "FP8 (delayed) shortens compute 1.60x against 16 bit (800 ms -> 500 ms busy per step)" in text
    assert "TP communication is now 38% of the critical path (vs 20% in 16 bit)" in text
    assert "so with FP8 tp=4 beats tp=8, the fastest in 16 bit." in text
    two = [_rec(4, "mxfp8", tokens=100.0, compute_s=0.6, tp_share=0.2),
           _rec(4, "nvfp4", tokens=120.0, compute_s=0.4, tp_share=0.3)]  # two recipes, no 16-bit twin
    assert "NVFP4 shortens compute 1.50x against FP8 (mxfp8)" in " ".join(ex.explain(two))
