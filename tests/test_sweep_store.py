"""The sweep store never loses a record: different scenarios in one --out, concurrent sweeps, edited
referenced files, corrupt lines, SIGTERM / SIGKILL of a parallel sweep (no orphaned workers)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.sweep.axes import SweepAxes, SweepPoint, configurations, scenario_digest
from meshsim.sim.sweep.record import SweepRecord, run_point
from meshsim.sim.sweep.runner import JSONL_NAME, read_records, run_sweep

POINTS = configurations(SweepAxes((1, 2, 4), (False,), (1,), (False,), ("none",)))
SUBPROCESS_TIMEOUT_S = 300  # generous bounds on subprocess sweeps; no duration is asserted
calls: list[str] = []


def fake_runner(scenario, source, point: SweepPoint, digest: str = "", files=None) -> SweepRecord:
    """A complete ok record whose figures come from the point (no simulation): the record of a real run of
    tiny-2gpu at tp 1 (computed once) with its step time and throughput replaced."""
    calls.append(point.key)
    data = _template().to_json()
    data.update(key=point.key, config=asdict(point), scenario_digest=digest)
    data["result"] = {**data["result"], "step_time_s": 1.0 / point.tp, "tokens_per_s": 1000.0 * point.tp}
    return SweepRecord.from_json(data)


@functools.cache
def _template() -> SweepRecord:
    scenario, source = load_scenario("tiny-2gpu")
    return run_point(scenario, source, POINTS[0], "")


def sweep(scenario, source, out: Path, points=POINTS) -> list[dict]:
    calls.clear()
    return run_sweep(scenario, source, points, out_dir=out, progress=False, runner=fake_runner,
                     warn=lambda message: None)


@pytest.fixture
def tiny():
    return load_scenario("tiny-2gpu")


def test_other_scenarios_in_one_out_keep_their_records(tmp_path, tiny):
    """Sweeping B (or A with a new description) into A's --out used to rewrite sweep.jsonl without A."""
    scenario, source = tiny
    other = with_overrides(scenario, {"model.layers": 3}, source)
    renamed = scenario.model_copy(update={"description": "same model, new words"})
    for sc in (scenario, other, renamed):
        sweep(sc, source, tmp_path)
        assert len(calls) == len(POINTS)
    sweep(scenario, source, tmp_path)
    assert calls == []  # A's records survived both other sweeps
    for sc in (scenario, other, renamed):
        records, problems = read_records(tmp_path / JSONL_NAME, scenario_digest(sc, source))
        assert list(records) == [p.key for p in POINTS] and problems == []


def test_editing_a_referenced_file_invalidates_its_records(tmp_path):
    """The digest covers the content of topology.file and hardware.profile, not their paths."""
    example = Path(__file__).parents[1] / "docs" / "examples" / "custom-topology.yaml"
    (tmp_path / "node.yaml").write_text(example.read_text())
    (tmp_path / "profile.yaml").write_text("name: p\ngpu: {peak_tflops: 500}\n")
    scenario_path = tmp_path / "s.yaml"
    scenario_path.write_text(yaml.safe_dump({
        "name": "custom", "model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024},
        "hardware": {"profile": "profile.yaml"}, "topology": {"file": "node.yaml"},
        "parallel": {"tp": 1, "global_batch": 8}}))
    scenario, source = load_scenario(scenario_path)
    out = tmp_path / "out"
    sweep(scenario, source, out)
    sweep(scenario, source, out)
    assert calls == []
    for name, edit in (("node.yaml", lambda t: t.replace("description:", "description: edited")),
                       ("profile.yaml", lambda t: t.replace("500", "400"))):
        path = tmp_path / name
        path.write_text(edit(path.read_text()))
        sweep(scenario, source, out)
        assert calls == [p.key for p in POINTS], name  # nothing reused after the edit


def test_corrupt_lines_are_reported_and_skipped(tmp_path, tiny):
    """A valid JSON line without `result` used to make every later resume fail with a traceback."""
    scenario, source = tiny
    sweep(scenario, source, tmp_path)
    log = tmp_path / JSONL_NAME
    lines = log.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["result"]
    bad = [json.dumps(broken), "[1, 2, 3]", '{"key": 5}', "\x00garbage", lines[2][:10]]
    log.write_text("\n".join([lines[0], *bad]))  # the last line is unterminated, as a killed writer leaves it
    warnings: list[str] = []
    calls.clear()
    records = run_sweep(scenario, source, POINTS, out_dir=tmp_path, progress=False, runner=fake_runner,
                        warn=warnings.append)
    assert calls == [POINTS[1].key, POINTS[2].key]
    assert [r.key for r in records] == [p.key for p in POINTS]
    assert len(warnings) == len(bad) and all("skipped" in w for w in warnings)
    assert "line 2: not a sweep record" in warnings[0]
    text = log.read_text()
    assert text.startswith("\n".join([lines[0], *bad]) + "\n")  # nothing deleted, the cut line was ended


CONCURRENT = """
import sys
from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.sweep.axes import SweepAxes, configurations
from meshsim.sim.sweep.runner import run_sweep
scenario, source = load_scenario("tiny-2gpu")
scenario = with_overrides(scenario, {"model.layers": int(sys.argv[2])}, source)
points = configurations(SweepAxes((1, 2), (False, True), (1, 2), (False, True), ("none", "full")))
run_sweep(scenario, source, points, out_dir=sys.argv[1], progress=False)
"""


def test_concurrent_sweeps_on_one_out_keep_every_record(tmp_path):
    """Two sweeps of different scenarios at once: both keep all their records (was 2 of 12)."""
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(tmp_path), str(layers)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for layers in (2, 3)]
    for proc in procs:
        _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        assert proc.returncode == 0, err
    scenario, source = load_scenario("tiny-2gpu")
    points = configurations(SweepAxes((1, 2), (False, True), (1, 2), (False, True), ("none", "full")))
    for layers in (2, 3):
        digest = scenario_digest(with_overrides(scenario, {"model.layers": layers}, source), source)
        records, problems = read_records(tmp_path / JSONL_NAME, digest)
        assert sorted(records) == sorted(p.key for p in points) and problems == []


def _children(pid: int) -> list[int]:
    """Live processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _gone(pids: list[int], within_s: float = 30.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and
                 Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _start_parallel_sweep(out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "meshsim.sim.cli.main", "sweep", "llama2-70b-h100-1node", "--tp", "1,2,4,8",
           "--sp", "both", "--recompute", "none,selective,full", "--micro-batch", "1,2", "--jobs", "2",
           "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    end = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while not (out / JSONL_NAME).exists() or not (out / JSONL_NAME).read_text().strip():
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.1)
    return proc


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_signal_stops_workers_and_keeps_finished_rows(tmp_path, sig):
    proc = _start_parallel_sweep(tmp_path)
    workers = _children(proc.pid)
    assert workers, "the sweep runs a process pool"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert _gone(workers), "a worker outlived the sweep"
    records, problems = read_records(tmp_path / JSONL_NAME)
    assert records and all(r.status in ("ok", "skipped") for r in records.values())
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM: ")
        # 4 tp x 2 sp x 3 recompute x 2 micro-batch = 48, less tp 1's six sp-on points (run as sp off)
        assert f"{len(records)} of 42 configurations kept" in err and problems == []
