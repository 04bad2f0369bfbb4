"""The model-family rules, run settings and host dispatch added for accuracy (issue 13): closed forms on
tiny schedules, each with a negative control."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import ModelConfig, Scenario
from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import events as engine
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.model_family import has_linear_bias, norm_kind, norm_params
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm, Op, Schedule
from meshsim.sim.schedule.shapes import padded_vocab
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Topology

GPT = dict(layers=2, hidden=256, heads=8, seq_len=128, vocab=1000, mlp="gelu", dropout=True)


def make_rs(model: dict, parallel: dict, run: dict | None = None, *, dp: int = 1) -> ResolvedScenario:
    par = {"global_batch": dp, **parallel}
    s = Scenario.model_validate({"name": "t", "model": model, "topology": {"preset": "dgx-h100"},
                                 "parallel": par, "run": run or {}})
    tp = s.parallel.tp
    return ResolvedScenario(s, "test", GPUS["h100-sxm"], Topology("trivial", "h100-sxm", 1, tp * dp, (), ()),
                            tp * dp, tp, dp, 1)


def test_model_family_defaults_and_explicit_fields():
    m = ModelConfig(layers=1, hidden=64, heads=4, seq_len=8, vocab=10, mlp="swiglu")
    assert (norm_kind(m), has_linear_bias(m), norm_params(m)) == ("rmsnorm", False, 64)
    g = m.model_copy(update={"mlp": "relu2"})
    assert (norm_kind(g), has_linear_bias(g), norm_params(g), g.ffn) == ("layernorm", True, 128, 256)
    e = g.model_copy(update={"norm": "rmsnorm", "bias": False})
    assert (norm_kind(e), has_linear_bias(e), norm_params(e)) == ("rmsnorm", False, 64)


def test_padded_vocab_follows_divisor_times_tp():
    assert padded_vocab(131073, 4) == 131584  # next multiple of 512
    assert padded_vocab(50257, 1) == 50304
    assert padded_vocab(1000, 2, divisible_by=64) == 1024


def _dp_bytes(sched: Schedule) -> int:
    return sum(op.work.nbytes for op in sched.ops if isinstance(op.work, Collective) and op.work.group == "dp")


def test_grad_reduce_dtype_sets_dp_bytes():
    """bf16 default reduces fp32 main grads (4 bytes per parameter); bf16 reduction and fp16 runs 2."""
    fp32 = _dp_bytes(build_schedule(make_rs(GPT, {"tp": 1}, dp=2)))
    params = build_schedule(make_rs(GPT, {"tp": 1}, dp=2)).meta["params_per_rank"]
    assert fp32 == 4 * params
    assert _dp_bytes(build_schedule(make_rs(GPT, {"tp": 1}, {"grad_reduce_dtype": "bf16"}, dp=2))) == 2 * params
    assert _dp_bytes(build_schedule(make_rs({**GPT, "dtype": "fp16"}, {"tp": 1}, dp=2))) == 2 * params


def _kernels(sched: Schedule, name: str) -> list[Elementwise]:
    return [op.work for op in sched.ops if isinstance(op.work, Elementwise) and op.work.kernel == name]


def test_main_grad_add_only_without_grad_accumulation_fusion():
    """One add per weight gradient (4 linears per layer + untied output layer), 10 bytes per parameter."""
    fused = build_schedule(make_rs(GPT, {"tp": 2}))
    unfused = build_schedule(make_rs(GPT, {"tp": 2}, {"grad_accumulation_fusion": False}))
    assert not _kernels(fused, "main_grad_add")
    adds = _kernels(unfused, "main_grad_add")
    assert len(adds) == 4 * GPT["layers"] + 1
    h, f = 256, 1024 // 2
    fc1 = h * f + f  # this rank's fc1 weight and bias
    assert any(a.bytes_read == 6 * fc1 and a.bytes_written == 4 * fc1 for a in adds)


def test_wgrad_accumulates_into_fp32_only_with_fusion():
    """Gradient-accumulation fusion: every weight-gradient GEMM reads and writes its fp32 main grad (8 bytes
    per element of dW); without it wgrad writes 16 bits and the separate add does the rest."""
    def wgrads(sched: Schedule) -> list[Gemm]:
        return [op.work for op in sched.ops if op.name.endswith("_wgrad") and isinstance(op.work, Gemm)]
    fused = wgrads(build_schedule(make_rs(GPT, {"tp": 2})))
    unfused = wgrads(build_schedule(make_rs(GPT, {"tp": 2}, {"grad_accumulation_fusion": False})))
    assert len(fused) == len(unfused) == 4 * GPT["layers"] + 1  # 4 linears per layer + the output layer
    assert {g.out_bytes for g in fused} == {8} and {g.out_bytes for g in unfused} == {2}
    dgrads = [op.work for op in build_schedule(make_rs(GPT, {"tp": 2})).ops if op.name.endswith("_dgrad")]
    assert {g.out_bytes for g in dgrads} == {2}


def test_input_gradient_collective_overlaps_wgrad_unless_the_2020_code():
    """Default (Megatron since 2021): each column-parallel layer's input-gradient all-reduce waits for its
    dgrad only, so it overlaps wgrad. run.tp_grad_reduce_overlap false (Megatron-LM 2020, mpu/mappings.py):
    it waits for the whole linear backward - dgrad, wgrad and the bias gradient - and the layer's norm
    backward waits for it; the output layer's entry collective alike. Same collectives either way."""
    def entry_deps(sched: Schedule) -> dict[str, set[str]]:
        names = {op.id: op.name.rsplit(".", 1)[-1] for op in sched.ops}
        return {op.name: {names[d] for d in op.deps} for op in sched.ops
                if isinstance(op.work, Collective) and op.name.rsplit(".", 1)[-1] in ("attn_in", "mlp_in", "head_in")
                and ".bwd." in op.name}
    overlap = entry_deps(build_schedule(make_rs(GPT, {"tp": 2})))
    sync = entry_deps(build_schedule(make_rs(GPT, {"tp": 2}, {"tp_grad_reduce_overlap": False})))
    assert overlap.keys() == sync.keys() and len(overlap) == 2 * GPT["layers"] + 1
    assert overlap["L0.mb0.bwd.attn_in"] == {"qkv_dgrad"} and overlap["L1.mb0.bwd.mlp_in"] == {"fc1_dgrad"}
    assert sync["L0.mb0.bwd.attn_in"] == {"qkv_dgrad", "qkv_bias_grad"}
    assert sync["L1.mb0.bwd.mlp_in"] == {"fc1_dgrad", "fc1_bias_grad"}
    assert overlap["head.mb0.bwd.head_in"] == {"logits_dgrad"}
    assert sync["head.mb0.bwd.head_in"] == {"logits_dgrad", "logits_wgrad"}


def test_bias_grad_kernels_follow_model_bias():
    """Four bias-gradient reductions per layer with biases; none with bias: false."""
    assert len(_kernels(build_schedule(make_rs(GPT, {"tp": 2})), "bias_grad")) == 4 * GPT["layers"]
    assert not _kernels(build_schedule(make_rs({**GPT, "bias": False}, {"tp": 2})), "bias_grad")


def test_deterministic_marks_only_the_attention_backward():
    sched = build_schedule(make_rs(GPT, {"tp": 1}, {"deterministic": True}))
    att = [op.work for op in sched.ops if type(op.work).__name__ == "Attention"]
    assert all(a.deterministic == a.backward for a in att) and any(a.deterministic for a in att)


def test_host_dispatch_delays_short_kernels_not_long_ones():
    """Three 1 us kernels dispatched at 10 us each end at 31 us (host bound); 100 us kernels are unaffected
    beyond the first dispatch (the host runs ahead)."""
    ops = tuple(Op(i, f"k{i}", "compute", "compute", "fwd", Gemm(1, 1, 1), (i - 1,) if i else ()) for i in range(3))
    sched = Schedule(ops, 1, 1, 1)
    issue = issue_times_s(sched, 10e-6)
    assert issue == pytest.approx((10e-6, 20e-6, 30e-6))
    short = engine.run(sched, (0,), lambda op, r: 1e-6, None, issue_s=issue)
    assert short.step_time_s == pytest.approx(31e-6)
    long = engine.run(sched, (0,), lambda op, r: 100e-6, None, issue_s=issue)
    assert long.step_time_s == pytest.approx(310e-6)
    assert engine.run(sched, (0,), lambda op, r: 1e-6, None).step_time_s == pytest.approx(3e-6)
    assert issue_times_s(replace(sched), 0.0) == ()


def test_deterministic_fill_bytes_closed_form():
    """PyTorch's NaN fill under deterministic algorithms (sim/cost/deterministic_fill.py): a new 16-bit C,
    none for a GEMM accumulating into the fp32 main grad, O + fp32 statistics forward, dQ dK dV backward,
    an elementwise kernel's writes unless it runs in place."""
    from meshsim.sim.cost.deterministic_fill import fill_bytes
    from meshsim.sim.schedule.ops import FUSED_WGRAD_OUT_BYTES, Attention, OptimizerStep
    assert fill_bytes(Gemm(64, 32, 16, batch=3)) == 64 * 32 * 3 * 2
    assert fill_bytes(Gemm(64, 32, 16, out_bytes=FUSED_WGRAD_OUT_BYTES)) == 0
    fwd = Attention(batch=2, heads=8, kv_heads=2, seq=128, head_dim=64)
    assert fill_bytes(fwd) == 2 * 8 * 128 * (64 * 2 + 4)
    assert fill_bytes(replace(fwd, backward=True)) == 2 * 8 * 128 * 64 * 2 + 2 * 2 * 128 * 128 * 2
    assert fill_bytes(Elementwise("gelu", 100, 40)) == 40
    assert fill_bytes(Elementwise("main_grad_add", 100, 40)) == 0  # main_grad.add_: in place
    assert fill_bytes(OptimizerStep(1000)) == 0


def test_deterministic_fill_adds_one_write_pass_and_a_launch_per_fresh_output():
    """fill_s = bytes / (bw x mem_bw_eff) + launch, only with fill_uninitialized (run.deterministic);
    a kernel that allocates nothing costs the same either way (negative control)."""
    from meshsim.sim.cost.compute import ComputeModel
    gpu = GPUS["h100-sxm"]
    plain, det = ComputeModel(gpu), ComputeModel(gpu, fill_uninitialized=True)
    e = Elementwise("gelu", 1 << 24, 1 << 24)
    fill = (1 << 24) / (gpu.mem_bw_gbps * 1e9 * 0.90) + 3e-6
    assert det.time_s(e) == pytest.approx(plain.time_s(e) + fill, rel=1e-12)
    inplace = Elementwise("main_grad_add", 1 << 24, 1 << 24)
    assert det.time_s(inplace) == plain.time_s(inplace)


def test_deterministic_run_fills_outputs_in_the_simulated_step():
    """The step of a deterministic run is longer than the same run without it by the fills' sum at least
    (run.deterministic also slows the attention backward); without it nothing is filled."""
    from meshsim.sim.results.costers import compute_fn
    rs = make_rs(GPT, {"tp": 1}, {"deterministic": True})
    sched = build_schedule(rs)
    cost = compute_fn(rs)
    plain = compute_fn(make_rs(GPT, {"tp": 1}))
    works = [op for op in sched.ops if op.stream == "compute"]
    assert sum(cost(op, 0) for op in works) > sum(plain(op, 0) for op in works)
    gemm = next(op for op in works if isinstance(op.work, Gemm))
    assert cost(gemm, 0) > plain(gemm, 0)
