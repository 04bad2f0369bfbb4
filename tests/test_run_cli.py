"""`meshsim run` / `meshsim scenarios` end to end on the tiny built-in scenario, and simulate() itself."""

from __future__ import annotations

import json

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.cli.main import main
from meshsim.sim.results.error_band import error_band
from meshsim.sim.results.simulate import simulate, simulate_with_events
from meshsim.sim.results.step_result import StepResult

TINY = "tiny-2gpu"


def tiny(**overrides):
    scenario, source = load_scenario(TINY)
    return resolve(with_overrides(scenario, overrides, source), source)


def test_run_writes_the_three_files_and_keeps_others(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["run", TINY, "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    for name in ("results.json", "trace.json", "timeline.html"):
        assert (out / name).stat().st_size > 0 and str(out / name) in printed
    assert (out / "notes.txt").read_text() == "keep me"
    data = json.loads((out / "results.json").read_text())
    assert data == json.loads((tmp_path / "r.json").read_text())
    assert data["scenario"] == TINY and data["tp"] == 2 and data["step_time_s"] > 0
    assert "traceEvents" in json.loads((out / "trace.json").read_text())
    assert "MFU" in printed
    band = error_band(tiny())  # the model's error beside the headline figures, from the generated band file
    assert " ".join(f"model's error {band.sentence()}".split()) in " ".join(printed.split())


def test_memory_verdict_is_styled_not_printed_as_markup(tmp_path, capsys):
    """The memory table's 'total (fits)' is a styled cell: no rich markup tag reaches the terminal."""
    assert main(["run", TINY, "--out", str(tmp_path), "--outputs", "none"]) == 0
    printed = capsys.readouterr().out
    assert "total (fits)" in printed and "[green]" not in printed and "[/green]" not in printed


def test_run_no_html(tmp_path):
    assert main(["run", TINY, "--out", str(tmp_path), "--no-html"]) == 0
    assert (tmp_path / "results.json").exists() and not (tmp_path / "timeline.html").exists()


@pytest.mark.parametrize("scenario", ["no-such-scenario", "BAD_YAML"])
def test_bad_scenario_is_one_line_exit_2(tmp_path, capsys, scenario):
    if scenario == "BAD_YAML":
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: bad\nmodel: {layers: 0, hidden: 8, heads: 1, seq_len: 8, vocab: 8}\n"
                       "topology: {preset: dgx-h100}\nparallel: {global_batch: 1}\n")
        scenario = str(bad)
    assert main(["run", scenario, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_scenarios_lists_builtins(capsys):
    assert main(["scenarios"]) == 0
    assert TINY in capsys.readouterr().out


def test_collapsed_and_explicit_ranks_agree_on_a_real_scenario():
    rs = tiny(**{"parallel.gpus": 4})  # tp 2 x dp 2: the explicit mode simulates 4 ranks with rendezvous
    collapsed, explicit = simulate(rs), simulate(rs, explicit_ranks=True)
    assert (collapsed.simulated_ranks, explicit.simulated_ranks) == (1, 4)
    assert explicit.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-9)


def test_simulate_result_is_consistent_with_its_event_log():
    result, log, schedule = simulate_with_events(tiny())
    assert result.step_time_s == max(e.end_s for e in log.events)
    assert len(log.events) == len(schedule.ops)
    assert sum(seg.dur_us for seg in result.critical_path) == pytest.approx(result.step_time_s * 1e6, rel=1e-9)
    assert sum(result.critical_path_share.values()) == pytest.approx(1.0)
    b = result.breakdown_s
    assert b["compute_busy"] + b["exposed_comm"] + b["nothing_running"] == pytest.approx(result.step_time_s, rel=1e-9)
    assert b["compute_waiting"] == pytest.approx(b["exposed_tp_comm"] + b["exposed_dp_comm_only"] + b["nothing_running"])
    assert StepResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert {c.op for c in result.collectives} <= {"all_reduce", "all_gather", "reduce_scatter"}


def test_measured_collective_table_replaces_the_model():
    from dataclasses import replace

    from meshsim.scenarios.profile import CollectivePoint, HardwareProfile

    measured_us = 50.0  # the same measured time at both ends of the size range: every call takes it
    points = [CollectivePoint(op="all_reduce", ranks=2, nbytes=n, time_us=measured_us, algbw_gbps=1, busbw_gbps=1)
              for n in (1, 1 << 30)]
    result, log, _ = simulate_with_events(replace(tiny(), profile=HardwareProfile(name="m", collective_table=points)))
    comm = [e for e in log.events if e.stream == "tp_comm"]
    assert comm and all(e.dur_s == pytest.approx(measured_us * 1e-6, rel=1e-9) for e in comm)
    assert {c.source for c in result.collectives} == {"calibrated"}
