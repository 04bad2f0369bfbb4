"""The `meshsim` entry point: user errors and usage errors exit 2 with a message and no traceback."""

from __future__ import annotations

import pytest

from meshsim.sim.cli.main import main


@pytest.mark.parametrize("argv, needle", [
    (["run", "tiny-2gpu", "--bogus"], "No such option"),
    (["sweep"], "Missing argument"),
    (["collective", "--topology", "dgx-h10"], "did you mean 'dgx-h100'"),
    (["collective", "--topology", "dgx-h100", "--max-bytes", "8Q"], "--max-bytes"),
    (["run", "no-such-scenario.yaml"], "no-such-scenario.yaml"),
    (["sweep", "tiny-2gpu", "--tp", "3x"], "--tp"),
])
def test_bad_input_exits_2_without_traceback(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


def test_a_good_command_exits_0(capsys):
    assert main(["topologies"]) == 0
    assert "dgx-h100" in capsys.readouterr().out


def test_the_program_flushes_its_output_and_runs_exit_handlers(tmp_path):
    """cli() skips the interpreter's teardown (os._exit), not what exit owes: the report in full, the files,
    the exit status and atexit handlers (which may still print)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as piped
    code = ("import atexit, sys; atexit.register(lambda: print('handler ran')); "
            "from meshsim.sim.cli.main import cli; sys.argv = ['meshsim', *sys.argv[1:]]; cli()")
    done = subprocess.run([sys.executable, "-c", code, "run", "tiny-2gpu", "--out", str(tmp_path / "o"),
                           "--outputs", "results"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "handler ran" and lines[-2].startswith("results: ")
    assert json.loads((tmp_path / "o" / "results.json").read_text())["step_time_s"] > 0
    bad = subprocess.run([sys.executable, "-c", code, "run", "no-such.yaml"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2 and "no-such.yaml" in bad.stderr and bad.stdout == "handler ran\n"


def test_a_profiled_program_still_writes_its_profile(tmp_path):
    """With a profiler set, cli() exits the ordinary way: `python -m cProfile` reports after it returns."""
    import subprocess
    import sys

    out = tmp_path / "p.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "meshsim.sim.cli.main",
                           "topologies"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "dgx-h100" in done.stdout and out.stat().st_size > 0
