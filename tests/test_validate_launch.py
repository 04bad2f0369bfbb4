"""The launcher: results come back per rank; a failing, never-joining or hung rank is named; the worker
entry point runs under torchrun's environment variables."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from meshsim.validate.launch.launch import PRELOAD, TASKS, LaunchError, host_store, launch, start_method  # noqa: E402

pytestmark = pytest.mark.slow


def test_results_per_rank():
    out = launch("selftest", {}, 2, timeout_s=30)
    assert out == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]  # all-reduce of rank+1 over 2 ranks


def test_the_rendezvous_port_is_held_from_its_pick_to_the_end_of_the_launch():
    """The launcher serves the store on the port the OS gave it; no other process can take that port between
    its pick and the workers' joining (a free port picked, released, and bound later by rank 0 sometimes
    was, on a busy machine)."""
    store = host_store(2, 5.0)
    port = store.port
    with socket.socket() as sock, pytest.raises(OSError):
        sock.bind(("127.0.0.1", port))
    del store  # negative control: released, the same port binds
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_workers_fork_from_a_server_that_imported_every_task():
    assert start_method() == "forkserver"  # Linux; spawn only where the platform has no fork server
    assert {"torch", *(target.split(":")[0] for target in TASKS.values())} <= set(PRELOAD)


def test_failing_rank_is_named():
    with pytest.raises(LaunchError, match=r"rank 1: RuntimeError: deliberate failure on rank 1"):
        launch("selftest", {"fail_rank": 1}, 2, timeout_s=30)


def test_rank_that_never_joins_is_named():
    with pytest.raises(LaunchError, match=r"rank\(s\) \[1\] never joined the process group"):
        launch("selftest", {"absent_rank": 1}, 2, timeout_s=2)


def test_hung_rank_is_named():
    with pytest.raises(LaunchError, match=r"rank\(s\) \[1\] still running \(hung"):
        launch("selftest", {"hang_rank": 1, "hang_s": 60}, 2, timeout_s=2)


STOPPED_WORKER = """
import json, multiprocessing, sys
from meshsim.validate.launch.launch import LaunchError, launch
try:
    launch("selftest", {"signal_rank": 1, "signal": sys.argv[1]}, 2, timeout_s=10)
    message = None
except LaunchError as err:
    message = str(err)
print(json.dumps({"message": message, "children": len(multiprocessing.active_children())}))
"""


@pytest.mark.parametrize("sig, blamed", [
    ("SIGSTOP", r"^rank\(s\) \[1\] stopped responding \(no heartbeat"),
    ("SIGKILL", r"^rank 1 was killed by SIGKILL; rank\(s\) \[0\] (failed while waiting for them|were waiting "
                r"for them and were stopped)"),
    ("SIGABRT", r"^rank 1 was killed by SIGABRT \(in selftest_task, launch\.py:\d+\); rank\(s\) \[0\] "),
])
def test_stopped_or_killed_worker_is_named_and_every_worker_stopped(sig, blamed):
    """A SIGSTOPped rank (heartbeat goes stale) or a SIGKILLed one is named, the rank waiting for it is not
    called hung, and no worker survives. Before the heartbeat a stopped rank was found only after
    2 x timeout + 30 s and then never killed; the subprocess timeout bounds the whole run generously."""
    done = subprocess.run([sys.executable, "-c", STOPPED_WORKER, sig], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["message"] is not None and re.search(blamed, report["message"]), report
    assert report["children"] == 0


def test_a_crash_after_the_results_is_reported_and_the_results_stand(capsys):
    """A rank that aborts once rank 0 has written every rank's result (as gloo's teardown once did in CI)
    cannot change them: launch returns them and names the crash, with its Python frame, on stderr."""
    out = launch("selftest", {"teardown_signal_rank": 1, "signal": "SIGABRT"}, 2, timeout_s=30)
    assert out == [{"rank": 0, "sum": 3.0}, {"rank": 1, "sum": 3.0}]
    err = capsys.readouterr().err
    assert re.search(r"rank 1 was killed by SIGABRT \(in _spawn_entry, launch\.py:\d+\) after every rank's "
                     r"result was gathered", err), err


def test_launch_failure_is_one_line_and_exit_1(monkeypatch, capsys):
    from meshsim.sim.cli.main import main
    from meshsim.validate.launch import launch as launch_module

    def failing(*args, **kwargs):
        raise LaunchError("rank(s) [1] stopped responding (no heartbeat for 30 s: stopped or frozen)")

    monkeypatch.setattr(launch_module, "launch", failing)
    assert main(["validate", "--check", "tiny-2gpu", "--variants", "tp+gelu+mha+none"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["error: rank(s) [1] stopped responding (no heartbeat for 30 s: stopped "
                                        "or frozen)"]


def test_nproc_3_blames_nproc_not_an_unpassed_variants_value(capsys):
    from meshsim.sim.cli.main import main

    assert main(["validate", "--check", "tiny-2gpu", "--nproc", "3"]) == 2
    err = capsys.readouterr().err
    assert "--nproc = 3" in err and "--variants" not in err.split("Fix:")[0] and "Traceback" not in err


def test_worker_entry_under_torchrun(tmp_path):
    payload = tmp_path / "p.json"
    payload.write_text("{}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "meshsim.validate.launch.launch", "selftest", str(payload), "--out", str(tmp_path / "res")]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert json.loads((tmp_path / "res" / "results.json").read_text()) == [{"rank": 0, "sum": 3.0},
                                                                            {"rank": 1, "sum": 3.0}]
