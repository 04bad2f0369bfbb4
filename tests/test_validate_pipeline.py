"""Pipeline parallelism on gloo (issue 9 item 8): 1F1B and interleaved stages equal the single-process
reference (every micro-batch's loss and logits on the last stage, every parameter gradient on every
stage), each rank's P2P calls counted at torch.distributed equal its stage schedule's op by op, and the
two pipeline negative controls fail naming what differs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario  # noqa: E402
from meshsim.sim.schedule.shapes import ModelDims  # noqa: E402
from meshsim.validate.numerics.check import check_numerics, make_variant  # noqa: E402
from meshsim.validate.stack.pipeline import stage_params  # noqa: E402
from meshsim.validate.stack.shard import full_shapes  # noqa: E402

pytestmark = pytest.mark.slow
GOOD2 = ["pp2+tp+gelu+tied", "pp2+vp2+nooverlap+tp+swiglu+gqa"]
FAULTY2 = ["pp2+tp+gelu+tied+swap_p2p", "pp2+tp+gelu+drop_mb_grad"]
GOOD4 = ["pp2+sp+swiglu+gqa", "pp4+dp1+vp2+tp+swiglu+tied", "pp4+dp1+tp+gelu"]


@pytest.fixture(scope="module")
def world2():
    sc, src = load_scenario("tiny-2gpu")
    return {r.name: r for r in check_numerics(sc, src, 2, GOOD2 + FAULTY2)}


@pytest.fixture(scope="module")
def world4():
    sc, src = load_scenario("tiny-2gpu")
    return {r.name: r for r in check_numerics(sc, src, 4, GOOD4)}


def _expected_checks(spec: str, nproc: int) -> int:
    """Per rank: its stage's parameter gradients; on the last stage also m losses and m logits."""
    from meshsim.sim.schedule.pipeline_layout import pipeline_layout

    sc, src = load_scenario("tiny-2gpu")
    v = make_variant(sc, spec, nproc, src).scenario
    d = ModelDims.from_scenario(v)
    layout = pipeline_layout(v.parallel, d.layers)
    names = list(full_shapes(d))
    per_stage = [len(stage_params(names, chunks, d.tied)) for chunks in layout]
    per_stage[-1] += 2 * d.micro_batches
    return sum(per_stage) * nproc // v.parallel.pp


def test_layouts_of_the_variants():
    sc, src = load_scenario("tiny-2gpu")
    p = make_variant(sc, "pp2+sp+swiglu+gqa", 4, src).scenario.parallel
    assert (p.tp, p.pp, p.dp, p.vp, p.sp) == (2, 2, 1, 1, True)
    s = make_variant(sc, "pp4+dp1+vp2+tp+swiglu+tied", 4, src).scenario
    assert (s.parallel.tp, s.parallel.pp, s.parallel.vp, s.model.layers) == (1, 4, 2, 8)
    assert s.parallel.global_batch // s.parallel.micro_batch == 8  # m = 2 pp micro-batches


@pytest.mark.parametrize("spec", GOOD2)
def test_world2_pipelines_match_the_reference(world2, spec):
    r = world2[spec]
    assert r.ok, (r.errors, r.mismatches[:3])
    assert r.checked == _expected_checks(spec, 2)
    assert r.op_diffs == []


@pytest.mark.parametrize("spec", GOOD4)
def test_world4_pipelines_match_the_reference(world4, spec):
    r = world4[spec]
    assert r.ok, (r.errors, r.mismatches[:3])
    assert r.checked == _expected_checks(spec, 4)
    assert r.op_diffs == []


def test_swapped_p2p_order_is_caught_by_the_counts(world2):
    r = world2["pp2+tp+gelu+tied+swap_p2p"]
    assert r.op_diffs
    assert "counted recv from rank 1" in r.op_diffs[0] and "schedule send to rank 1" in r.op_diffs[0]


def test_dropped_micro_batch_gradient_fails_numerics(world2):
    r = world2["pp2+tp+gelu+drop_mb_grad"]
    assert not r.ok
    assert r.mismatches and all(m["tensor"].endswith(".grad") for m in r.mismatches)
    assert {m["rank"] for m in r.mismatches} == {0, 1}  # every stage dropped it
