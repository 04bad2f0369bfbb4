"""Output a person reads (issue 21): one test per class. Every table fits 80 columns with nothing cut;
a sweep's critical-path shares come from the one category list and add up to 100%; the sweet spot is a
character; a skipped configuration is one line; compare has one number format per row kind and human
labels; a nonzero percentage never reads 0%; titles, bar labels, the out-of-memory advice and the
timeline's opening window follow from the numbers and the settings."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from meshsim.sim.cli.main import main
from meshsim.sim.core.console import Column, fit_columns, fitted_table
from meshsim.sim.core.fmt import fmt_pct
from meshsim.sim.outputs.advice import memory_fixes
from meshsim.sim.results.critical_path import CATEGORY_NAMES
from meshsim.sim.sweep import explain as ex
from meshsim.sim.sweep import table as tb
from meshsim.sim.sweep.explain_terms import speed_delta
from tests.test_sweep import rec, skipped

ROOT = Path(__file__).resolve().parent.parent
BOX = "┃│┏┡└╭╰"  # characters that start a table (or panel) line


def _render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1] and line[0] in BOX]


def _assert_fits(text: str, width: int = 80, *, allow: str | None = None) -> None:
    """No line wider than `width` (but a printed path: whole, to be copied); no table cell or header cut."""
    lines = [line for line in text.splitlines() if allow is None or allow not in line]
    assert max(map(len, lines), default=0) <= width, max(lines, key=len)
    cut = [line for line in _table_lines(text) if "…" in line or "..." in line]
    assert cut == []


# ----- tables: one builder, and it never cuts -------------------------------------------------------
def _table_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Table"]


def test_every_table_is_built_by_fitted_table():
    """The class, not the examples: a table built elsewhere would not be fitted to the terminal."""
    files = [p for top in ("sim", "validate") for p in (ROOT / top).rglob("*.py")]
    built = {str(p.relative_to(ROOT)): _table_calls(p) for p in files}
    assert {name: lines for name, lines in built.items() if lines} == {"sim/core/console.py": built["sim/core/console.py"]}
    assert built["sim/core/console.py"]  # negative control: the checker sees the one in fitted_table


WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz/()%", min_size=1, max_size=12)


@settings(max_examples=30, deadline=None)
@given(headers=st.lists(st.lists(WORDS, min_size=1, max_size=3).map(" ".join), min_size=1, max_size=12),
       cells=st.lists(st.text(alphabet="0123456789,x-", min_size=1, max_size=9), min_size=12, max_size=12),
       keep=st.lists(st.booleans(), min_size=12, max_size=12))
def test_fitted_tables_fit_80_columns_and_cut_no_header(headers, cells, keep):
    columns = [Column(h, keep=k) for h, k in zip(headers, keep, strict=False)]
    rows = [[c for c, _ in zip(cells, columns, strict=False)]] * 3
    table, _ = fitted_table("title", columns, rows, 80)
    text = _render(table)
    shown = fit_columns(columns, rows, 80)
    natural = sum(max(max(map(len, columns[i].header.split())), len(cells[i])) + 3 for i in shown) + 1
    assert max(map(len, text.splitlines())) <= 80
    if natural <= 80:  # the columns shown fit at their natural widths (else only keep ones are left): nothing cut
        _assert_fits(text)
        header = [line.split("┃") for line in _table_lines(text) if line.startswith("┃")]
        for n, i in enumerate(shown):  # each column's header, read down its lines, is whole
            assert " ".join(line[n + 1].strip() for line in header).split() == columns[i].header.split()


def _sweep_output(capsys, monkeypatch, *argv) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["sweep", "tiny-2gpu", *argv, "--jobs", "1", "--no-progress"]) == 0
    return capsys.readouterr().out


def _two_results(tmp_path: Path) -> tuple[Path, Path]:
    """results.json of tiny-2gpu (tp 2) and of the same scenario at tp 1, pp 2."""
    text = (ROOT / "scenarios/library/tiny-2gpu.yaml").read_text()
    other = tmp_path / "tiny-pp2.yaml"
    other.write_text(text.replace("name: tiny-2gpu", "name: tiny-pp2").replace("  tp: 2\n", "  tp: 1\n  pp: 2\n"))
    for name, scenario in (("a", "tiny-2gpu"), ("b", str(other))):
        assert main(["run", scenario, "--out", str(tmp_path / name), "--outputs", "results"]) == 0
    return tmp_path / "a" / "results.json", tmp_path / "b" / "results.json"


def test_every_command_table_fits_80_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    a, b = _two_results(tmp_path)
    commands = [["topologies"], ["scenarios"], ["collective", "--topology", "dgx-h100", "--nodes", "2"],
                ["run", "tiny-2gpu", "--outputs", "none"], ["compare", str(a), str(b)],
                ["trace", "summary", str(ROOT / "tests/data/kineto/a100-2rank-nccl.json.gz"), "--no-progress",
                 "--no-critical-path"],
                ["sweep", "tiny-2gpu", "--tp", "1,2", "--pp", "1,2", "--jobs", "1", "--no-progress"]]
    capsys.readouterr()
    for argv in commands:
        assert main(argv) == 0, argv
        _assert_fits(capsys.readouterr().out, allow=str(tmp_path))


def test_validate_tables_fit_80_columns():
    """The --check variant table (long variant names stay whole, rows tell apart) and the cross-check."""
    from meshsim.validate.printing import print_crosscheck, print_numerics  # imports torch

    names = ["tp+gelu+mha+none", "sp+swiglu+gqa+selective", "sp+swiglu+gqa+full", "ep4+etp2+swiglu+gqa+selective"]
    results = [SimpleNamespace(name=n, ok=True, checked=24, mismatches=[], calls=[{"name": "L0.fwd.attn_out"}] * 12, op_diffs=[], errors=[],
                               imbalance=None) for n in names]
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert print_numerics(results, 2, "float32", console=console) == 0
    text = console.export_text()
    _assert_fits(text)
    assert all(any(n in line for line in _table_lines(text)) for n in names)  # whole: the rows differ
    share = {"simulated": 0.5, "measured": 0.4}
    report = {"scenario": "tiny", "simulated_step_s": 0.01, "measured_step_s": 0.011, "error_pct": -9.1,
              "numerics_ok": True, "simulated_serial_s": 0.012, "error_serial_pct": 9.0, "replayed_step_s": 0.0105,
              "categories": {c: {"simulated_s": 0.004, "measured_s": 0.005, "error_pct": -20.0}
                             for c in ("compute", "tp_comm", "dp_comm")},
              "critical_path_agreement": {"share": {c: share for c in ("compute", "tp_comm", "dp_comm")},
                                          "on_both": 10, "jaccard": 0.8}}
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_crosscheck(report, None, None, console=console)
    _assert_fits(console.export_text())


# ----- the sweep's critical path --------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10))
def test_whole_percents_add_up_to_100_within_one_point(shares):
    pcts = tb.whole_percents(shares)
    total = sum(shares)
    if total == 0:
        assert pcts == [0] * len(shares)
        return
    assert sum(pcts) == 100
    assert all(abs(p - 100 * s / total) < 1 for p, s in zip(pcts, shares, strict=True))


def _share_rows(text: str) -> list[list[str]]:
    block = text[text.index("critical path, % of each step"):]
    block = block[:block.index("└")]
    return [[c.strip() for c in line.strip("│").split("│")] for line in block.splitlines() if line.startswith("│")]


def test_sweep_shares_cover_every_category_and_add_up_to_100(capsys, monkeypatch):
    """pp > 1: the bubble and P2P columns are there, and each configuration's row adds up to 100%."""
    text = _sweep_output(capsys, monkeypatch, "--tp", "1,2", "--pp", "1,2")
    header = next(line for line in text.splitlines() if "bubble" in line and "┃" in line)
    assert {"compute", "TP", "DP", "waiting", "P2P", "bubble"} <= {c.strip() for c in header.split("┃")}
    rows = _share_rows(text)
    assert len(rows) == 4
    for row in rows:
        assert sum(int(c.rstrip("%")) for c in row if c.endswith("%")) == 100, row
    assert [row[0] for row in rows].count("*") == 1  # the sweet spot, by a character
    assert "compute waits" in text and "Critical path, % of each step (rows add up to 100%)" in text.replace("\n", " ")


def test_a_new_category_gets_a_column_from_the_one_list(monkeypatch):
    """Categories are read from CATEGORY_NAMES (and from the results), never listed in the table."""
    monkeypatch.setitem(CATEGORY_NAMES, "cp_comm", "CP communication")
    shares = {"compute": 0.5, "tp_comm": 0.2, "cp_comm": 0.2, "future_thing": 0.1}
    records = [rec(2, tokens=2.0, mem=10.0, shares=shares), rec(4, tokens=1.0, mem=10.0, shares=shares)]
    headers = [c.header for c in tb.share_columns(records)]
    assert headers[-4:] == ["compute", "TP", "CP", "future_thing"]  # the list's order, then the others
    assert [r[-4:] for r in tb.share_rows(records)][0] == ["50%", "20%", "20%", "10%"]
    assert "CP = exposed CP communication" in tb.share_legend(records)


def test_one_line_per_skipped_configuration_and_none_in_the_explanation(capsys, monkeypatch):
    text = _sweep_output(capsys, monkeypatch, "--tp", "1,2,3", "--sp", "both")
    lines = [line for line in text.splitlines() if line.startswith("skipped ")]
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines)  # tp 1 runs sp off: not skipped
    assert {line.split(":")[0] for line in lines} == {"skipped tp=3, sp=off", "skipped tp=3, sp=on"}
    explanation = " ".join(text[text.index("\n- "):].split())
    assert "skipped" not in explanation.replace("2 skipped", "")
    records = [rec(2, tokens=1000.0, mem=60.0), skipped(3)]
    assert not any("does not divide" in s for s in ex.explain(records))


# ----- compare ----------------------------------------------------------------------------------------
def test_compare_one_format_per_row_kind_and_human_labels(tmp_path):
    from meshsim.sim.sweep.compare import compare_files
    from meshsim.sim.sweep.compare_page import compared_cells

    cmp = compare_files(*_two_results(tmp_path))
    for key in ("headline", "categories"):
        unit, cells = compared_cells(cmp[key])
        by_kind: dict[str, set[int]] = {}  # kind -> the numbers of decimals its cells show
        for row, cell in zip(cmp[key], cells, strict=True):
            decimals = {len(c.split(".")[1]) if "." in c else 0 for c in cell[1:4] if c != "-"}
            by_kind.setdefault(row["kind"], set()).update(decimals)
            assert "_" not in row["name"], row["name"]  # people read names, programs read keys
        assert all(len(d) == 1 for d in by_kind.values()), by_kind
    names = [r["name"] for r in cmp["categories"]]
    assert {"critical path: exposed TP communication", "critical path: pipeline bubble", "step"} <= set(names)


# ----- wording from the numbers -----------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.floats(-2.0, 2.0, allow_nan=False), st.integers(0, 2), st.booleans())
def test_a_nonzero_percentage_never_reads_zero(fraction, decimals, signed):
    text = fmt_pct(fraction, decimals, signed=signed)
    assert text.endswith("%")
    if fraction != 0:
        assert re.search(r"[1-9]", text), (fraction, text)
    if signed and fraction > 0:
        assert text.startswith("+")


def test_speed_difference_wording():
    best = rec(8, tokens=1000.0, mem=10.0)
    assert speed_delta(rec(4, tokens=1000.7, mem=10.0), best) == "0.07% more tokens/s"
    assert speed_delta(rec(4, tokens=1000.0, mem=10.0), best) == "the same tokens/s"


def test_report_title_and_bars_follow_the_sweep():
    from meshsim.sim.sweep.report_page import BAR_PX, breakdown_figure, sweep_title

    records = [rec(tp, sp, tokens=1000.0 + tp, mem=10.0, mb=mb) for tp, sp, mb in
               itertools.product((1, 2, 4, 8, 16), (False, True), (1, 2, 4, 8))]
    assert len(records) == 40
    assert sweep_title(records, "m") == "tp x sp x mb sweep of m"
    assert sweep_title(records[:1], "m") == "1-configuration sweep of m"
    fig = breakdown_figure(records)
    labels = list(fig.data[0].y)
    assert len(set(labels)) == 40 and all(t.orientation == "h" for t in fig.data)
    assert fig.layout.height >= 40 * BAR_PX and fig.layout.yaxis.automargin
    assert fig.layout.xaxis.title.text == "step time (s)"  # the table's step column's unit


@pytest.mark.parametrize("recompute, sp, dist_opt, micro_batch, tp",
                         list(itertools.product(("none", "selective", "full"), (False, True), (False, True, None),
                                                (1, 4), (1, 8))))
def test_out_of_memory_advice_suggests_only_what_is_not_set(recompute, sp, dist_opt, micro_batch, tp):
    fixes = " | ".join(memory_fixes({"tp": tp, "pp": 1, "sp": sp, "recompute": recompute, "micro_batch": micro_batch,
                                     "gpus_per_node": 8, "distributed_optimizer": dist_opt}))
    assert ("recompute" in fixes) == (recompute != "full")
    assert ("full activation recompute" in fixes) == (recompute == "selective")
    assert ("sequence parallelism" in fixes) == (tp > 1 and not sp)
    assert ("distributed_optimizer: true" in fixes) == (dist_opt is False)
    assert ("smaller micro-batch" in fixes) == (micro_batch > 1)
    assert ("larger tp" in fixes) == (tp < 8)


def test_the_banner_does_not_suggest_recompute_when_it_is_on(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["run", "llama2-70b-h100-1node", "--outputs", "none", "--allow-oom"]) == 0
    banner = capsys.readouterr().out.split("╰")[0]
    assert "DOES NOT FIT" in banner and "recompute" not in banner.split("Try")[1]  # its recompute is full


def test_a_pipeline_timeline_opens_where_every_stage_is_busy():
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.outputs.timeline_zoom import ZOOM_MARGIN, pipeline_stages, zoom_range_ms
    from meshsim.sim.results.simulate import simulate

    sc, src = load_scenario("gpt-13b-a100-1node")
    result = simulate(resolve(with_overrides(sc, {"parallel.tp": 2, "parallel.pp": 4, "model.layers": 8}, src), src))
    events = list(result.events)
    stages = pipeline_stages(events)
    lo, hi = zoom_range_ms(events)
    pad = (hi - lo) * ZOOM_MARGIN / (1 + 2 * ZOOM_MARGIN)
    assert len(stages) == 4 and hi - lo < 0.5 * result.step_time_s * 1e3
    last_start = max(min(e.start_s for e in events if e.rank == r and e.category == "compute") for r in stages)
    assert lo + pad >= last_start * 1e3 - 1e-9  # past the warm-up

    def busy(r: int) -> float:  # fraction of the window the stage computes
        return sum(max(0.0, min(e.end_s * 1e3, hi - pad) - max(e.start_s * 1e3, lo + pad)) for e in events
                   if e.rank == r and e.category == "compute") / (hi - lo - 2 * pad)

    assert all(busy(r) > 0.5 for r in stages), [busy(r) for r in stages]
    warm_up = [e for e in events if e.rank == stages[0] and e.micro_batch == 0 and e.phase == "fwd"]
    assert lo + pad > max(e.end_s for e in warm_up) * 1e3  # negative control: not stage 0's first forward


def test_calibrate_names_a_clamped_kappa():
    pytest.importorskip("torch")
    from meshsim.validate.calibrate.interference import kappa_from_times, kappa_note

    faster = kappa_note(g_s=2e-3, c_s=3e-3, both_s=2.9e-3)
    assert kappa_from_times(2e-3, 3e-3, 2.9e-3) == 0.0
    assert "faster than the collective alone" in faster and "kappa is 0" in faster
    assert "faster than its longer part alone" in kappa_note(g_s=2e-3, c_s=1e-3, both_s=1.8e-3)
    assert "clamped to 1" in kappa_note(g_s=2e-3, c_s=1e-3, both_s=3.5e-3)
    assert "kappa 0.500" in kappa_note(g_s=2e-3, c_s=1e-3, both_s=2.5e-3)


def test_validate_check_table_at_80_columns_drops_nothing_it_needs():
    """All pass: no all-'-' worst-mismatch column, no 'not shown' note, one line per variant (the longest
    real names). One fails: its worst mismatch (tensor, rank, error) is printed at 80 columns."""
    from meshsim.validate.printing import print_numerics  # imports torch

    names = ["tp+gelu+mha+none", "pp2+vp2+nooverlap+tp+swiglu+gqa", "ep4+etp2+swiglu+gqa+selective"]

    def result(name, mismatches=()):
        return SimpleNamespace(name=name, ok=not mismatches, checked=47, mismatches=list(mismatches),
                               calls=[{"name": "L0.fwd.attn_out"}] * 13, op_diffs=[], errors=[], imbalance=None)

    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert print_numerics([result(n) for n in names], 2, "float32", console=console) == 0
    text = console.export_text()
    _assert_fits(text)
    assert "not shown" not in text
    rows = [line for line in _table_lines(text) if line.startswith("│")]
    assert len(rows) == len(names)  # no cell wraps onto a second line
    bad = {"tensor": "L1.mlp.fc2.weight.grad", "rank": 1, "max_abs_err": 0.25, "max_abs_ref": 1.0}
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert print_numerics([result(names[0]), result(names[1], [bad])], 2, "float32", console=console) == 1
    text = console.export_text()
    _assert_fits(text)
    assert "L1.mlp.fc2.weight.grad differs on rank 1: max|err| 0.25" in " ".join(text.split())


@pytest.mark.parametrize("ep, experts", [(8, 128), (16, 128), (128, 128), (1, 0), (8, 8)])
def test_out_of_memory_advice_offers_a_larger_ep_below_the_expert_count(ep, experts):
    fixes = " | ".join(memory_fixes({"tp": 1, "pp": 1, "recompute": "full", "gpus_per_node": 8, "ep": ep,
                                     "experts": experts}))
    assert (f"a larger ep (parallel.ep, now {ep}; up to the {experts} experts" in fixes) == (ep < experts)


def test_a_larger_ep_lowers_the_memory_it_says_it_lowers():
    """What the ep advice claims, on Qwen3-30B-A3B's 16 GPUs: ep 8 -> 16 halves each GPU's expert weights
    and gradients and leaves its optimizer state (sharded over ep x edp = 16 either way) as it was."""
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.cost.memory import memory_per_gpu

    sc, src = load_scenario("qwen3-30b-a3b-h100-ep16")
    mem = {ep: memory_per_gpu(resolve(with_overrides(sc, {"parallel.ep": ep}, src), src)) for ep in (8, 16)}
    assert mem[16].weights_gb < mem[8].weights_gb and mem[16].grads_gb < mem[8].grads_gb
    assert mem[16].optimizer_gb == pytest.approx(mem[8].optimizer_gb, rel=1e-9)
    assert mem[16].total_gb < mem[8].total_gb
