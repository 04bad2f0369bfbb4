"""Nothing stale, nothing outside: a sweep computes every configuration from the bytes its digest
describes (referenced files edited mid-sweep), and its store refuses symlinks and directories instead of
writing through them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from meshsim.scenarios.load import load_scenario
from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import UserError
from meshsim.sim.sweep.axes import SweepAxes, configurations
from meshsim.sim.sweep.record import run_point
from meshsim.sim.sweep.runner import JSONL_NAME, run_sweep
from meshsim.sim.sweep.store import LOCK_NAME

NODE = """name: two-gpu
gpu: h100-sxm
gpus_per_node: 2
devices: [{name: g0, kind: gpu}, {name: g1, kind: gpu}, {name: sw, kind: nvswitch}]
links:
  - {src: g0, dst: sw, bw_gbps: BW, latency_us: LAT, kind: nvlink}
  - {src: g1, dst: sw, bw_gbps: BW, latency_us: LAT, kind: nvlink}
"""
SCENARIO = {
    "name": "edited", "model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024},
    "topology": {"file": "node.yaml"}, "parallel": {"tp": 2, "micro_batch": 1, "global_batch": 4},
}
POINTS = configurations(SweepAxes((2,), (False, True), (1, 2), (False,), ("none",)))


def _write_node(folder: Path, bw_gbps: int) -> None:
    """bw_gbps 450 (the original) or 45 (the edit: 10x slower links, 10x their latency)."""
    latency_us = 0.5 * 450 / bw_gbps
    (folder / "node.yaml").write_text(NODE.replace("BW", str(bw_gbps)).replace("LAT", str(latency_us)))


def _step_times(records) -> dict[str, tuple[float, float]]:
    """Per configuration: (step time, TP communication busy time) (this tiny step is host-bound, so the
    links' speed shows in the second)."""
    return {r.key: (r.result.step_time_s, r.result.breakdown_s["tp_comm_busy"]) for r in records if r.ok}


@pytest.fixture
def edited(tmp_path):
    _write_node(tmp_path, 450)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    return load_scenario(str(tmp_path / "s.yaml"))


def test_a_file_edited_mid_sweep_never_lands_under_the_old_digest(tmp_path, edited):
    """The topology is edited after the first configuration; every record must still be the original
    content's (a clean sweep), and a resume after reverting the file reuses them all, correctly."""
    scenario, source = edited
    clean = _step_times(run_sweep(scenario, source, POINTS, progress=False))
    _write_node(tmp_path, 45)
    slower = _step_times(run_sweep(scenario, source, POINTS, progress=False))
    assert all(slower[k][1] > clean[k][1] for k in clean) and len(clean) == len(POINTS)  # negative control: the edit moves every figure
    _write_node(tmp_path, 450)

    calls: list[str] = []

    def editing_runner(*args):
        calls.append(args[2].key)
        record = run_point(*args)
        _write_node(tmp_path, 45)  # between configurations: the next one would read the edit
        return record

    out = tmp_path / "out"
    assert _step_times(run_sweep(scenario, source, POINTS, out_dir=out, progress=False, runner=editing_runner)) == clean
    _write_node(tmp_path, 450)  # revert, resume: nothing to rerun, and what is reused is right
    calls.clear()
    assert _step_times(run_sweep(scenario, source, POINTS, out_dir=out, progress=False, runner=editing_runner)) == clean
    assert calls == []
    _write_node(tmp_path, 45)  # the edited content has its own digest: all rerun, none reused
    assert _step_times(run_sweep(scenario, source, POINTS, out_dir=out, progress=False)) == slower


def test_a_file_deleted_mid_sweep_is_still_read_from_the_snapshot(tmp_path, edited):
    scenario, source = edited

    def deleting_runner(*args):
        record = run_point(*args)
        (tmp_path / "node.yaml").unlink(missing_ok=True)
        return record

    records = run_sweep(scenario, source, POINTS, progress=False, runner=deleting_runner)
    assert all(r.ok for r in records)


def _bad_store(kind: str, out: Path, outside: Path) -> None:
    out.mkdir()
    if kind == "jsonl-symlink":
        (outside / "elsewhere.jsonl").write_text("")
        (out / JSONL_NAME).symlink_to(outside / "elsewhere.jsonl")
    elif kind == "dangling-lock":
        (out / LOCK_NAME).symlink_to(outside / "created-by-the-lock")
    elif kind == "jsonl-directory":
        (out / JSONL_NAME).mkdir()
    elif kind == "lock-directory":
        (out / LOCK_NAME).mkdir()
    elif kind == "report-symlink":
        (out / "report.html").symlink_to(outside / "report-outside.html")


@pytest.mark.parametrize("kind", ["jsonl-symlink", "dangling-lock", "jsonl-directory", "lock-directory",
                                  "report-symlink"])
def test_store_files_that_are_symlinks_or_directories_are_refused(kind, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    _bad_store(kind, out, outside)
    before = sorted(os.listdir(outside)), [p.stat().st_size for p in outside.iterdir()]
    code = main(["sweep", "tiny-2gpu", "--tp", "1,2", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert "symlink" in lines[0] or "directory" in lines[0], lines[0]
    assert (sorted(os.listdir(outside)), [p.stat().st_size for p in outside.iterdir()]) == before


def test_the_store_refuses_before_any_configuration_runs(tmp_path):
    from meshsim.sim.sweep.store import append_record, read_store

    out = tmp_path / "out"
    _bad_store("dangling-lock", out, tmp_path)
    with pytest.raises(UserError, match="symlink"):
        read_store(out)
    scenario, source = load_scenario("tiny-2gpu")
    record = run_point(scenario, source, POINTS[0])
    with pytest.raises(UserError, match="symlink"):
        append_record(out, record)
    assert not (tmp_path / "created-by-the-lock").exists()


@pytest.mark.parametrize("name", ["results.json", "trace.json", "timeline.html"])
def test_run_never_writes_through_a_link_in_its_output_folder(name, tmp_path, capsys):
    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    out.mkdir()
    (out / name).symlink_to(outside)
    code = main(["run", "tiny-2gpu", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "symlink" in err, err
    assert not outside.exists()


@pytest.mark.parametrize("case", ["calibrate-symlink", "calibrate-dangling", "calibrate-directory",
                                  "validate-profile-symlink", "validate-trace-symlink", "validate-trace-directory"])
def test_validate_and_calibrate_outputs_refuse_links_and_directories(case, tmp_path, capsys):
    """The files validate / calibrate write (calibrate's profile, validate's profile.yaml and traces in
    --out) are refused, in one line and before any measurement, when they are links or directories."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    command, bad = case.split("-", 1)
    name = {"calibrate": "profile.yaml", "validate": "profile.yaml"}[command]
    if bad.startswith("trace"):
        name, bad = "trace_merged.json", bad.split("-", 1)[1]
    target = out / name
    if bad == "symlink":
        target.symlink_to(outside / "victim")
    elif bad == "dangling":
        target.symlink_to(outside / "created")
    else:
        target.mkdir()
    args = (["calibrate", "tiny-2gpu", "--nproc", "2", "--out", str(target)] if command == "calibrate"
            else ["validate", "tiny-2gpu", "--nproc", "2", "--out", str(out)])
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert "symlink" in lines[0] or "directory" in lines[0], lines[0]
    assert sorted(os.listdir(outside)) == ["victim"] and (outside / "victim").read_text() == "keep"


@pytest.mark.parametrize("writer", ["results", "trace", "page"])
def test_output_writers_refuse_a_link_made_after_the_checks(writer, tmp_path):
    """The checks run before the work; a link put in the output folder while a run computes is refused at
    the write itself (O_NOFOLLOW), and what it points at is left as it was."""
    from meshsim.sim.engine.events import Event
    from meshsim.sim.outputs.plotly_page import write_page
    from meshsim.sim.outputs.step_report import write_results_json
    from meshsim.sim.outputs.trace import write_trace

    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    ev = Event(0, 0, "L0.fwd.qkv", "compute", "compute", "fwd", 0, 0, 0.0, 1e-3)
    with pytest.raises(UserError, match="symlink"):
        if writer == "results":
            from meshsim.scenarios.load import resolve
            from meshsim.sim.results.simulate import simulate

            scenario, source = load_scenario("tiny-2gpu")
            write_results_json(simulate(resolve(scenario, source)), link)
        elif writer == "trace":
            write_trace(link, [ev])
        else:
            write_page(link, {"data": [], "layout": {}}, 100)
    assert victim.read_text() == "keep"
    plain = tmp_path / "plain.json"
    write_trace(plain, [ev])  # the negative control: a plain path is written
    assert plain.read_text().startswith('{"traceEvents":[')
