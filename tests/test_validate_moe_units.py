"""validate's MoE pieces that need no second process: the router's top-k against hand-computed values, the
permutation and chunk sort against Megatron's formulas, the whole single-rank MoE model against the dense
reference (and the permutation fault failing it), the shrink, the variant modifiers and their refusals,
the schedule's MoE collectives in elements, and the mean-size and stand-in bookkeeping of the op counts."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario  # noqa: E402
from meshsim.scenarios.schema import MoeConfig  # noqa: E402
from meshsim.sim.core.errors import UserError  # noqa: E402
from meshsim.sim.schedule.builder import build_schedule  # noqa: E402
from meshsim.sim.schedule.shapes import ModelDims  # noqa: E402
from meshsim.validate.numerics import opcount  # noqa: E402
from meshsim.validate.numerics.check import _resolved, make_variant, moe_specs, numerics_payload  # noqa: E402
from meshsim.validate.stack.comm import comm_tag  # noqa: E402
from meshsim.validate.stack.layers import Mesh, Plan  # noqa: E402
from meshsim.validate.stack.model import forward, grad_buckets, init_full_weights, local_weights, make_batch  # noqa: E402
from meshsim.validate.stack.moe import by_local_expert, sort_chunks  # noqa: E402
from meshsim.validate.stack.moe_comm import gather_rows  # noqa: E402
from meshsim.validate.stack.moe_router import route  # noqa: E402
from meshsim.validate.stack.moe_shard import ExpertMesh, MoeLayout  # noqa: E402
from meshsim.validate.stack.reference import reference  # noqa: E402
from meshsim.validate.stack.shard import full_shapes, sequence_parallel_params  # noqa: E402

MIXTRAL = "mixtral-8x7b-h100-ep8"


def moe(**kw) -> MoeConfig:
    return MoeConfig(**{"experts": 4, "top_k": 2, "ffn_hidden": 8, **kw})


def test_softmax_router_takes_the_top_k_logits_then_their_softmax():
    probs, routing = route(torch.tensor([[1.0, 3.0, 2.0, 0.0]], dtype=torch.float64), moe())
    e = math.e
    torch.testing.assert_close(probs, torch.tensor([[0.0, e / (1 + e), 1 / (1 + e), 0.0]], dtype=torch.float64))
    assert routing.tolist() == [[False, True, True, False]]


def test_sigmoid_router_normalises_the_top_k_scores():
    logits = torch.tensor([[0.0, 2.0, -1.0, 1.0]], dtype=torch.float64)
    probs, _ = route(logits, moe(router="sigmoid"))
    s2, s1 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(-1))
    expect = [0.0, s2 / (s2 + s1), 0.0, s1 / (s2 + s1)]
    torch.testing.assert_close(probs, torch.tensor([expect], dtype=torch.float64))
    top1, _ = route(logits, moe(router="sigmoid", top_k=1))
    assert top1[0, 1].item() == pytest.approx(s2)  # one expert: the score itself, not normalised


def test_group_limited_routing_picks_the_best_group_by_its_top_scores():
    """Groups {0, 1} and {2, 3}: expert 0 is the best single expert, but group 1's top-2 sum (6) beats
    group 0's (0), so one picked group means experts 2 and 3."""
    logits = torch.tensor([[5.0, -5.0, 3.0, 3.0]], dtype=torch.float64)
    _, plain = route(logits, moe())
    _, grouped = route(logits, moe(router_groups=2, router_group_topk=1))
    assert plain.tolist() == [[True, False, True, False]]
    assert grouped.tolist() == [[False, False, True, True]]


def test_chunk_sort_is_megatrons_and_its_inverse_restores():
    for chunks, local in ((4, 2), (8, 2), (6, 3)):
        order = by_local_expert(chunks, local)
        assert order == torch.arange(chunks).reshape(-1, local).T.ravel().tolist()
    x = torch.arange(10.0)
    sizes, order = [1, 2, 3, 4], by_local_expert(4, 2)
    y = sort_chunks(x, sizes, order)
    assert y.tolist() == [0.0, 3.0, 4.0, 5.0, 1.0, 2.0, 6.0, 7.0, 8.0, 9.0]
    back = sort_chunks(y, [sizes[c] for c in order], sorted(range(4), key=order.__getitem__))
    assert back.tolist() == x.tolist()


def _one_rank_moe(mlp: str, recompute: str, **moe_kw):
    bias = mlp != "swiglu"
    d = ModelDims(2, 16, 2, 2, 8, 32, mlp, bias, bias, 8, 128, 2, False, 1, 1, False, recompute)
    layout = MoeLayout(moe(ffn_hidden=16, **moe_kw))
    return d, layout, ExpertMesh(1, 1, 1, 0, 0)


@pytest.mark.parametrize("mlp,recompute,kw", [
    ("swiglu", "none", {}), ("gelu", "full", {"router": "sigmoid", "shared_ffn_hidden": 16, "dense_layers": 1}),
    ("swiglu", "selective", {"router_groups": 2, "router_group_topk": 1, "shared_ffn_hidden": 8}),
    ("quick_geglu", "none", {})])  # GPT-OSS's activation, with biases
def test_single_rank_moe_model_equals_the_dense_reference(mlp, recompute, kw):
    """ep = etp = 1: permute, sort by local expert (4 of them), one computation per expert, unpermute equal
    sum_e p_e MLP_e(x), forward and every gradient (router included); a wrong permutation does not."""
    d, layout, em = _one_rank_moe(mlp, recompute, **kw)
    full = init_full_weights(d, 5, torch.float64, layout)
    tokens, labels = make_batch(d, 5)
    ref = reference(full, tokens, labels, d, layout)
    mesh = Mesh(1, 1, 0, 0, experts=em)
    for faults in (frozenset(), frozenset({"wrong_permute"})):
        w = local_weights(full, d, 0, layout, em)
        loss, _ = forward(w, tokens, labels, Plan(d, faults, layout), mesh)
        loss.backward()
        if faults:
            assert (loss.detach() - ref.token_losses.mean()).abs() > 1e-6
            continue
        torch.testing.assert_close(loss.detach(), ref.token_losses.mean())
        assert any(".router." in n for n in w) and any(".experts.3." in n for n in w)
        for n, t in w.items():
            torch.testing.assert_close(t.grad, ref.grads[n], msg=n)


def test_quick_geglu_is_megatrons_formula_on_gate_and_up():
    """quick_geglu(g, u) = g sigmoid(1.702 g) u on fc1's [gate | up] columns (fused_bias_geglu.py quick_geglu,
    linear offset 0), and not SwiGLU's silu(g) u (a negative control on the same input)."""
    from meshsim.validate.stack.layers import mlp_activation

    y = torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    g, u = y[:, :2], y[:, 2:]
    expected = g * torch.sigmoid(1.702 * g) * u
    torch.testing.assert_close(mlp_activation("quick_geglu", y), expected)
    assert (mlp_activation("swiglu", y) - expected).abs().max() > 1e-3


def test_expert_parameters_held_sliced_and_bucketed():
    """ep 2 x etp 2: rank (ep 1, etp 1) holds experts 2 and 3, the second half of each fc1 row block and fc2
    column block; the router and the shared fc2 bias are SP-region parameters; expert buckets go first."""
    d, _, _ = _one_rank_moe("gelu", "none")
    layout = MoeLayout(moe(ffn_hidden=16, shared_ffn_hidden=8), ep=2, etp=2)
    em = ExpertMesh(2, 2, 1, 1, 1)
    full = init_full_weights(d, 5, torch.float64, layout)
    w = local_weights(full, d, 0, layout, em)
    assert sorted({n.split(".")[3] for n in w if ".experts." in n}) == ["2", "3"]
    torch.testing.assert_close(w["layers.0.experts.2.fc1.weight"], full["layers.0.experts.2.fc1.weight"][8:])
    torch.testing.assert_close(w["layers.0.experts.3.fc2.weight"], full["layers.0.experts.3.fc2.weight"][:, 8:])
    sp = sequence_parallel_params(d, layout)
    assert {"layers.0.router.weight", "layers.0.router.bias", "layers.1.shared.fc2.bias"} <= set(sp)
    assert not [n for n in sp if ".experts." in n]
    assert len(full_shapes(d, layout)) == len(full)
    buckets = grad_buckets(list(w), w, 1 << 30, dp=2, edp=2)
    assert [g for g, _ in buckets] == ["edp", "dp"]  # experts complete before the embedding's gradient
    assert all(".experts." in n for n in buckets[0][1]) and not [n for n in buckets[1][1] if ".experts." in n]


def test_shrunk_moe_scenario_and_default_variants():
    sc, src = load_scenario(MIXTRAL)
    v = make_variant(sc, "", 4, src).scenario
    assert (v.parallel.ep, v.parallel.etp, v.parallel.moe_dispatcher) == (4, 1, "alltoall")
    assert (v.model.moe.experts, v.model.moe.top_k, v.model.moe.ffn_hidden) == (8, 2, v.model.hidden)
    q, qsrc = load_scenario("qwen3-30b-a3b-h100-ep16")  # flex dispatcher, head_dim 128: run as alltoall
    qv = make_variant(q, "", 2, qsrc).scenario
    assert (qv.parallel.ep, qv.parallel.moe_dispatcher, qv.model.head_dim) == (2, "alltoall", None)
    specs = [v.name for v in numerics_payload(sc, src, 4, None)[0]]
    assert specs == moe_specs(4) and any("ep2" in s for s in specs) and any("ep4" in s for s in specs)
    assert any("etp2" in s for s in specs)


def test_a_variant_takes_its_activations_biases_not_the_scenarios():
    """GPT-OSS sets model.bias for its quick-GEGLU; a swiglu etp2 variant takes SwiGLU's default (none, so
    Megatron's etp rule holds), a gelu one GELU's (biases), and `bias` adds them (then etp2 is refused)."""
    sc, src = load_scenario("gpt-oss-120b-h100-pp4-ep8")
    assert sc.model.bias is True and sc.model.mlp == "quick_geglu"
    swiglu = make_variant(sc, "pp1+dp4+tp+swiglu+ep2+etp2+grouped", 4, src).scenario.model
    gelu = make_variant(sc, "pp1+dp2+sp+gelu+grouped+shared+full+ep2", 4, src).scenario.model
    assert (swiglu.mlp, swiglu.bias, gelu.mlp, gelu.bias) == ("swiglu", None, "gelu", None)
    assert make_variant(sc, "pp1+dp2+sp+gelu+ep2+bias", 4, src).scenario.model.bias is True
    with pytest.raises(UserError, match="biases"):
        numerics_payload(sc, src, 4, ["pp1+dp4+tp+swiglu+ep2+etp2+bias"])
    own = make_variant(sc, "pp1+dp2+tp+quick_geglu+ep2+bias", 4, src).scenario.model
    assert (own.mlp, own.bias, own.activation_clamp) == ("quick_geglu", True, None)  # the clamp is not run


def test_moe_modifiers_and_their_refusals():
    sc, src = load_scenario(MIXTRAL)
    v = make_variant(sc, "dp2+sp+gelu+sigmoid+grouped+shared+dense1+ep2", 4, src).scenario
    m = v.model.moe
    assert (v.parallel.tp, v.parallel.ep, m.experts, m.router, m.router_groups, m.dense_layers) == \
        (2, 2, 4, "sigmoid", 2, 1)
    assert m.shared_ffn_hidden == v.model.hidden
    with pytest.raises(UserError, match="biases"):  # Megatron refuses biases with etp > 1
        numerics_payload(sc, src, 4, ["dp4+tp+gelu+ep2+etp2"])
    with pytest.raises(UserError, match="parallel.sp"):  # MoE with tp > 1 needs SP
        numerics_payload(sc, src, 4, ["dp2+tp+swiglu+ep2"])
    with pytest.raises(UserError, match="all-to-all"):
        numerics_payload(sc, src, 4, ["dp4+tp+swiglu+ep1+wrong_combine"])
    tiny, tsrc = load_scenario("tiny-2gpu")
    with pytest.raises(UserError, match="no MoE layers"):
        make_variant(tiny, "tp+ep2", 2, tsrc)


def test_schedule_moe_collectives_in_elements():
    """tp 1, ep 4, top-2 of 8 experts, T = seq 8 x micro-batch 2 = 16 tokens of h = 16: the dispatch moves
    T k h = 512 elements, its probabilities T k = 32, the counts ep x experts = 32."""
    sc, src = load_scenario(MIXTRAL)
    variant = make_variant(sc, "dp4+tp+swiglu+ep4", 4, src)
    records = {r.name: r for r in opcount.schedule_records(build_schedule(_resolved(variant, src)), 2)}
    assert (records["L0.mb0.fwd.dispatch"].numel, records["L0.mb0.fwd.dispatch"].ranks) == (512, 4)
    assert records["L0.mb0.fwd.dispatch_probs"].numel == records["L0.mb0.bwd.dispatch_probs"].numel == 32
    assert records["L0.mb0.fwd.dispatch_meta"].numel == 32 and records["L0.mb0.fwd.dispatch_meta"].group == "etp_ep"
    assert "L0.mb0.bwd.dispatch_meta" not in records and records["L1.mb0.bwd.combine"].op == "all_to_all"


def test_routed_sizes_are_compared_as_means_over_the_ranks():
    def call(name, numel):
        return {"name": name, "op": "all_to_all", "group": "ep", "ranks": 2, "numel": numel}

    rows = [[call("L0.mb0.fwd.combine", 30 * 16), call("opt.ln_grad", 7)],
            [call("L0.mb0.fwd.combine", 34 * 16), call("opt.ln_grad", 7)]]
    mean = opcount.mean_routed_sizes(rows)
    assert [c["numel"] for c in mean[0]] == [32 * 16, 7] and mean[1][0]["numel"] == 32 * 16
    assert opcount.routing_imbalance(rows) == pytest.approx(34 / 32)
    odd = opcount.mean_routed_sizes([[call("L0.mb0.fwd.dispatch", 3)], [call("L0.mb0.fwd.dispatch", 4)]])
    assert odd[0][0]["numel"] == 3.5  # an uneven mean stays a float: it cannot equal the schedule's count


def test_unequal_all_gather_counts_as_one_all_gather(world1):
    """gloo's stand-in for an all-gather of unequal sizes (an all_to_all_single) is counted as that one
    all-gather, with its gathered size."""
    x = torch.arange(6.0).view(3, 2)
    with opcount.count_collectives({id(world1): "etp"}) as calls, comm_tag("L0", "expert_gather", "fwd"):
        out = gather_rows(x, [3], world1, "L0", "expert_gather")
    assert out.tolist() == x.tolist()
    assert [(c.name, c.op, c.group, c.numel) for c in calls] == [("L0.mb0.fwd.expert_gather", "all_gather", "etp", 6)]
