"""validate / calibrate stopped by SIGTERM or Ctrl-C (SIGINT to the whole process group, as a terminal
sends it): one line, exit 128 + signal, no temporary folder and no worker left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

STARTUP_TIMEOUT_S = 240  # generous: only a bound on waiting for the workers to start, never asserted


def _workers_started(tmp: Path) -> bool:
    return any(p.name.startswith("joined.") for d in tmp.glob("meshsim-validate-*") for p in d.iterdir())


@pytest.mark.parametrize("command, signum", [(["validate", "tiny-2gpu", "--nproc", "2"], signal.SIGTERM),
                                             (["calibrate", "tiny-2gpu", "--nproc", "2"], signal.SIGINT)])
def test_a_signal_stops_validate_with_one_line_and_leaves_nothing(command, signum, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "meshsim.sim.cli.main", *command, "--out", str(tmp_path / "o")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _workers_started(tmp) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # Ctrl-C: the whole foreground group, workers included
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=STARTUP_TIMEOUT_S)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 128 + signum, err
    assert len(lines) == 1 and lines[0].startswith(f"error: interrupted by {signum.name}"), err
    assert list(tmp.glob("meshsim-validate-*")) == []
    for _ in range(100):  # the workers are stopped; multiprocessing's resource tracker exits just after
        leftover = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not leftover:
            break
        time.sleep(0.1)
    assert leftover == [], leftover  # no worker of its process group outlives it
