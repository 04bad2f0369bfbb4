"""The launcher: results come back per rank; a failing, never-joining or hung rank is named; the worker
entry point runs under torchrun's environment variables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from meshsim.validate.launch.launch import LaunchError, launch  # noqa: E402

pytestmark = pytest.mark.slow


def test_results_per_rank():
    out = launch("selftest", {}, 2, timeout_s=30)
    assert out == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]  # all-reduce of rank+1 over 2 ranks


def test_failing_rank_is_named():
    with pytest.raises(LaunchError, match=r"rank 1: RuntimeError: deliberate failure on rank 1"):
        launch("selftest", {"fail_rank": 1}, 2, timeout_s=30)


def test_rank_that_never_joins_is_named():
    with pytest.raises(LaunchError, match=r"rank\(s\) \[1\] never joined the process group"):
        launch("selftest", {"absent_rank": 1}, 2, timeout_s=2)


def test_hung_rank_is_named():
    with pytest.raises(LaunchError, match=r"rank\(s\) \[1\] still running \(hung"):
        launch("selftest", {"hang_rank": 1, "hang_s": 60}, 2, timeout_s=2)


def test_worker_entry_under_torchrun(tmp_path):
    payload = tmp_path / "p.json"
    payload.write_text("{}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "meshsim.validate.launch.launch", "selftest", str(payload), "--out", str(tmp_path / "res")]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert json.loads((tmp_path / "res" / "results.json").read_text()) == [{"rank": 0, "sum": 3.0},
                                                                            {"rank": 1, "sum": 3.0}]
