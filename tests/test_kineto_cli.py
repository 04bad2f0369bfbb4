"""`meshsim trace summary`, `meshsim calibrate --from-trace`, `meshsim compare --trace`, `meshsim run --profile`."""

from __future__ import annotations

import json

import pytest

from meshsim.scenarios.load import load_scenario, resolve
from meshsim.scenarios.profile import HardwareProfile, load_profile
from meshsim.sim.cli.main import main
from meshsim.sim.kineto.calibrate import profile_from_trace
from meshsim.sim.kineto.ranks import load_ranks, summaries
from meshsim.sim.schedule.builder import build_schedule
from tests.kineto_traces import TWO_RANK, one_step, write


def test_trace_summary_writes_every_step_and_collective(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["trace", "summary", str(TWO_RANK), "--json", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    assert [s["step"] for s in doc["steps"]] == [4, 5, 6]
    assert {r["op"] for r in doc["collectives"]} == {"all_reduce", "broadcast"}
    assert all(r["busbw_GBps"] > 0 for r in doc["collectives"])
    assert set(doc["mean_step"]["critical_path_s"]) >= {"cpu_bound", "gpu_compute_bound"}
    text = capsys.readouterr().out
    assert "Collectives by size" in text and "ProfilerStep" not in text.split("\n")[0]


@pytest.mark.parametrize("content", ["not json", '{"traceEvents": [{"ph": "X"'])
def test_trace_summary_bad_input_exits_2_with_one_line(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["trace", "summary", str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err


def test_trace_summary_missing_path_and_empty_folder(tmp_path, capsys):
    assert main(["trace", "summary", str(tmp_path / "nope.json"), "--no-progress"]) == 2
    assert main(["trace", "summary", str(tmp_path), "--no-progress"]) == 2
    assert "holds no .json" in capsys.readouterr().err


def test_calibrate_from_trace_writes_samples_and_old_profiles_still_load(tmp_path, capsys):
    trace = write(tmp_path / "t.json", one_step())
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--from-trace", str(trace), "--scenario", "tiny-2gpu", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.measured_on["source"] == "trace"
    assert profile.collective_table and all(p.samples == 1 for p in profile.collective_table)
    point = profile.collective_table[0]
    assert (point.op, point.ranks, point.nbytes) == ("all_reduce", 2, 4 << 20)
    assert point.time_us == pytest.approx(500.0) and point.busbw_gbps == pytest.approx((4 << 20) / 500e-6 / 1e9)
    assert profile.gemm_table and all(g.samples is not None for g in profile.gemm_table)
    old = HardwareProfile.model_validate({"name": "old", "gemm_table": [{"m": 1, "n": 1, "k": 1, "tflops": 1.0}]})
    assert old.gemm_table[0].samples is None and old.samples == {}
    assert main(["run", "tiny-2gpu", "--profile", str(out), "--outputs", "none"]) == 0


def test_gemm_time_is_shared_out_over_the_schedules_gemms(tmp_path):
    """No recorded shape matches the schedule's: every simulated shape gets the rate FLOPs / GEMM time."""
    ranks = load_ranks([write(tmp_path / "t.json", one_step())])
    sc, source = load_scenario("tiny-2gpu")
    schedule = build_schedule(resolve(sc, source))
    profile = profile_from_trace(ranks, summaries(ranks, critical=False), schedule, "p", "tiny-2gpu")
    flops = sum(op.work.flops for op in schedule.ops if type(op.work).__name__ == "Gemm")
    assert {round(g.tflops, 9) for g in profile.gemm_table} == {round(flops / 100e-6 / 1e12, 9)}


def test_compare_refuses_a_trace_of_another_structure(tmp_path, capsys):
    """Negative control: a ResNet trace (no attention, 7 collectives per step) against a transformer."""
    assert main(["compare", "tiny-2gpu", "--trace", str(TWO_RANK), "--out", str(tmp_path / "c")]) == 2
    captured = capsys.readouterr()
    assert "disagree on structure" in captured.err and "collectives per step" in captured.err
    assert "Structure" in captured.out and (tmp_path / "c" / "compare_trace.html").is_file()
    doc = json.loads((tmp_path / "c" / "compare_trace.json").read_text())
    assert doc["rows"] == [] and doc["structure_issues"]


def test_compare_needs_two_results_or_a_trace(capsys):
    assert main(["compare", "a.json"]) == 2
    assert "with --trace" in capsys.readouterr().err


def test_compare_reads_the_scenario_from_a_results_file(tmp_path, capsys):
    assert main(["run", "tiny-2gpu", "--out", str(tmp_path / "r"), "--outputs", "results"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "r" / "results.json"), "--trace", str(TWO_RANK)]) == 2
    out = capsys.readouterr().out
    assert "Structure: tiny-2gpu against traced rank 0" in out
