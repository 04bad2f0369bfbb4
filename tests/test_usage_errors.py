"""Usage errors and malformed machine-written inputs: one line with the fix, exit 2, no traceback, for
every command (click's own errors included), every `--nodes`, every `--from-results` and every JSON
input's nesting limit (results, profiles, traces, sweep store)."""

from __future__ import annotations

import json

import pytest

from meshsim.sim.cli.main import main
from meshsim.sim.sweep.store import JSONL_NAME, read_store

USAGE = {
    "--nodes abc": (["collective", "--nodes", "abc"], "--nodes"),
    "--nodes abc names the value": (["collective", "--nodes", "abc"], "'--nodes': 'abc' is not valid"),
    "--nodes=abc names the value": (["collective", "--nodes=abc"], "'--nodes': 'abc' is not valid"),
    "collective --nodes 0": (["collective", "--nodes", "0"], "--nodes"),
    "topologies --nodes 0": (["topologies", "--show", "dgx-h100", "--nodes", "0"], "--nodes"),
    "topologies --nodes -3": (["topologies", "--show", "dgx-h100", "--nodes", "-3"], "--nodes"),
    "unknown option": (["run", "--bogus"], "--bogus"),
    "unknown command": (["swep", "x"], "did you mean 'sweep'?"),
    "extra argument": (["run", "a", "b"], "extra argument"),
    "missing value": (["sweep", "tiny-2gpu", "--tp"], "--tp"),
}


def _one_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], err
    return lines[0]


@pytest.mark.parametrize("case", list(USAGE))
def test_usage_errors_are_one_line_with_the_fix(case, capsys):
    args, needle = USAGE[case]
    code = main(args)
    assert needle in _one_line(code, capsys.readouterr().err)


FROM_RESULTS = {"ranks without fields": '[{"rank": 0}, {"rank": 1}]',
                "strings for timings": '[{"rank": 0, "step_s": "fast", "timed": 3, "backend": "gloo"}, {"rank": 1}]',
                "not entries": "[1, 2]", "empty": "[]"}


@pytest.mark.parametrize("command", ["validate", "check", "calibrate"])
@pytest.mark.parametrize("case", list(FROM_RESULTS))
def test_from_results_with_malformed_content_is_one_line(case, command, tmp_path, capsys):
    pytest.importorskip("torch")
    results = tmp_path / "results.json"
    results.write_text(FROM_RESULTS[case])
    (tmp_path / "p.yaml").write_text("name: p\n")
    args = {"validate": ["validate", "tiny-2gpu", "--profile", tmp_path / "p.yaml", "--out", tmp_path / "o"],
            "check": ["validate", "tiny-2gpu", "--check"],
            "calibrate": ["calibrate", "tiny-2gpu", "--out", tmp_path / "p2.yaml"]}[command]
    code = main([str(a) for a in [*args, "--nproc", "2", "--from-results", results]])
    assert "--from-results" in _one_line(code, capsys.readouterr().err)


def test_the_nesting_limit_holds_for_traces_and_store_lines(tmp_path, capsys):
    deep = "[" * 40 + "]" * 40
    trace = tmp_path / "rank0.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "name": "k", "args": {"a": ' + deep + "}}]}")
    assert "Nested more than 32" in _one_line(main(["trace", "summary", str(trace)]), capsys.readouterr().err)
    out = tmp_path / "out"
    out.mkdir()
    (out / JSONL_NAME).write_text(json.dumps({"key": "k"})[:-1] + ', "x": ' + deep + "}\n")
    read = read_store(out)
    assert read.records == {} and len(read.problems) == 1 and "nested more than 32" in read.problems[0]
    profile = tmp_path / "prof.yaml"
    profile.write_text("name: p\nmeasured_on: " + deep + "\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    assert "Nested more than 32" in _one_line(main(["run", str(scenario), "--outputs", "none"]),
                                              capsys.readouterr().err)


SCENARIO = """name: t
model: {layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1024}
topology: {preset: dgx-h100}
parallel: {gpus: 2, tp: 2, micro_batch: 2, global_batch: 4}
hardware: {profile: prof.yaml}
"""


def test_a_fix_never_suggests_an_empty_set_or_an_empty_range(tmp_path, capsys):
    """pp x vp must divide 7 layers at vp 3: no pp does (the message said `use pp in {}`)."""
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("layers: 2", "layers: 7").replace("hardware: {profile: prof.yaml}\n", "")
                    .replace("gpus: 2, tp: 2,", "gpus: 4, tp: 1, pp: 4, vp: 3,"))
    line = _one_line(main(["run", str(path)]), capsys.readouterr().err)
    assert "{}" not in line and "no pp fits" in line, line


def test_a_file_name_is_quoted_whole_and_other_values_are_cut():
    from meshsim.sim.core.errors import QUOTE_CHARS, FilePath, UserError
    long_path = "/tmp/" + "d" * 200 + "/bad.json"
    named = str(UserError("trace", FilePath(long_path), "give the trace file"))
    assert repr(long_path) in named and "\n" not in named
    cut = str(UserError("trace", long_path, "give the trace file"))  # a plain string: cut (negative control)
    assert repr(long_path) not in cut and repr(long_path)[: QUOTE_CHARS - 3] + "..." in cut
