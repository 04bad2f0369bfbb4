"""Results a person reads at a glance: widths, units, a breakdown that adds up, not-fit exit status,
files before the report, the output switch, the timeline's zoom and hover (issue 12)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from meshsim.sim.cli.main import main
from meshsim.sim.core import fmt
from meshsim.sim.core.errors import EXIT_DOES_NOT_FIT

TINY = "tiny-2gpu"


# ----- one formatter per quantity ----------------------------------------------------------------------
def test_formatters():
    assert fmt.fmt_bytes(57360 * 1024) == "56 MiB" and fmt.fmt_bytes(112 * 2**20) == "112 MiB"
    assert fmt.fmt_bytes(20_000_000 * 1024) == "19.1 GiB" and fmt.fmt_bytes(512) == "512 B"
    assert fmt.fmt_bytes_range(56 * 2**20, 112 * 2**20) == "56 MiB-112 MiB"
    assert fmt.fmt_gb_as_gib(80 * 2**30 / 1e9) == "80 GiB"
    unit, col = fmt.time_column([0.1487, 1.01])  # one unit per column: never '148.7 ms' next to '1.01 s'
    assert unit == "s" and [col(0.1487), col(1.01)] == ["0.149", "1.010"]
    assert fmt.fmt_count(103105.3) == "103,105" and fmt.fmt_gbps(369.4) == "369 GB/s"
    assert fmt.fmt_duration_long(1e12 / 71_600) == "161.6 days"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ----- widths ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [80, 120])
def test_run_and_scenarios_fit_the_terminal(width, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["run", TINY, "--out", str(tmp_path)]) == 0
    assert main(["scenarios"]) == 0
    text = capsys.readouterr().out
    # every line fits, except the written paths (printed whole, to be copied)
    assert max(len(line) for line in text.splitlines() if str(tmp_path) not in line) <= width
    for header in ("op", "group", "algo/proto", "size", "busbw GB/s", "name", "topology", "tp", "pp", "sp"):
        assert re.search(rf"[┃|] {re.escape(header)} +[┃|]|[┃|] +{re.escape(header)} [┃|]", text), header


@pytest.mark.parametrize("width", [80, 120])
def test_sweep_table_keeps_the_key_columns(width, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["sweep", TINY, "--tp", "1,2", "--sp", "both", "--jobs", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= width
    header = next(line for line in text.splitlines() if "tokens/s" in line and "┃" in line)
    cells = [c.strip() for c in header.strip("┃ ").split("┃")]
    assert cells[:2] == ["tp", "pp"] and {"sp", "dp", "tokens/s", "MFU", "fits"} <= set(cells)
    assert [c for c in cells if c.startswith("step (")] in (["step (s)"], ["step (ms)"], ["step (us)"])
    first_table = text[:text.index("└")]  # the results; the critical-path table follows
    rows = [line for line in first_table.splitlines() if line.startswith("│")]
    assert len(rows) == 3 and all(row.split("│")[2].strip() in {"1", "2"} for row in rows)  # tp readable; tp=1 sp=on skipped
    assert [row.split("│")[1].strip() for row in rows].count("*") == 1  # the sweet spot, marked without colour
    assert ("not shown at 80 columns" in text) == (width == 80)


# ----- the breakdown ----------------------------------------------------------------------------------
def test_report_breakdown_adds_up_and_shows_the_waiting_compute_stream(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["run", TINY, "--outputs", "none"]) == 0
    text = capsys.readouterr().out
    assert "The rows above add up to the step; the streams below run at the same time" in text.replace("\n", " ")
    section = text[text.index("step along the critical path"):text.index("busy time per stream")]
    rows = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"│ ([a-zA-Z ]+?) +│ +([\d.]+) │", section)}
    step = rows.pop("step")
    assert sum(rows.values()) == pytest.approx(step, abs=0.002 * len(rows))
    assert "compute stream waiting" in text and "while TP comm runs" in text and "idle" not in text


# ----- not fitting ------------------------------------------------------------------------------------
def test_a_configuration_that_does_not_fit_is_unmistakable(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "o"
    code = main(["run", "llama2-70b-h100-1node", "--out", str(out), "--outputs", "results"])
    text = capsys.readouterr().out
    assert code == EXIT_DOES_NOT_FIT == 3
    assert text.lstrip().startswith("╭") and "DOES NOT FIT" in text.split("\n")[1]
    assert json.loads((out / "results.json").read_text())["fits"] is False
    assert main(["run", "llama2-70b-h100-1node", "--outputs", "none", "--allow-oom"]) == 0


# ----- files -----------------------------------------------------------------------------------------
def test_outputs_switch_and_paths_printed(tmp_path, capsys):
    assert main(["run", TINY, "--out", str(tmp_path / "n"), "--outputs", "none"]) == 0
    assert not (tmp_path / "n").exists()
    assert main(["run", TINY, "--out", str(tmp_path / "r"), "--outputs", "results", "--tokens", "1T"]) == 0
    text = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["results.json"]
    assert f"results: {tmp_path / 'r' / 'results.json'}" in text.replace("\n", "")
    assert "1,000,000,000,000 tokens take" in text and "HFU" in text
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    gpu_hours = round(1e12 / data["tokens_per_s"] * data["gpus"] / 3600)  # time x GPUs, closed form
    assert f"on {data['gpus']} GPUs: {gpu_hours:,} GPU-hours" in text.replace("\n", "")
    assert "critical_path" not in data and data["critical_path_top"]
    assert main(["run", TINY, "--out", str(tmp_path / "f"), "--outputs", "results", "--full-critical-path"]) == 0
    assert json.loads((tmp_path / "f" / "results.json").read_text())["critical_path"]
    assert main(["run", TINY, "--outputs", "some"]) == 2


def test_files_are_written_even_when_the_reader_leaves_early(tmp_path):
    out = tmp_path / "o"
    cmd = f"{sys.executable} -m meshsim.sim.cli.main run {TINY} --out {out} | head -3"
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    assert len(done.stdout.splitlines()) == 3 and "Traceback" not in done.stderr
    # the program's own status: 0 and nothing on stderr (click alone turns the broken pipe into status 1)
    proc = subprocess.Popen([sys.executable, "-m", "meshsim.sim.cli.main", "run", TINY, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves after one line, like `| head -1`
    assert proc.wait(timeout=120) == 0 and proc.stderr.read() == b""
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "timeline.html", "trace.json"]


# ----- the timeline ----------------------------------------------------------------------------------
def test_timeline_opens_on_one_layer_with_collective_hover():
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.outputs.timeline import timeline_figure
    from meshsim.sim.results.simulate import simulate

    result = simulate(load_and_resolve(TINY), explicit_ranks=True)
    fig = timeline_figure(result.events, result.critical_path, "t", result)
    lo, hi = fig.layout.xaxis.range
    layer = [e for e in result.events if e.rank == 0 and e.layer == 1 and e.phase == "fwd" and e.micro_batch == 0]
    assert lo <= min(e.start_s for e in layer) * 1e3 and hi >= max(e.end_s for e in layer) * 1e3
    assert hi - lo < 0.5 * result.step_time_s * 1e3 and fig.layout.xaxis.rangeslider.visible
    hovers = [t for trace in fig.data if trace.hovertext is not None for t in trace.hovertext]
    comm = [t for t in hovers if "all_reduce" in t]
    assert comm and all(re.search(r"all_reduce \w+/\w+ on tp\[2\], [\d.]+ (KiB|MiB|B), busbw [\d.]+ GB/s", t)
                        for t in comm)
    assert any(" critical" in t for t in hovers) and not any(" MB" in t for t in hovers)
    assert list(fig.layout.yaxis.ticktext)[:2] == ["rank 0 (tp 0, dp 0, node 0) · compute",
                                                    "rank 0 (tp 0, dp 0, node 0) · tp_comm"]
