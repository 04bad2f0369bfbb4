"""`meshsim run` (simulate one step of a scenario) and `meshsim scenarios` (list the built-ins)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from meshsim.scenarios.library import DEFAULT_SCENARIO, builtin_scenarios
from meshsim.scenarios.load import load_and_resolve, load_scenario
from meshsim.sim.core.console import make_console
from meshsim.sim.core.limits import MAX_EXPLICIT_RANKS, check_at_most
from meshsim.sim.core.userio import check_output_dir, check_output_file, output_folder_name
from meshsim.sim.outputs.step_report import print_report, write_outputs, write_results_json
from meshsim.sim.results.simulate import gc_frozen, simulate

DEFAULT_OUT_ROOT = Path("meshsim-out")


def _out_dir(out: Path | None, scenario_name: str) -> Path:
    """--out, or meshsim-out/<the name as one safe folder name>: the name is a label, never a path."""
    out = out if out is not None else DEFAULT_OUT_ROOT / output_folder_name(scenario_name)
    check_output_dir("--out", out)
    return out


def run_command(
    scenario: str = typer.Argument(None, help="scenario YAML path or built-in name (default: the built-in "
                                   "default scenario; see meshsim scenarios)"),
    out: Path = typer.Option(None, "--out", help="output directory (default meshsim-out/<scenario name, made "
                             "a safe folder name>); "
                             "only results.json, trace.json and timeline.html are written there"),
    json_path: Path = typer.Option(None, "--json", help="also write the results JSON to this path"),
    no_html: bool = typer.Option(False, "--no-html", help="skip the plotly timeline.html"),
    explicit_ranks: bool = typer.Option(False, "--explicit-ranks", help="simulate one whole TP group x "
                                        "min(dp, 2) replicas with real rendezvous instead of one rank"),
    full: bool = typer.Option(False, "--full", help="simulate every micro-batch instead of extrapolating the "
                              "steady state (same figures; trace and timeline then hold every op)"),
) -> None:
    """Simulate one training step: report, results.json, Perfetto trace.json, timeline.html."""
    rs = load_and_resolve(scenario or DEFAULT_SCENARIO)
    out_dir = _out_dir(out, rs.name)
    check_output_file("--json", json_path)
    if explicit_ranks:
        ranks = rs.tp * min(rs.dp, 2)
        check_at_most("--explicit-ranks", ranks, MAX_EXPLICIT_RANKS, "drop --explicit-ranks (rank 0 alone gives "
                      "the same step on a symmetric mesh), or use a smaller tp", what="ranks simulated (tp x "
                      "min(dp, 2))")
    with gc_frozen():
        result = simulate(rs, explicit_ranks=explicit_ranks, full=full)
        console = make_console()
        print_report(result, console)
        paths = write_outputs(result, result.events, out_dir, html=not no_html)
    if json_path is not None:
        paths["json"] = write_results_json(result, json_path)
    for kind, path in paths.items():
        typer.echo(f"{kind}: {path}")


def scenarios_command() -> None:
    """List the built-in scenarios."""
    table = Table(title="built-in scenarios (meshsim run NAME)", title_justify="left")
    for col in ("name", "model", "topology", "nodes", "tp", "sp", "file"):
        table.add_column(col, justify="right" if col in ("nodes", "tp") else "left")
    for name, path in builtin_scenarios().items():
        sc, _ = load_scenario(path)
        m, t, p = sc.model, sc.topology, sc.parallel
        model = f"{m.layers}L h{m.hidden} {m.heads}/{m.num_kv_heads}h {m.mlp} s{m.seq_len}"
        shown = f"{name} (default)" if name == DEFAULT_SCENARIO else name
        table.add_row(shown, model, t.preset or t.file or "", str(t.nodes), str(p.tp), "on" if p.sp else "off",
                      str(path))
    make_console().print(table)


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("scenarios")(scenarios_command)
