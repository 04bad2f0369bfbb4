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
