"""Numerics at world size 4 (one spawn): tp 4 with GQA replication (kv 2 < tp 4), SP and recompute,
and tp 2 x dp 2 (gradients averaged over the DP group)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario  # noqa: E402
from meshsim.validate.numerics.check import check_numerics  # noqa: E402

pytestmark = pytest.mark.slow
SPECS = ["dp1+sp+swiglu+gqa+full", "dp1+tp+gelu+mha+selective", "dp1+sp+gelu+gqa+none",
         "dp2+sp+swiglu+gqa+full", "dp2+tp+gelu+mha+none"]


@pytest.fixture(scope="module")
def results():
    sc, src = load_scenario("tiny-2gpu")
    return {r.name: r for r in check_numerics(sc, src, 4, SPECS + ["dp1+tp+gelu+swap_fg"])}


def test_world4_variants_match_the_reference(results):
    for spec in SPECS:
        assert results[spec].ok, (spec, results[spec].errors, results[spec].mismatches[:3])


def test_world4_collectives(results):
    for spec in SPECS:
        diffs = [d for d in results[spec].op_diffs if "KV replica group" not in d]
        assert diffs == [], spec
    dp = [c for c in results["dp2+tp+gelu+mha+none"].calls if c["group"] == "dp"]
    assert [(c["name"], c["op"], c["ranks"]) for c in dp] == [("dp.bucket0.all_reduce", "all_reduce", 2)]
    tp4 = [c for c in results["dp1+tp+gelu+mha+selective"].calls if c["group"] == "tp"]
    assert {c["ranks"] for c in tp4} == {4}


def test_world4_negative_control(results):
    r = results["dp1+tp+gelu+swap_fg"]
    assert not r.ok and {m["rank"] for m in r.mismatches} == {0, 1, 2, 3}


def test_cli_check_exit_status_and_message(capsys):
    from meshsim.sim.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["validate", "tiny-2gpu", "--check", "--nproc", "2", "--variants", "tp+gelu,tp+gelu+swap_fg"])
    assert exc.value.code == 1
    out = capsys.readouterr().out
    assert "swap_fg:" in out and "differs on rank" in out
    assert "1 of 2 variants pass" in out
