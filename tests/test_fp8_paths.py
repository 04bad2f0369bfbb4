"""FP8 paths that published recipes run (issue 42 item 4): delayed scaling with MoE / MLA models, FP8
attention beside NVFP4 GEMMs; what Transformer Engine refuses stays refused."""

from __future__ import annotations

import pytest
from test_moe_fp8 import tiny

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.fp8_rules import delayed_fp8_gemms


def test_delayed_gemm_count_closed_form() -> None:
    # Mixtral-like: 32 MoE layers, 8 experts on ep 8 -> 1 local expert: 32 x (2 + 2) = 128
    assert delayed_fp8_gemms(2, 0, 32, 1, False) == 128
    # 2 dense + 2 MoE layers, 2 local experts and a shared expert: 4 x 2 + 2 x 2 + 2 x (4 + 2) = 24
    assert delayed_fp8_gemms(2, 2, 2, 2, True) == 24
    # MLA with a q down-projection: 5 attention linears
    assert delayed_fp8_gemms(5, 1, 0, 0, False) == 7


def test_delayed_moe_prices_one_amax_set_per_expert_gemm() -> None:
    """tiny-2gpu MoE at ep 4: 2 local experts + a shared expert; per layer 2 + 2 x 2 + 2 = 8 FP8 GEMMs,
    3 amaxes each forward and 2 backward, 4 bytes each, all-reduced once per pass over the stage."""
    rs = tiny({"run.fp8": "delayed"})
    layers = rs.scenario.model.layers
    reds = [op for op in build_schedule(rs).ops if op.name.endswith(K.FP8_AMAX_REDUCE) and op.micro_batch == 0]
    assert [op.work.nbytes for op in reds] == [layers * 8 * 3 * 4, layers * 8 * 2 * 4]
    assert {op.work.group for op in reds} == {"stage"}
    ups = [op for op in build_schedule(rs).ops if op.name.endswith(K.FP8_AMAX_UPDATE) and op.micro_batch == 0]
    hist = rs.scenario.run.fp8_amax_history_len
    assert ups[0].work.bytes_read == layers * 8 * 3 * (hist + 1) * 4
    # negative control: tensorwise has no region-wide amax reduction
    assert not [op for op in build_schedule(tiny({"run.fp8": "tensorwise"})).ops
                if op.name.endswith(K.FP8_AMAX_REDUCE)]


def test_delayed_mla_model_runs() -> None:
    mla = {"kv_lora_rank": 64, "qk_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32}
    rs = tiny({"run.fp8": "delayed", "model.mla": mla})
    reds = [op for op in build_schedule(rs).ops if op.name.endswith(K.FP8_AMAX_REDUCE) and op.micro_batch == 0]
    layers = rs.scenario.model.layers
    assert reds[0].work.nbytes == layers * (4 + 2 * 2 + 2) * 3 * 4  # MLA's 4 linears, no q down-projection


def test_nvfp4_with_fp8_attention_prices_the_core_in_fp8() -> None:
    base = {"topology.preset": "dgx-b200", "parallel.gpus": 8, "parallel.tp": 1, "parallel.global_batch": 8,
            "parallel.micro_batch": 1, "model.attention": "flash", "run.fp8": "nvfp4"}
    scenario, source = load_scenario("tiny-2gpu")
    off = resolve(with_overrides(scenario, base, source), source)
    on = resolve(with_overrides(scenario, {**base, "run.fp8_attention": True}, source), source)
    core = [op.work for op in build_schedule(on).ops if op.layer == 0 and op.micro_batch == 0
            and getattr(op.work, "fp8", None) is not None and "attn" in op.name]
    assert core and any(w.fp8 for w in core)
    assert not any(getattr(op.work, "fp8", False) for op in build_schedule(off).ops
                   if op.layer == 0 and op.micro_batch == 0 and "attn" in op.name)


def test_blockwise_fp8_attention_refused_citing_te() -> None:
    scenario, source = load_scenario("tiny-2gpu")
    with pytest.raises(UserError) as err:
        resolve(with_overrides(scenario, {"topology.preset": "dgx-h100", "parallel.gpus": 8, "parallel.tp": 1,
                                          "parallel.global_batch": 8, "parallel.micro_batch": 1, "model.attention": "flash",
                                          "run.fp8": "blockwise", "run.fp8_attention": True}, source), source)
    assert err.value.field == "run.fp8_attention" and "recipe/__init__.py" in err.value.problem
