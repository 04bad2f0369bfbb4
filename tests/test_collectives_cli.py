"""`meshsim collective` on a fresh typer app: output files, and every bad input -> one line, exit 2."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from meshsim.sim.cli.collective import register
from meshsim.sim.core.errors import EXIT_USER_ERROR
from meshsim.sim.cost.collectives.nccl_table import ROW_KEYS, sweep_sizes


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test shell"""

    register(app)
    return app


def invoke(app, *args):
    return CliRunner().invoke(app, ["collective", *args])


def test_json_rows_have_exactly_the_public_keys(app, tmp_path):
    out = tmp_path / "rows.json"
    res = invoke(app, "--topology", "dgx-h100", "--nodes", "2", "--ranks", "16", "--min-bytes", "1K",
                 "--max-bytes", "1M", "--json", str(out))
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == [1024 << i for i in range(11)]
    for r in rows:
        assert tuple(r) == ROW_KEYS
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 15 / 16, rel=1e-9)
        assert r["time_us"] == pytest.approx(r["bytes"] / (r["algbw_GBps"] * 1e3), rel=1e-9)
        assert "/" in r["algorithm"]
    assert "busbw GB/s" in res.output and f"json: {out}" in res.output.replace("\n", "")


def test_forced_algorithm_and_plot(app, tmp_path):
    plot = tmp_path / "busbw.html"
    res = invoke(app, "--nodes", "1", "--ranks", "8", "--min-bytes", "64K", "--max-bytes", "64M",
                 "--step-factor", "8", "--algo", "ring", "--protocol", "simple", "--plot", str(plot))
    assert res.exit_code == 0, res.output
    assert res.output.count("ring/simple") == 4 and f"plot: {plot}" in res.output.replace("\n", "")
    html = plot.read_text()
    assert "plotly" in html and len(html) > 1_000_000  # plotly.js embedded: self-contained
    for name in ('"ring"', '"tree"', '"auto"'):  # every applicable algorithm, and auto's choice
        assert name in html


@pytest.mark.parametrize("args,needle", [
    (("--topology", "dgx-h10"), "dgx-h100"),  # closest preset name
    (("--op", "all_reduc"), "all_reduce"),
    (("--nodes", "2", "--ranks", "17"), "--ranks"),
    (("--ranks", "1"), "--ranks"),
    (("--min-bytes", "12Q"), "--min-bytes"),
    (("--max-bytes", "lots"), "--max-bytes"),
    (("--min-bytes", "1M", "--max-bytes", "1K"), "--max-bytes"),
    (("--min-bytes", "-1K"), "--min-bytes"),
    (("--min-bytes", "0"), "--min-bytes"),
    (("--step-factor", "-2"), "--step-factor"),
    (("--step-factor", "1"), "--step-factor"),
    (("--nodes", "-1"), "nodes"),
    (("--algo", "nvls", "--topology", "dgx-a100"), "nvls"),
    (("--algo", "tree", "--op", "all_gather"), "tree"),
    (("--algo", "tre"), "tree"),
    (("--protocol", "ll64"), "ll128"),
    (("--protocol", "ll", "--algo", "nvls"), "ll"),
])
def test_bad_input_is_one_line_exit_2(app, args, needle):
    res = invoke(app, "--max-bytes", "4K", *args)
    assert res.exit_code == EXIT_USER_ERROR, res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)
    text = res.output.strip()
    assert len(text.splitlines()) == 1 and text.startswith("error: ") and needle in text
    assert "Traceback" not in res.output


def test_sweep_sizes_follow_nccl_tests():
    assert sweep_sizes(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    assert sweep_sizes(1000, 10_000, 3) == [1000, 3000, 9000]
    assert sweep_sizes(5, 5, 2) == [5]


def test_plot_with_a_forced_protocol_skips_algorithms_without_it(app, tmp_path):
    plot = tmp_path / "ll.html"
    res = invoke(app, "--ranks", "8", "--protocol", "ll", "--max-bytes", "1M", "--plot", str(plot))
    assert res.exit_code == 0, res.output
    html = plot.read_text()
    assert '"ring"' in html and '"tree"' in html and '"nvls"' not in html
