"""Memory per GPU against hand-computed values (Korthikanti et al. 2022 formulas), and model FLOPs."""

from __future__ import annotations

import dataclasses

import pytest

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario
from meshsim.sim.cost.flops import hardware_flops_per_step, model_flops_per_step
from meshsim.sim.cost.memory import WORKSPACE_GB, activation_bytes, memory_per_gpu, params_per_rank
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Topology

L, H, A, S, B, V = 2, 256, 8, 128, 2, 1000
GPT = dict(layers=L, hidden=H, heads=A, seq_len=S, vocab=V, mlp="gelu", dropout=True, attention="unfused")


def make_rs(model: dict, parallel: dict, *, dp: int = 1) -> ResolvedScenario:
    par = {"micro_batch": B, "global_batch": 2 * B * dp, **parallel}
    s = Scenario.model_validate({"name": "t", "model": model, "topology": {"preset": "dgx-h100"},
                                 "parallel": par})
    tp = s.parallel.tp
    topo = Topology("trivial", "h100-sxm", 1, tp * dp, (), ())
    return ResolvedScenario(s, "test", GPUS["h100-sxm"], topo, tp * dp, tp, dp,
                            s.parallel.global_batch // (s.parallel.micro_batch * dp))


def vocab_padded(t: int) -> int:
    return -(-V // (128 * t)) * 128 * t


def gpt_params(t: int) -> int:
    """12h^2/t GEMM weights, biases (qkv 3h/t, fc1 4h/t sharded; proj, fc2 h replicated), 2 LayerNorms
    of 2h; untied embedding + output layer (V_pad/t) h each; final LayerNorm 2h."""
    layer = 12 * H * H // t + 7 * H // t + 2 * H + 4 * H
    return L * layer + 2 * vocab_padded(t) // t * H + 2 * H


# ----- parameters and model states ---------------------------------------------------------------------
@pytest.mark.parametrize("t", [1, 2, 4])
def test_params_per_rank(t):
    assert params_per_rank(make_rs(GPT, dict(tp=t))) == gpt_params(t)


def test_gqa_replicates_kv_heads_and_swiglu_has_gate_and_up():
    """kv 2 < t 4: each rank holds a/t = 2 query heads and one (replicated) KV head of d = 32."""
    model = dict(GPT, kv_heads=2, mlp="swiglu", ffn_hidden=512)
    t, d, f_t = 4, H // A, 512 // 4
    layer = H * (2 + 2 * 1) * d + 2 * d * H + H * 2 * f_t + f_t * H + 2 * H  # RMSNorms: h each, no biases
    expected = L * layer + 2 * vocab_padded(t) // t * H + H
    assert params_per_rank(make_rs(model, dict(tp=t))) == expected


@pytest.mark.parametrize("distopt", [False, True])
def test_model_states(distopt):
    rs = make_rs(GPT, dict(tp=2, distributed_optimizer=distopt), dp=4)
    m, p = memory_per_gpu(rs), gpt_params(2)
    assert m.weights_gb == pytest.approx(2 * p / 1e9)
    assert m.grads_gb == pytest.approx(4 * p / 1e9)
    assert m.optimizer_gb == pytest.approx(12 * p / (4 if distopt else 1) / 1e9)
    total = m.weights_gb + m.grads_gb + m.optimizer_gb + m.activations_gb + WORKSPACE_GB
    # an "80GB" H100 holds 80 GiB = 85.9 GB
    assert m.total_gb == pytest.approx(total) and m.capacity_gb == pytest.approx(80 * 2**30 / 1e9) and m.fits


def test_fits_compares_with_capacity():
    rs = make_rs(GPT, dict(tp=2))
    small = dataclasses.replace(rs, gpu=dataclasses.replace(rs.gpu, mem_gb=1.0))
    assert not memory_per_gpu(small).fits


# ----- activations ------------------------------------------------------------------------------------------
def head_bytes(t: int, sp: bool) -> float:
    """Embedding dropout mask sbh + final-norm input and logits input 2sbh each (/t under SP), fp32 logits."""
    out = S * B * H * (1 + 2 + 2) / (t if sp else 1)
    return out + 4 * S * B * vocab_padded(t) / t


@pytest.mark.parametrize("t", [1, 2, 4])
def test_tp_activations(t):
    layer = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert activation_bytes(make_rs(GPT, dict(tp=t))) == pytest.approx(L * layer + head_bytes(t, False))


@pytest.mark.parametrize("t", [2, 4])
def test_sp_activations(t):
    layer = S * B * H / t * (34 + 5 * A * S / H)
    assert activation_bytes(make_rs(GPT, dict(tp=t, sp=True))) == pytest.approx(L * layer + head_bytes(t, True))


@pytest.mark.parametrize("sp", [False, True])
def test_selective_recompute_and_flash_drop_the_scores(sp):
    t = 2
    layer = S * B * H * (10 / (t if sp else 1) + 24 / t)
    expected = L * layer + head_bytes(t, sp)
    assert activation_bytes(make_rs(GPT, dict(tp=t, sp=sp, recompute="selective"))) == pytest.approx(expected)
    assert activation_bytes(make_rs(dict(GPT, attention="flash"), dict(tp=t, sp=sp))) == pytest.approx(expected)


@pytest.mark.parametrize("sp", [False, True])
def test_full_recompute_keeps_layer_inputs_plus_one_layer(sp):
    t = 2
    shard = t if sp else 1
    one_layer = S * B * H * (10 / shard + 24 / t + 5 * A * S / (H * t))
    expected = L * 2 * S * B * H / shard + one_layer + head_bytes(t, sp)
    assert activation_bytes(make_rs(GPT, dict(tp=t, sp=sp, recompute="full"))) == pytest.approx(expected)


def test_gqa_swiglu_activations():
    """Per token: outside 8h (no dropout); inside Q 2 a_t d, K, V 2 kv_t d, proj input 2 a_t d,
    gate+up 4 f_t, swiglu output 2 f_t."""
    model = dict(GPT, kv_heads=2, mlp="swiglu", ffn_hidden=512, dropout=False, attention="flash")
    t, d, f_t = 4, H // A, 512 // 4
    per_token = 8 * H / t + 2 * (2 * 2 + 2 * 1) * d + 6 * f_t
    head = S * B * H * 4 / t + 4 * S * B * vocab_padded(t) / t
    rs = make_rs(model, dict(tp=t, sp=True))
    assert activation_bytes(rs) == pytest.approx(L * S * B * per_token + head)


# ----- FLOPs ----------------------------------------------------------------------------------------------
def test_model_flops_matches_the_gpt_formula():
    rs = make_rs(GPT, dict(tp=2))
    batch = rs.scenario.parallel.global_batch
    formula = 72 * batch * L * S * H**2 * (1 + S / (6 * H) + V / (12 * L * H))
    assert model_flops_per_step(rs) == pytest.approx(formula, rel=1e-12)


def test_model_flops_gqa_swiglu_counts_the_gemms():
    model = dict(GPT, kv_heads=2, mlp="swiglu", ffn_hidden=512)
    rs = make_rs(model, dict(tp=2))
    d = H // A
    per_token_layer = 2 * H * (A + 2 * 2) * d + 2 * H * H + 4 * S * H + 3 * 2 * H * 512
    expected = 3 * rs.scenario.parallel.global_batch * S * (L * per_token_layer + 2 * H * V)
    assert model_flops_per_step(rs) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("recompute, extra", [("none", 0.0), ("selective", 4 * S * H),
                                               ("full", 24 * H * H + 4 * S * H)])
def test_hardware_flops_add_the_recompute(recompute, extra):
    rs = make_rs(GPT, dict(tp=2, recompute=recompute))
    tokens = rs.scenario.parallel.global_batch * S
    assert hardware_flops_per_step(rs) == pytest.approx(model_flops_per_step(rs) + tokens * L * extra)
