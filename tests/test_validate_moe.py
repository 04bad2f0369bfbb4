"""MoE layers for real (one spawn of 4 gloo processes for every check in this file): the default MoE
variants of Mixtral shrunk to 4 ranks (ep 4 and ep 2, etp 2, softmax and sigmoid routers, group-limited
routing, a shared expert, SP, full recompute, a leading dense layer, a pipeline) equal the single-process
dense reference in loss, logits and every parameter shard's gradient, their collectives equal the
simulator's schedule, and the negative controls (wrong permutation, wrong combine order) fail naming
the tensors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario  # noqa: E402
from meshsim.validate.launch.launch import launch  # noqa: E402
from meshsim.validate.numerics.check import MOE_SPECS, merge, numerics_payload  # noqa: E402

pytestmark = pytest.mark.slow
MIXTRAL = "mixtral-8x7b-h100-ep8"
SPECS = MOE_SPECS[4]
CONTROLS = ["dp4+tp+swiglu+ep4+wrong_permute", "dp2+sp+swiglu+ep2+etp2+wrong_combine"]


@pytest.fixture(scope="module")
def run():
    sc, src = load_scenario(MIXTRAL)
    variants, payload = numerics_payload(sc, src, 4, SPECS + CONTROLS)
    per_rank = launch("numerics", payload, 4, timeout_s=120.0)
    return per_rank, {r.name: r for r in merge(variants, per_rank, src)}


def test_every_moe_variant_matches_the_reference(run):
    _, results = run
    for spec in SPECS:
        r = results[spec]
        assert r.ok, (spec, r.errors, r.mismatches[:3])
    # ep 4, tp 1: per rank loss, logits and 29 parameters (2 layers x (ln1, q, k, v, o, ln2, router, 2 local
    # experts x gate, up, fc2) + embedding, final norm, head), on 4 ranks
    assert results["dp4+tp+swiglu+ep4"].checked == 4 * (2 + 2 * 13 + 3)


def test_counted_collectives_equal_the_schedule(run):
    _, results = run
    for spec in SPECS:
        assert results[spec].op_diffs == [], spec


def test_moe_layer_issues_megatrons_collectives_in_order(run):
    """tp 2 + SP, ep 2, etp 2, shared expert: rank 0's forward of layer 0, as the real run issued it."""
    calls = run[1]["dp2+sp+swiglu+ep2+etp2+shared+sigmoid"].calls
    fwd = [(c["name"].rsplit(".", 1)[1], c["op"], c["group"]) for c in calls if c["name"].startswith("L0.mb0.fwd.")]
    assert fwd == [("attn_in", "all_gather", "tp"), ("attn_out", "reduce_scatter", "tp"),
                   ("shared_in", "all_gather", "tp"), ("shared_out", "reduce_scatter", "tp"),
                   ("dispatch_meta", "all_gather", "etp_ep"), ("dispatch", "all_to_all", "ep"),
                   ("dispatch_probs", "all_to_all", "ep"), ("expert_gather", "all_gather", "etp"),
                   ("expert_gather_probs", "all_gather", "etp"), ("expert_scatter", "reduce_scatter", "etp"),
                   ("combine", "all_to_all", "ep")]
    bwd = sorted((c["name"].rsplit(".", 1)[1], c["op"]) for c in calls if c["name"].startswith("L0.mb0.bwd."))
    moe_bwd = [b for b in bwd if b[0] in ("dispatch", "dispatch_probs", "expert_gather", "expert_gather_probs",
                                          "expert_scatter", "combine", "dispatch_meta")]
    assert moe_bwd == [("combine", "all_to_all"), ("dispatch", "all_to_all"), ("dispatch_probs", "all_to_all"),
                       ("expert_gather", "reduce_scatter"), ("expert_gather_probs", "reduce_scatter"),
                       ("expert_scatter", "all_gather")]


def test_expert_gradients_reduce_over_edp(run):
    """tp 2 x dp 2 with ep 2: edp 2, so the experts' bucket is all-reduced over edp (first: backward
    completes it before the embedding's), the dense one over dp; ep 4 on 4 ranks leaves edp 1."""
    results = run[1]
    buckets = [(c["name"], c["group"], c["ranks"]) for c in results["dp2+sp+gelu+grouped+shared+full+ep2"].calls
               if c["name"].startswith("dp.")]
    assert buckets == [("dp.bucket0.all_reduce", "edp", 2), ("dp.bucket1.all_reduce", "dp", 2)]
    assert [c["group"] for c in results["dp4+tp+swiglu+ep4"].calls if c["name"].startswith("dp.")] == ["dp"]


def test_routing_is_uneven_yet_compared_exactly(run):
    """Real routing is not balanced (max / mean received > 1 somewhere), and the dispatcher's sizes still
    equal the schedule's as means over the ranks."""
    results = run[1]
    imbalances = [results[s].imbalance for s in SPECS if results[s].imbalance is not None]
    assert imbalances and max(imbalances) > 1.0
    assert all(results[s].op_diffs == [] for s in SPECS)


def test_wrong_permutation_and_wrong_combine_fail_and_name_the_tensors(run):
    results = run[1]
    for spec in CONTROLS:
        r = results[spec]
        assert not r.ok, spec
        names = {m["tensor"] for m in r.mismatches}
        assert {"loss", "logits"} <= names, spec
        assert any(".experts." in n for n in names) and any(".router." in n for n in names), spec
        assert r.op_diffs == [], spec  # the same collectives: only the numbers are wrong


def test_cli_check_on_an_moe_scenario(run, tmp_path, capsys):
    """`meshsim validate --check` on the MoE scenario, from this spawn's results: exit 1 (the controls),
    every default variant ok, the controls named."""
    from meshsim.sim.cli.main import main

    path = tmp_path / "results.json"
    path.write_text(json.dumps(run[0]))
    with pytest.raises(SystemExit) as exc:
        main(["validate", MIXTRAL, "--check", "--nproc", "4", "--variants", ",".join(SPECS + CONTROLS),
              "--from-results", str(path)])
    assert exc.value.code == 1
    out = capsys.readouterr().out
    assert f"{len(SPECS)} of {len(SPECS) + len(CONTROLS)} variants pass" in out
    assert "wrong_permute: loss differs on rank" in out or "wrong_permute: logits differs on rank" in out
    assert "MoE routing" in out
