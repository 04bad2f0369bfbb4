"""First contact (issue 43, section 2): a misspelt GPU is answered with its own generation; tables never
break a word, at 80 columns they stack; `meshsim run` takes scenario overrides (--set) and says so when
given a sweep flag; the sweep table shows every layout degree that makes its row add up, says what MFU is
measured against for FP8 / NVFP4 rows, and says when the scenario's sweep: block multiplies with a flag.
"""

from __future__ import annotations

import re

import pytest
from rich.console import Console
from rich.text import Text

from meshsim.sim.cli.main import main
from meshsim.sim.cli.sweep import print_results
from meshsim.sim.core.console import Column, fitted_table
from meshsim.sim.core.errors import closest
from meshsim.sim.sweep.axes import block_axes_swept, configurations, sweep_axes
from meshsim.sim.sweep.record import SweepRecord
from meshsim.topologies.gpus import GPUS


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ----- did you mean: the same family first ------------------------------------------------------------
@pytest.mark.parametrize(("typed", "meant"), [("h100-80gb", "h100-sxm"), ("h200-141gb", "h200-sxm"),
                                              ("b200-sxm5", "b200"), ("H100", "h100-sxm"), ("a100", "a100-80gb"),
                                              ("a100-80", "a100-80gb"), ("gb200-nvl", "gb200")])
def test_a_misspelt_gpu_is_answered_with_its_own_family(typed, meant):
    assert closest(typed, GPUS) == meant


def test_the_scenario_names_the_suggestion(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodel: {layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1024}\n"
                    "hardware: {gpu: h100-80gb}\ntopology: {preset: dgx-h100}\n"
                    "parallel: {gpus: 2, tp: 2, micro_batch: 2, global_batch: 4}\n")
    assert main(["run", str(path), "--outputs", "none"]) == 2
    assert "did you mean 'h100-sxm'?" in one_error_line(capsys)


# ----- tables: words stay whole -----------------------------------------------------------------------
def _render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_a_table_too_wide_for_its_kept_columns_stacks_instead_of_breaking_words():
    """The `validate --check` table at 80 columns printed 'resul t' and 'tensor s' (rich folded the headers
    of columns squeezed below their width); now each row is a block of 'header value' lines."""
    columns = (Column("variant", "left", keep=True), Column("result", "left", keep=True), Column("tensors", keep=True),
               Column("collectives /step", keep=True), Column("vs schedule", "left", keep=True))
    rows = [["mixtral-8x7b-h100-ep8 ep=8 etp=1 alltoall dispatcher", Text("ok"), "1234", "96", "same"],
            ["ep8-allgather-dispatcher-with-overlap-and-long-name", Text("FAIL"), "1234", "96", "12 differ (ignored)"]]
    table, note = fitted_table("numerics vs single process", columns, rows, 80)
    text = _render(table)
    assert note == "" and max(map(len, text.splitlines())) <= 80
    words = set(text.split())
    for word in ("result", "tensors", "collectives", "/step", "ep8-allgather-dispatcher-with-overlap-and-long-name",
                 "FAIL", "(ignored)"):
        assert word in words, text
    assert not re.search(r"\bresul\b|\btensor\b", text)


def test_a_table_that_fits_is_still_a_table():
    """Negative control: the stacked form only when the kept columns cannot fit."""
    columns = (Column("name", "left", keep=True), Column("value", keep=True))
    table, _ = fitted_table("t", columns, [["a", "1"], ["b", "2"]], 80)
    assert "┃ name" in _render(table)


# ----- meshsim run --set ------------------------------------------------------------------------------
def test_run_takes_overrides_checked_like_the_file(tmp_path, capsys):
    assert main(["run", "tiny-2gpu", "--set", "parallel.tp=1", "--set", "parallel.sp=false", "--outputs",
                 "results", "--out", str(tmp_path)]) == 0
    assert "tiny-2gpu  tp=1 pp=1 sp=off dp=2" in capsys.readouterr().out
    assert '"tp": 1' in (tmp_path / "results.json").read_text()


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "parallel.tpp=2"], "Unknown field parallel.tpp. Fix: did you mean parallel.tp?"),
    (["--set", "parallel.tp=3"], "parallel.tp = 3 is invalid. tp exceeds the 2 GPUs used"),
    (["--set", "parallel.tp=abc"], "parallel.tp = 'abc' is invalid"),
    (["--set", "parallel.tp"], "Not a KEY=VALUE override"),
    (["--set", "parallel.tp=1", "--set", "parallel.tp=2"], "The same field is set twice"),
    (["--set", "parallel.tp=[1"], "--set parallel.tp"),
    (["--tp", "4"], "No such option: --tp"),
])
def test_bad_overrides_are_one_line_naming_the_key(args, needle, capsys):
    assert main(["run", "tiny-2gpu", "--outputs", "none", *args]) == 2
    assert needle in one_error_line(capsys)


def test_a_sweep_flag_on_run_names_the_override():
    from meshsim.sim.cli.main import usage_line

    class Ctx:
        command_path = "meshsim run"

        class command:  # noqa: N801 - click's attribute
            name = "run"
            commands = None

    class Usage(Exception):
        ctx = Ctx

        def format_message(self):
            return "No such option: --tp (Possible options: --out, --outputs, --set)"

    line = usage_line(Usage(), ["run", "x", "--tp", "4"])
    assert "Fix: set a scenario field with --set parallel.tp=VALUE" in line


# ----- the sweep table --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_records() -> list[SweepRecord]:
    """llama3-8b-h100-fp8 (cp 2 on 8 GPUs, not swept) at tp 1 and 2, bf16 and FP8: four real records."""
    from meshsim.scenarios.load import load_scenario
    from meshsim.sim.sweep.record import run_point

    scenario, source = load_scenario("llama3-8b-h100-fp8")
    points = configurations(sweep_axes(scenario, {"tp": "1,2", "fp8": "off,tensorwise", "sp": "on"}))
    return [run_point(scenario, source, p) for p in points]


def test_a_cp_that_is_not_swept_is_still_shown(fp8_records):
    """tp 1 x cp 2 x dp 4 = 8 GPUs: without the cp column the row reads tp=1, dp=4 on 8 GPUs."""
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_results(fp8_records, [], title="t", console=console)
    header = next(line for line in console.export_text().splitlines() if "┃ tp" in line)
    assert [cell.strip() for cell in header.split("┃")][1:6] == ["", "tp", "pp", "sp", "cp"]


def test_the_sweep_says_what_mfu_is_measured_against_for_fp8_rows(fp8_records):
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_results(fp8_records, [], title="t", console=console)
    assert "MFU is on the GPU's dense 16-bit peak, also for the tensorwise rows" in console.export_text()
    bf16 = [r for r in fp8_records if r.result["fp8"] == "off"]
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_results(bf16, [], title="t", console=console)
    assert "16-bit peak" not in console.export_text()  # negative control


def test_a_flag_beside_the_sweep_block_says_what_else_it_sweeps(capsys, monkeypatch):
    """gpt-13b-a100-1node's sweep: block sweeps tp and sp; --dist-opt-instances 1,2 multiplies with both."""
    from meshsim.scenarios.load import load_scenario

    scenario, _ = load_scenario("gpt-13b-a100-1node")
    assert block_axes_swept(scenario, {"dist_opt_instances": "1,2"}) == ["tp", "sp"]
    assert block_axes_swept(scenario, {"tp": "2", "sp": "on"}) == []
    assert block_axes_swept(scenario, {}) == []  # the block alone is the sweep: nothing to say
    import meshsim.sim.cli.sweep as sweep_cli

    monkeypatch.setattr(sweep_cli, "run_sweep", lambda *a, **k: (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        main(["sweep", "gpt-13b-a100-1node", "--dist-opt-instances", "1,2", "--no-progress"])
    out = capsys.readouterr().out
    assert ("note: 14 configurations: the scenario's sweep: block also sweeps tp 1, 2, 4, 8; sp off, on; pin them "
            "with --tp VALUE, --sp VALUE") in " ".join(out.split())
