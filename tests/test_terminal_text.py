"""User text on the terminal: a name with control characters, escape sequences or rich markup prints
literally, escaped, in every command that echoes it (run, sweep, compare, topologies --show, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from meshsim.sim.cli.main import main
from meshsim.sim.core.text import plain, user_text

HOSTILE = "x[/bold]y[red]\x1b[31mz\x07\u202e\x9b"  # markup, an ANSI colour, BEL, a bidi override, a C1 CSI
TINY = {
    "model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024},
    "topology": {"preset": "dgx-h100"}, "parallel": {"gpus": 2, "tp": 2, "micro_batch": 2, "global_batch": 4},
}
NODE = {"gpu": "h100-sxm", "gpus_per_node": 2, "description": HOSTILE,
        "devices": [{"name": "g0", "kind": "gpu"}, {"name": "g1", "kind": "gpu"}, {"name": "sw", "kind": "nvswitch"}],
        "links": [{"src": g, "dst": "sw", "bw_gbps": 450, "latency_us": 0.5, "kind": "nvlink"} for g in ("g0", "g1")]}


def test_plain_makes_every_control_character_visible():
    assert plain("a\x1b[31mb\x07\u202e\x9b") == "a\\x1b[31mb\\x07\\u202e\\x9b"
    assert plain("a\nb\tc") == "a\\x0ab\\x09c" and plain("a\nb", keep_layout=True) == "a\nb"
    assert plain("café 日本 ü") == "café 日本 ü"  # printable text is untouched
    assert user_text("x[/bold]y") == "x\\[/bold]y"


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": HOSTILE, **TINY}))
    return path


def _assert_clean(out: str) -> None:
    assert not any(c in out for c in "\x1b\x07\u202e\x9b"), repr(out)
    assert "x[/bold]y[red]" in out, out  # the markup printed literally


def _commands(tmp_path: Path) -> dict[str, list]:
    scenario = _scenario(tmp_path)
    (tmp_path / "node.yaml").write_text(yaml.safe_dump({"name": HOSTILE, **NODE}))
    results = tmp_path / "r.json"
    return {"run": ["run", scenario, "--out", tmp_path / "o"],
            "sweep": ["sweep", scenario, "--tp", "1,2", "--no-progress", "--jobs", "1"],
            "compare": ["compare", results, results],
            "topologies": ["topologies", "--show", tmp_path / "node.yaml"]}


@pytest.mark.parametrize("command", ["run", "sweep", "compare", "topologies"])
def test_names_print_literally_without_control_characters(command, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    args = _commands(tmp_path)
    if command == "compare":
        assert main(["run", str(_scenario(tmp_path)), "--out", str(tmp_path / "o"), "--outputs", "results"]) == 0
        data = json.loads((tmp_path / "o" / "results.json").read_text())
        (tmp_path / "r.json").write_text(json.dumps({**data, "scenario": HOSTILE}))
        capsys.readouterr()
    code = main([str(a) for a in args[command]])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    _assert_clean(captured.out + captured.err)


def test_an_error_line_echoes_user_text_escaped(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "n", **TINY, "parallel": {**TINY["parallel"], "tp": HOSTILE}}))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and not any(c in err for c in "\x1b\x07\u202e\x9b"), repr(err)
