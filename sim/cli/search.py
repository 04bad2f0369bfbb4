"""`meshsim search`: the fastest layout of a scenario's space, proven optimal under the model by branch and
bound (sim/search/branch.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import typer
from rich.console import Console

from meshsim.scenarios.load import build_scenario_topology, load_scenario, with_overrides
from meshsim.sim.core.console import Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.fmt import fmt_count, fmt_gb_as_gib, fmt_pct, fmt_s
from meshsim.sim.core.outfiles import check_output_dir, check_output_file
from meshsim.sim.core.text import plain, user_text
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.search.bound_store import BOUNDS_NAME
from meshsim.sim.search.branch import search
from meshsim.sim.search.report import summary_line, verdict, write_search_report
from meshsim.sim.search.result import Entry, SearchResult
from meshsim.sim.search.space import parse_assignment
from meshsim.sim.sweep.report_page import REPORT_NAME
from meshsim.sim.sweep.store import JSONL_NAME, LOCK_NAME

MAX_JOBS = 256
COLUMNS = (Column("", "left", keep=True), Column("layout", "left", keep=True, wrap=True), Column("step", keep=True),
           Column("tokens/s", keep=True), Column("MFU", rank=2), Column("GiB/GPU", rank=1), Column("bound", rank=3),
           Column("critical path", "left", rank=0, wrap=True))


def search_command(
    scenario: str = typer.Argument(..., help="scenario YAML path or built-in name (meshsim scenarios)"),
    gpus: int = typer.Option(None, "--gpus", help="GPUs to lay out (default: the scenario's)"),
    global_batch: int = typer.Option(None, "--global-batch", help="sequences per step (default: the scenario's)"),
    fix: list[str] = typer.Option(None, "--fix", help="pin an axis: AXIS=VALUE, e.g. tp=8 (repeatable)"),
    space: list[str] = typer.Option(None, "--space", help="values an axis takes: AXIS=V1,V2, e.g. fp8=off,tensorwise "
                                    "(repeatable)"),
    top: int = typer.Option(5, "--top", help="runners-up to show"),
    budget: float = typer.Option(None, "--budget", help="wall SECONDS for the whole search (screening, bounding, simulating); past it nothing new starts once one layout has run, and the output says which claims hold"),
    jobs: int = typer.Option(None, "--jobs", "-j", help="local worker processes (default: all cores; 1 = in-process)"),
    ray: str = typer.Option(None, "--ray", help="simulate as Ray tasks: a cluster address, 'auto' or 'local'"),
    out: Path = typer.Option(None, "--out", help="directory for sweep.jsonl (resumable) and report.html"),
    json_path: Path = typer.Option(None, "--json", help="write the search's counts, layouts and bounds as JSON"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar"),
) -> None:
    """Search every legal layout at the GPU count; simulate in ascending lower-bound order until no layout
    left can beat the best: the fastest layout under meshsim's model."""
    if jobs is not None and not 1 <= jobs <= MAX_JOBS:
        raise UserError("--jobs", jobs, f"use --jobs 1 to {MAX_JOBS}")
    if top < 0:
        raise UserError("--top", top, "use --top 0 or more")
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise UserError("--budget", budget, "give a positive number of seconds")
    fixed = dict(parse_assignment("--fix", text, True) for text in fix or ())
    opened = dict(parse_assignment("--space", text, False) for text in space or ())
    both = sorted(set(fixed) & set(opened))
    if both:
        raise UserError("--space", both[0], f"give {both[0]} with --fix or with --space, not both")
    base, source = load_scenario(scenario)
    base = sized(base, source, gpus, global_batch)
    check_output_dir("--out", out, (JSONL_NAME, LOCK_NAME, REPORT_NAME, BOUNDS_NAME))
    check_output_file("--json", json_path)
    result = search(base, source, fixed=fixed, opened=opened, budget_s=budget, jobs=jobs or os.cpu_count() or 1,
                    out_dir=out, ray=ray, progress=progress)
    written = {}
    if out is not None:
        written["report"] = write_search_report(result, out)
        written["results"] = Path(out) / JSONL_NAME
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(dumps_finite(search_document(result), indent=1))
        written["json"] = json_path
    print_search(result, top)
    for kind, path in written.items():
        typer.echo(plain(f"{kind}: {path}"))


def sized(base, source: str, gpus: int | None, global_batch: int | None):
    """The scenario at --gpus (nodes enough to hold them, parallel.gpus when they do not fill the last
    node) and --global-batch."""
    overrides: dict[str, object] = {}
    if gpus is not None:
        if gpus <= 0:
            raise UserError("--gpus", gpus, "give a positive number of GPUs")
        per_node = build_scenario_topology(base, source).gpus_per_node
        overrides["topology.nodes"] = -(-gpus // per_node)
        overrides["parallel.gpus"] = gpus if gpus % per_node else None
    if global_batch is not None:
        if global_batch <= 0:
            raise UserError("--global-batch", global_batch, "give a positive number of sequences")
        overrides["parallel.global_batch"] = global_batch
    return with_overrides(base, overrides, source) if overrides else base


def _path_text(entry: Entry) -> str:
    shares = sorted(entry.record.result.critical_path_share.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {fmt_pct(v)}" for k, v in shares if v > 0)


def _row(mark: str, entry: Entry) -> list[str]:
    r = entry.record.result
    return [mark, entry.key, fmt_s(r.step_time_s), fmt_count(r.tokens_per_s), fmt_pct(r.mfu, 1),
            fmt_gb_as_gib(r.memory_gb.total, unit=False), fmt_s(entry.bound.step_s), _path_text(entry)]


def print_search(result: SearchResult, top: int, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(f"{result.scenario}: {summary_line(result)} ({result.wall_s:,.1f} s)", highlight=False, markup=False)
    for rc in result.refused:
        console.print(f"  refused by {rc.rule}: {rc.count:,}, e.g. {' '.join(rc.example.split())}", highlight=False,
                      markup=False, no_wrap=True, overflow="ellipsis", crop=True)
    console.print(verdict(result), highlight=False, markup=False)
    if result.winner is None:
        return
    rows = [_row("best", result.winner)] + [_row(str(i), e) for i, e in enumerate(result.runners_up(top), start=2)]
    print_fitted(console, fitted_table("The sweet spot and the runners-up", COLUMNS, rows, console.width))
    if result.within_error:
        keys = "; ".join(e.key for e in result.within_error)
        console.print(f"Could be the best within the model's error ({result.band.sentence()}): {keys}",
                      highlight=False, markup=False)
    for sentence in result.explanation:
        console.print(f"- {user_text(sentence)}", highlight=False)


def _entry_json(entry: Entry) -> dict:
    out = {"layout": entry.key, "config": entry.record.to_json()["config"] if entry.record else None,
           "bound_s": entry.bound.step_s, "bound_level": entry.bound.level, "bound_term": list(entry.bound.binding),
           "cheap_bound_s": entry.cheap.step_s,
           "refined_bound_s": entry.refined.step_s if entry.refined is not None else None,
           "simulated": entry.record is not None}
    if entry.record is not None and entry.record.ok:
        out |= {"step_s": entry.step_s, "tokens_per_s": entry.record.result.tokens_per_s,
                "mfu": entry.record.result.mfu, "memory_gb": entry.record.result.memory_gb.total}
    return out


def search_document(result: SearchResult) -> dict:
    return {"scenario": result.scenario, "searched": result.searched, "refused": {r.rule: r.count for r in result.refused},
            "out_of_memory": result.out_of_memory, "pruned": result.pruned, "refined": result.refined,
            "bounds_reused": result.bounds_reused, "simulated": len(result.simulated),
            "proven_optimal": result.proven, "stop_reason": result.stop_reason,
            "winner": _entry_json(result.winner) if result.winner else None,
            "within_error": [e.key for e in result.within_error], "explanation": list(result.explanation),
            "layouts": [_entry_json(e) for e in result.entries], "wall_s": result.wall_s}


def register(app: typer.Typer) -> None:
    app.command("search")(search_command)
