"""Numerics at world size 2 (one spawn of two gloo processes for every check in this file): the whole
variant matrix equals the single-process reference, its collectives equal the schedule's, and the two
negative controls fail naming what differs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario  # noqa: E402
from meshsim.sim.schedule.shapes import ModelDims  # noqa: E402
from meshsim.validate.numerics.check import check_numerics, default_specs, make_variant  # noqa: E402
from meshsim.validate.stack.shard import full_shapes  # noqa: E402

pytestmark = pytest.mark.slow
NEGATIVE = ["tp+gelu+swap_fg", "sp+swiglu+no_ln_allreduce"]
# The schedule (sim/schedule/builder.py) has no all-reduce of replicated KV-head gradients yet; validate issues one
# (without it the replicas' gradients are wrong). Until the builder adds it, this is the only difference.


@pytest.fixture(scope="module")
def results():
    sc, src = load_scenario("tiny-2gpu")
    out = check_numerics(sc, src, 2, default_specs(2) + NEGATIVE)
    return {r.name: r for r in out}


def test_every_variant_matches_the_reference(results):
    sc, src = load_scenario("tiny-2gpu")
    for spec in default_specs(2):
        r = results[spec]
        assert r.ok, (spec, r.errors, r.mismatches[:3])
        if spec.startswith("pp"):
            continue  # pipeline variants compare per stage (tests/test_validate_pipeline.py)
        params = len(full_shapes(ModelDims.from_scenario(make_variant(sc, spec, 2, src).scenario)))
        assert r.checked == 2 * (params + 2), spec  # loss, logits and every parameter gradient, both ranks


def test_collectives_equal_the_schedule(results):
    for spec in default_specs(2):
        r = results[spec]
        assert r.op_diffs == [], spec
        if spec.startswith("pp"):
            continue  # tp = 1 on two stages of two processes: no KV replica group
        # GQA with kv_heads < tp: the replicated K/V gradients are summed over the KV group, in both
        kv = [c for c in r.calls if c["group"] == "kv"]
        assert [c["name"] for c in kv] == (["opt.kv_grad"] if "gqa" in spec else []), spec


def test_per_layer_counts_match_megatron(results):
    # tp without SP: per layer 2 all-reduces forward (g after attention and MLP), 2 backward (f)
    calls = results["tp+gelu+mha+none"].calls
    for layer in (0, 1):
        for phase in ("fwd", "bwd"):
            ops = [c["op"] for c in calls if c["name"].startswith(f"L{layer}.mb0.{phase}.")]
            assert ops == ["all_reduce", "all_reduce"], (layer, phase)
    # SP: forward all-gather + reduce-scatter per block; backward adds the re-gather; full recompute reruns fwd
    calls = results["sp+gelu+mha+full"].calls
    bwd = [c["op"] for c in calls if c["name"].startswith("L0.mb0.bwd.")]
    assert sorted(bwd) == sorted(["all_gather"] * 4 + ["reduce_scatter"] * 2)
    rec = [c["op"] for c in calls if c["name"].startswith("L0.mb0.recompute.")]
    assert sorted(rec) == sorted(["all_gather", "reduce_scatter"] * 2)


def test_swapped_f_and_g_fail_and_name_the_tensors(results):
    r = results["tp+gelu+swap_fg"]
    assert not r.ok
    names = {m["tensor"] for m in r.mismatches}
    assert {"loss", "logits"} <= names
    assert all(m["max_abs_err"] > 1e-3 for m in r.mismatches)
    assert {m["rank"] for m in r.mismatches} == {0, 1}


def test_missing_ln_allreduce_fails_only_on_sp_region_params(results):
    r = results["sp+swiglu+no_ln_allreduce"]
    assert not r.ok
    names = {m["tensor"] for m in r.mismatches}
    assert names and all(n.split(".")[-3] in ("ln1", "ln2", "final_ln") for n in names), names
    assert any(d.startswith("opt.ln_grad") for d in r.op_diffs)


def test_bf16_against_a_float64_reference_passes_and_can_fail():
    """bf16: the parallel step in bf16 against a float64 reference from the same rounded weights, within
    5% of each tensor's largest value: real variants pass, the negative controls fail."""
    sc, src = load_scenario("tiny-2gpu")
    specs = ["sp+swiglu+gqa+full", "tp+gelu+mha+selective", "sp+gelu+mha+none+no_ln_allreduce",
             "tp+gelu+mha+none+swap_fg"]
    out = {r.name: r for r in check_numerics(sc, src, 2, specs, dtype="bfloat16")}
    assert out["sp+swiglu+gqa+full"].ok and out["tp+gelu+mha+selective"].ok
    assert not out["sp+gelu+mha+none+no_ln_allreduce"].ok and not out["tp+gelu+mha+none+swap_fg"].ok
    worst = out["sp+gelu+mha+none+no_ln_allreduce"].mismatches[0]
    assert worst["max_abs_err"] > 0.05 * worst["max_abs_ref"]
