"""MoE scenario fields, Megatron's checks and the expert mesh (parallel folding)."""

from __future__ import annotations

import copy
import itertools

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.moe_checks import linear_bias
from meshsim.scenarios.schema import ModelConfig
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.schedule.model_family import has_linear_bias

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def tiny(overrides: dict, gpus: int = 8):
    """tiny-2gpu as an MoE model on `gpus` GPUs of one DGX H100."""
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": gpus, "parallel.tp": 1, "parallel.global_batch": 2 * gpus, **copy.deepcopy(MOE)}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def expert_reference(kind: str, rank: int, tp: int, dp: int, ep: int, etp: int) -> tuple[int, ...]:
    """Megatron's expert RankGenerator (parallel_state.py L887-895, order tp-ep-dp-pp with tp = etp): rank
    = etp_r + etp (ep_r + ep (edp_r + edp pp_r)); a group varies its own coordinates, fixes the others."""
    edp, size = tp * dp // (etp * ep), tp * dp
    pp = 2
    coords = {}
    for r in range(size * pp):
        local, stage = r % size, r // size
        coords[r] = (local % etp, local // etp % ep, local // (etp * ep), stage)
    varying = {"etp": (0,), "ep": (1,), "etp_ep": (0, 1), "edp": (2,)}[kind]
    mine = coords[rank]
    same = [r for r, c in coords.items() if all(c[i] == mine[i] for i in range(4) if i not in varying)]
    assert edp >= 1
    return tuple(sorted(same))


@pytest.mark.parametrize("tp,dp,ep,etp", [(1, 8, 8, 1), (2, 4, 4, 1), (2, 4, 4, 2), (4, 2, 2, 2), (8, 1, 2, 1),
                                          (1, 16, 4, 2), (2, 8, 16, 1)])
def test_expert_mesh_is_megatrons_rank_generator(tp, dp, ep, etp):
    for kind, rank in itertools.product(("etp", "ep", "etp_ep", "edp"), range(2 * tp * dp)):
        assert mesh_group(kind, rank, tp, dp, pp=2, ep=ep, etp=etp) == expert_reference(kind, rank, tp, dp, ep, etp)


def test_resolved_scenario_groups_and_edp():
    rs = tiny({"parallel.ep": 4})
    assert (rs.ep, rs.etp, rs.edp, rs.dp) == (4, 1, 2, 8)
    assert rs.group("ep", 5) == (4, 5, 6, 7) and rs.group("edp", 5) == (1, 5)
    assert rs.all_groups("ep") == ((0, 1, 2, 3), (4, 5, 6, 7))


@pytest.mark.parametrize("overrides,field,words", [
    ({"parallel.ep": 3}, "parallel.ep", "does not divide model.moe.experts"),
    ({"parallel.ep": 8, "parallel.etp": 2}, "parallel.ep", "must tile"),
    ({"parallel.etp": 4, "model.moe.ffn_hidden": 510}, "parallel.etp", "ffn_hidden"),
    ({"parallel.etp": 2, "model.bias": True}, "parallel.etp", "biases"),
    ({"parallel.tp": 2}, "parallel.sp", "sequence parallelism"),
    ({"model.moe.top_k": 9}, "model.moe.top_k", "top_k"),
    ({"model.moe.dense_layers": 2}, "model.moe.dense_layers", "No MoE layer"),
    ({"model.moe.router_groups": 4}, "model.moe.router_group_topk", "both"),
    ({"model.moe.router_groups": 3, "model.moe.router_group_topk": 1}, "model.moe.router_groups", "equal groups"),
    ({"model.moe.router_groups": 4, "model.moe.router_group_topk": 3}, "model.moe.router_group_topk", "top_k"),
    ({"model.moe.pad_to_capacity": True}, "model.moe.pad_to_capacity", "capacity factor"),
    ({"parallel.moe_ep_overlap": True}, "parallel.moe_ep_overlap", "ep > 1"),
    ({"parallel.ep": 8, "parallel.moe_ep_overlap": True, "parallel.moe_dispatcher": "allgather"},
     "parallel.moe_ep_overlap", "alltoall"),
    ({"parallel.delay_wgrad_compute": True}, "parallel.delay_wgrad_compute", "moe_ep_overlap"),
])
def test_moe_rules(overrides, field, words):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)


def test_ep_without_moe_is_refused():
    scenario, source = load_scenario("tiny-2gpu")
    with pytest.raises(UserError) as err:
        resolve(with_overrides(scenario, {"parallel.ep": 2}, source), source)
    assert err.value.field == "parallel.ep" and "model.moe" in str(err.value)


def test_pipeline_layout_rules():
    ok = tiny({"parallel.pp": 2, "parallel.pipeline_layout": "Et|tmL", "parallel.ep": 4, "model.mtp_layers": 1})
    assert ok.pp == 2
    for layout, words in (("Et|ttL", "3 't' layers"), ("Et|t|L", "segments"), ("tE|tL", "embedding"),
                          ("Ex|tL", "only t, E"), ("(t)*999999|L", "too long")):
        with pytest.raises(UserError) as err:
            tiny({"parallel.pp": 2, "parallel.pipeline_layout": layout})
        assert err.value.field == "parallel.pipeline_layout" and words in str(err.value)


@pytest.mark.parametrize("mlp,bias", list(itertools.product(("gelu", "swiglu", "relu2"), (None, True, False))))
def test_checks_bias_rule_is_the_model_family_rule(mlp, bias):
    m = ModelConfig(layers=1, hidden=8, heads=1, seq_len=8, vocab=8, mlp=mlp, bias=bias)
    assert linear_bias(m) == has_linear_bias(m)


def test_moe_layer_pattern_and_window():
    m = ModelConfig(layers=8, hidden=8, heads=1, seq_len=8, vocab=8, sliding_window=4,
                    moe={"experts": 4, "top_k": 1, "ffn_hidden": 8, "dense_layers": 3, "every": 2})
    assert [m.moe.is_moe_layer(i) for i in range(8)] == [False, False, False, True, False, True, False, True]
    assert [m.windowed(i) for i in range(4)] == [True, False, True, False]  # window_attn_skip_freq 2
    assert m.kv_channels == 8 and ModelConfig(layers=1, hidden=8, heads=1, seq_len=8, vocab=8, head_dim=3).kv_channels == 3
