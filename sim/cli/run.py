"""`meshsim run` (simulate one step of a scenario) and `meshsim scenarios` (list the built-ins)."""

from __future__ import annotations

import typing
from pathlib import Path

import typer

from meshsim.scenarios.library import DEFAULT_SCENARIO, builtin_scenarios
from meshsim.scenarios.load import load_and_resolve, load_scenario, resolve, with_overrides
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.console import Column, fitted_table, make_console
from meshsim.sim.core.engines import check_engine
from meshsim.sim.core.errors import EXIT_DOES_NOT_FIT, UserError, closest
from meshsim.sim.core.limits import MAX_EXPLICIT_RANKS, check_at_most
from meshsim.sim.core.outfiles import check_output_dir, check_output_file, output_folder_name
from meshsim.sim.core.text import user_text
from meshsim.sim.core.units import parse_count
from meshsim.sim.core.userio import parse_yaml
from meshsim.sim.engine import compiled
from meshsim.sim.outputs.advice import scenario_settings
from meshsim.sim.outputs.step_report import (
    OUTPUT_FILES,
    OUTPUT_LEVELS,
    print_report,
    write_outputs,
    write_results_json,
)
from meshsim.sim.results.error_band import error_band
from meshsim.sim.results.simulate import gc_frozen, simulate

DEFAULT_OUT_ROOT = Path("meshsim-out")


def _out_dir(out: Path | None, scenario_name: str) -> Path:
    """--out, or meshsim-out/<the name as one safe folder name>: the name is a label, never a path."""
    out = out if out is not None else DEFAULT_OUT_ROOT / output_folder_name(scenario_name)
    check_output_dir("--out", out, OUTPUT_FILES.values())
    return out


def _tokens(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_count(text)
    except ValueError as exc:
        raise UserError("--tokens", text, "give a token count such as 300B or 1T", problem=str(exc)) from None


def run_command(
    ctx: typer.Context,
    scenario: str = typer.Argument(None, help="scenario YAML path or built-in name (default: the built-in "
                                   "default scenario; see meshsim scenarios)"),
    out: Path = typer.Option(None, "--out", help="output directory (default meshsim-out/<scenario name, made "
                             "a safe folder name>); "
                             "only results.json, trace.json and timeline.html are written there"),
    outputs: str = typer.Option("all", "--outputs", help="files to write: none, results (results.json only) "
                                "or all (results.json, trace.json, timeline.html)"),
    json_path: Path = typer.Option(None, "--json", help="also write the results JSON to this path"),
    no_html: bool = typer.Option(False, "--no-html", help="skip the plotly timeline.html"),
    full_critical_path: bool = typer.Option(False, "--full-critical-path", help="keep every critical-path "
                                            "op in results.json (default: a summary by category and op type)"),
    tokens: str = typer.Option(None, "--tokens", help="a token budget, e.g. 1T or 300B: the report adds the "
                               "time to train it at the simulated rate"),
    allow_oom: bool = typer.Option(False, "--allow-oom", help="exit 0 even when the configuration does "
                                   "not fit in GPU memory (default: exit status 3)"),
    explicit_ranks: bool = typer.Option(False, "--explicit-ranks", help="simulate one whole TP group x "
                                        "min(dp, 2) replicas with real rendezvous instead of one rank"),
    full: bool = typer.Option(False, "--full", help="simulate every micro-batch instead of extrapolating the "
                              "steady state (same figures; trace and timeline then hold every op)"),
    profile: Path = typer.Option(None, "--profile", help="hardware profile YAML (meshsim calibrate, also "
                                 "--from-trace) replacing the scenario's hardware.profile"),
    engine: str = typer.Option(None, "--engine", help="discrete-event engine: compiled (the default, "
                               "fastest), python (alias native) or simpy; same figures (default: the scenario's "
                               "run.engine)"),
    set_values: list[str] = typer.Option(None, "--set", help="override one scenario field, SECTION.FIELD=VALUE "
                                         "(repeatable; VALUE in YAML), e.g. --set parallel.tp=4 --set "
                                         "parallel.sp=true; checked like the file"),
) -> None:
    """Simulate one training step: report, results.json, Perfetto trace.json, timeline.html.

    Exit status: 0; 2 for bad input; 3 when the configuration does not fit in GPU memory (unless
    --allow-oom). The files are written before the report is printed."""
    if outputs not in OUTPUT_LEVELS:
        raise UserError("--outputs", outputs, f"use one of {', '.join(OUTPUT_LEVELS)}")
    budget = _tokens(tokens)
    check_engine("--engine", engine)
    rs = load_with_profile(scenario or DEFAULT_SCENARIO, profile, parse_sets(set_values or []))
    out_dir = _out_dir(out, rs.name) if outputs != "none" else None  # --outputs none touches no folder
    check_output_file("--json", json_path)
    if explicit_ranks:
        ranks = rs.tp * rs.cp * min(rs.dp, 2)
        check_at_most("--explicit-ranks", ranks, MAX_EXPLICIT_RANKS, "drop --explicit-ranks (rank 0 alone gives "
                      "the same step on a symmetric mesh), or use a smaller tp", what="ranks simulated (tp x "
                      "min(dp, 2))")
    if (engine or rs.scenario.run.engine) == "compiled" and not compiled.AVAILABLE:
        typer.echo("meshsim: the compiled engine core is not built (no C compiler at install); running the "
                   "Python core: the same figures, slower", err=True)
    # ctx.obj is True only in the `meshsim` program (main(program=True)), which ends after the command: its
    # objects stay frozen then, so no collection rescans them; a caller in a longer-lived process gets
    # the collector back as it was
    with gc_frozen(program=ctx.obj is True):
        result = simulate(rs, explicit_ranks=explicit_ranks, full=full, engine_name=engine)
        paths = write_outputs(result, result.events, out_dir, html=not no_html, level=outputs,
                              full_critical_path=full_critical_path)
    if json_path is not None:
        paths["json"] = write_results_json(result, json_path, full_critical_path=full_critical_path)
    console = make_console()
    print_report(result, console, tokens=budget, band=error_band(rs),
                 settings=scenario_settings(rs.scenario))
    for kind, path in paths.items():
        console.print(f"{kind}: {user_text(path)}", highlight=False, soft_wrap=True)
    if not result.fits and not allow_oom:
        console.print(f"exit status {EXIT_DOES_NOT_FIT}: the configuration does not fit in GPU memory "
                      "(--allow-oom to exit 0)", highlight=False)
        raise typer.Exit(EXIT_DOES_NOT_FIT)


def load_with_profile(scenario: str, profile: Path | None, overrides: dict[str, object] | None = None):
    """The resolved scenario, with `profile` (a path from the working directory) as its hardware.profile
    and the --set `overrides` (dotted keys) applied; schema and cross-field checks run on the result."""
    overrides = dict(overrides or {})
    if profile is not None:
        if not profile.is_file():
            raise UserError("--profile", str(profile), "give a profile YAML written by meshsim calibrate",
                            problem="No such file")
        overrides["hardware.profile"] = str(profile.resolve())
    if not overrides:
        return load_and_resolve(scenario)
    sc, source = load_scenario(scenario)
    return resolve(with_overrides(sc, overrides, source), source)


SET_FIX = "write --set SECTION.FIELD=VALUE, e.g. --set parallel.tp=4 (fields: docs/scenarios.md)"


def parse_sets(items: list[str]) -> dict[str, object]:
    """--set SECTION.FIELD=VALUE items -> {dotted key: value}, each VALUE read as YAML ('4' -> 4, 'true',
    '[core_attn, mlp]', '' -> null); the key must name a field of the scenario schema."""
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError("--set", item, SET_FIX, problem="Not a KEY=VALUE override")
        check_set_key(key, item)
        if key in overrides:
            raise UserError("--set", item, f"give {key} once", problem="The same field is set twice")
        overrides[key] = parse_yaml(text, f"--set {key}") if text.strip() else None
    return overrides


def check_set_key(key: str, item: str) -> None:
    """`key` is SECTION.FIELD (or deeper) of the scenario schema: an unknown one is named with the closest."""
    model, parts = Scenario, key.split(".")
    for depth, part in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if fields is None:
            return  # below a free-form value (a mapping the schema does not model): the schema decides
        if part not in fields:
            prefix = ".".join(parts[:depth])
            names = [f"{prefix}.{f}" if prefix else f for f in fields]
            guess = closest(".".join(parts[: depth + 1]), names)
            hint = f"did you mean {guess}? " if guess else ""
            raise UserError("--set", item, f"{hint}use one of {', '.join(names)}", problem=f"Unknown field {key}")
        model = _model_of(fields[part].annotation)


def _model_of(annotation: object) -> object:
    """The pydantic model inside a field's annotation (X, X | None), or None for a plain value."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
            return candidate
    return None


def unknown_option_fix(option: str) -> str | None:
    """For `meshsim run NAME --tp 4`: the --set override that does it, when a scenario field has that name."""
    name = option.lstrip("-").replace("-", "_")
    for section, field in Scenario.model_fields.items():
        model = _model_of(field.annotation)
        if model is not None and name in model.model_fields:
            return f"set a scenario field with --set {section}.{name}=VALUE (repeatable)"
    return None


SCENARIO_COLUMNS = (Column("name", "left", keep=True), Column("model", "left", rank=2),
                    Column("topology", "left", keep=True), Column("nodes", keep=True), Column("tp", keep=True),
                    Column("pp", keep=True), Column("sp", "left", keep=True), Column("file", "left", rank=0))


def scenarios_command() -> None:
    """List the built-in scenarios."""
    rows = []
    for name, path in builtin_scenarios().items():
        sc, _ = load_scenario(path)
        m, t, p = sc.model, sc.topology, sc.parallel
        model = f"{m.layers}L h{m.hidden} {m.heads}/{m.num_kv_heads}h {m.mlp} s{m.seq_len}"
        shown = f"{name} *" if name == DEFAULT_SCENARIO else name
        rows.append([shown, model, t.preset or t.file or "", str(t.nodes), str(p.tp), str(p.pp),
                     "on" if p.sp else "off", str(path)])
    console = make_console()
    table, note = fitted_table("built-in scenarios (meshsim run NAME; * = the default)", SCENARIO_COLUMNS, rows,
                               console.width)
    console.print(table)
    if note:
        console.print(note, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("scenarios")(scenarios_command)
