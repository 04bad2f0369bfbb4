"""`meshsim compare A.json B.json`: two simulated steps side by side.

- first, what differs between the two configurations (GPUs, tp/pp/dp, sp, recompute, micro-batch,
  topology, ...), so that "tokens/s -90%" is read next to "64 vs 8 GPUs";
- headline: step time, tokens/s, tokens/s per GPU, TFLOP/s per GPU, MFU, memory per GPU (GiB; fits);
- the step along the critical path (adds up to the step) and busy time per stream (overlaps), with the
  delta B - A and its percentage of A;
- one Perfetto/Chrome trace holding both timelines, and compare.html beside it (the same tables).
Results written by older versions are read through results.upgrade_result_dict (old key names).

Timelines (decision): `meshsim run --out DIR` writes DIR/trace.json next to DIR/results.json, so compare
merges the two trace.json files found next to the results, giving B's processes pids shifted past A's and
prefixing every process name with "A: " / "B: ". A results file without a trace beside it is re-simulated
from what it carries: its `source` (scenario file or builtin:NAME) with the config echo (tp, sp,
micro_batch, recompute, tp_comm_overlap) applied as overrides. If neither is possible, the comparison
is still printed and the merged trace is not written (the reason is reported).
"""

from __future__ import annotations

import math
from pathlib import Path

from meshsim.scenarios.library import BUILTIN_PREFIX
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.console import Column, fitted_table, print_fitted
from meshsim.sim.core.errors import FilePath, UserError
from meshsim.sim.core.fmt import gb_to_gib
from meshsim.sim.core.text import user_text
from meshsim.sim.core.userio import dumps_finite, load_json
from meshsim.sim.outputs.step_report import OUTPUT_FILES, STREAM_NAMES, path_row_name, stream_row_name
from meshsim.sim.outputs.trace import trace_document, trace_events
from meshsim.sim.results.breakdown import BREAKDOWN_KEYS
from meshsim.sim.results.critical_path import CATEGORY_NAMES
from meshsim.sim.results.records import KEYS, ConfigEcho
from meshsim.sim.results.result_ranges import result_problem
from meshsim.sim.results.simulate import simulate_with_events
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.sweep.compare_page import (
    COMPARED_HEAD,
    COMPARED_TABLES,
    compared_cells,
    fmt_value,
    section_rows,
    write_page,
)

HEADLINE = (("step time (s)", "step_time_s", 1.0), ("tokens/s", "tokens_per_s", 1.0),
            ("TFLOP/s per GPU", "tflops_per_gpu", 1.0), ("MFU (%)", "mfu", 100.0), ("HFU (%)", "hfu", 100.0))
HEADLINE_KINDS = {"step_time_s": "time", "tokens_per_s": "count", "tokens_per_gpu": "count"}  # else "decimal"
BUSY_ROWS = tuple(k for k in {**dict.fromkeys(BREAKDOWN_KEYS), **STREAM_NAMES} if k.endswith("_busy")) + ("compute_waiting",)
SHARES = tuple(CATEGORY_NAMES)  # critical-path rows, in the one category list's order
PATH_SECTION, BUSY_SECTION = "critical path", "rank 0 streams"
OPTIONAL_HEADLINE = ("hfu",)  # absent from results written before it existed: shown as "-"
CONFIG_DIFF_KEYS = KEYS  # every key a results file echoes (ConfigEcho), in its order: cp, ep, fp8 ... included
REPLAY_KEYS = ("tp", "sp", "micro_batch", "recompute", "tp_comm_overlap")


RESULTS_FIX = "give a results.json written by `meshsim run --out DIR`"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _malformed(data: object) -> str | None:
    """What a results dict lacks for a comparison (sim/results/result_ranges.py: every number within its
    range), or None."""
    return result_problem(data)


def load_results(path: str | Path) -> StepResult:
    """A results.json written by `meshsim run` (or one configuration of a sweep record), as a StepResult
    (old key names upgraded); malformed files (not UTF-8, not JSON, missing or non-numeric figures) are
    UserErrors."""
    data = load_json(path, field="results", fix=RESULTS_FIX)
    data = data.get("result", data) if isinstance(data, dict) else data
    problem = _malformed(data)
    if problem:
        raise UserError("results", FilePath(path), RESULTS_FIX, problem=problem)
    try:
        return StepResult.from_dict(data)
    except (TypeError, ValueError, AttributeError, KeyError) as err:
        why = f"missing key {err}" if isinstance(err, KeyError) else str(err)
        raise UserError("results", FilePath(path), RESULTS_FIX, problem=f"Not a results file ({why})") from None


def config_rows(a: StepResult, b: StepResult) -> list[dict]:
    """The configuration side by side, differing keys first: {name, a, b, differs} (rows of the JSON and
    HTML comparison)."""
    ca, cb = a.config, b.config

    def echoed(c: ConfigEcho, k: str) -> object:
        return getattr(c, k) if c.has(k) else (1 if k == "pp" else None)

    rows = [{"name": k, "a": echoed(ca, k), "b": echoed(cb, k)}
            for k in CONFIG_DIFF_KEYS if ca.has(k) or cb.has(k) or k == "pp"]
    for row in rows:
        row["differs"] = row["a"] != row["b"]
    return sorted(rows, key=lambda r: not r["differs"])


def _row(name: str, a: float | None, b: float | None, *, key: str, kind: str = "decimal", section: str = "") -> dict:
    """One compared figure: `key` names it for programs, `name` for people; `kind` picks its one number
    format (compare_page.row_formats); `section` groups rows under a heading."""
    base = {"key": key, "name": name, "kind": kind, "section": section, "a": a, "b": b}
    if a is None or b is None:
        return {**base, "delta": None, "delta_pct": None}
    return {**base, "delta": b - a, "delta_pct": 100 * (b - a) / a if a else None}


def _per_gpu(r: StepResult) -> float:
    gpus = r.config.gpus
    return r.tokens_per_s / gpus if gpus else 0.0


def headline_rows(a: StepResult, b: StepResult) -> list[dict]:
    def value(r: StepResult, key: str, scale: float) -> float | None:
        number = getattr(r, key)
        return number * scale if _number(number) and (number or key not in OPTIONAL_HEADLINE) else None

    rows = [_row(name, value(a, key, scale), value(b, key, scale), key=key, kind=HEADLINE_KINDS.get(key, "decimal"))
            for name, key, scale in HEADLINE]
    rows.insert(2, _row("tokens/s per GPU", _per_gpu(a), _per_gpu(b), key="tokens_per_gpu", kind="count"))
    rows.append(_row("memory per GPU (GiB)", gb_to_gib(a.memory_gb.total), gb_to_gib(b.memory_gb.total),
                     key="memory_gib"))
    return rows


def category_rows(a: StepResult, b: StepResult) -> list[dict]:
    """Seconds: the step along the critical path (these rows add up to 'step'), then busy time per stream
    of rank 0 (these overlap) and how long its compute stream waits."""
    sa, sb = a.critical_path_share, b.critical_path_share
    keys = [k for k in SHARES if k in sa or k in sb] + [k for k in {**sa, **sb} if k not in SHARES]
    rows = [_row(f"{PATH_SECTION}: {path_row_name(k)}", sa.get(k, 0.0) * a.step_time_s, sb.get(k, 0.0) * b.step_time_s,
                 key=f"critical_path.{k}", kind="time", section=PATH_SECTION) for k in keys]
    rows.append(_row("step", a.step_time_s, b.step_time_s, key="step", kind="time"))
    busy = [k for k in BUSY_ROWS if k in a.breakdown_s or k in b.breakdown_s]
    rows += [_row(f"{BUSY_SECTION}: {stream_row_name(k)}", a.breakdown_s.get(k, 0.0), b.breakdown_s.get(k, 0.0),
                  key=f"busy.{k}", kind="time", section=BUSY_SECTION) for k in busy]
    return rows


def labels(a: StepResult, b: StepResult, path_a: Path, path_b: Path) -> tuple[str, str]:
    """'A: name' / 'B: name'; the parent directory names are used when both results share a name."""
    na, nb = a.scenario or "A", b.scenario or "B"
    if na == nb:
        na, nb = f"{na} ({Path(path_a).parent.name or path_a})", f"{nb} ({Path(path_b).parent.name or path_b})"
    return f"A: {na}", f"B: {nb}"


# ----- timelines ------------------------------------------------------------------------------------
def _trace_events(doc: object) -> list[dict]:
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def relabel(events: list[dict], *, pid_offset: int, prefix: str, flow_offset: int) -> list[dict]:
    """Shift pids and flow ids, and prefix process names ('A: ' ...) so two runs share one trace."""
    out = []
    for ev in events:
        ev = dict(ev)
        if isinstance(ev.get("pid"), int):
            ev["pid"] += pid_offset
        if ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int):
            ev["id"] += flow_offset
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            ev["args"] = {**ev.get("args", {}), "name": f"{prefix} {ev.get('args', {}).get('name', '')}".strip()}
        if ev.get("ph") == "M" and ev.get("name") == "process_sort_index":
            ev["args"] = {"sort_index": ev["pid"]}
        out.append(ev)
    return out


def merge_traces(a: list[dict], b: list[dict], label_a: str, label_b: str) -> dict:
    """One Chrome/Perfetto trace document: A's processes first, then B's with pids past A's."""
    pids = [e["pid"] for e in a if isinstance(e.get("pid"), int)]
    flows = [e["id"] for e in a if e.get("ph") in ("s", "t", "f") and isinstance(e.get("id"), int)]
    merged = relabel(a, pid_offset=0, prefix=label_a, flow_offset=0) + relabel(
        b, pid_offset=max(pids, default=-1) + 1, prefix=label_b, flow_offset=max(flows, default=0) + 1)

    return trace_document(merged)


def resimulate_events(result: StepResult) -> list[dict]:
    """Re-run the step a result describes (its source + config echo) -> its trace events.

    Raises UserError if the results do not say where their scenario came from, or if the replay's step
    time differs from the recorded one (the scenario file changed, or `run` had overrides not echoed)."""
    source = result.source
    if not source or not isinstance(source, str):
        raise UserError("results", result.scenario or "?", "run `meshsim run --out DIR` to write trace.json",
                        problem="No trace.json beside it and no scenario source to re-simulate")

    name = source.removeprefix(BUILTIN_PREFIX)
    scenario, src = load_scenario(name)
    replay, log, _ = simulate_with_events(resolve(with_overrides(scenario, replay_overrides(result.config), src), src))
    if abs(replay.step_time_s - result.step_time_s) > 1e-9 * max(1.0, result.step_time_s):
        raise UserError("results", source, "re-run `meshsim run --out DIR` so that trace.json is written",
                        problem=f"Re-simulating gives step time {replay.step_time_s:.6f} s, not the recorded "
                                f"{result.step_time_s:.6f} s")
    return trace_events(log.events, replay.critical_path, result=replay)


def replay_overrides(config: ConfigEcho) -> dict[str, object]:
    """The scenario overrides that re-run a result from its config echo (REPLAY_KEYS, and its GPU count)."""
    overrides: dict[str, object] = {f"parallel.{k}": getattr(config, k) for k in REPLAY_KEYS if config.has(k)}
    overrides.update({"parallel.dp": "auto", "parallel.gpus": config.gpus} if config.gpus is not None else {})
    return overrides


def timeline_events(result: StepResult, results_path: Path) -> list[dict]:
    """trace.json beside the results if present, else a re-simulation."""
    trace = Path(results_path).parent / OUTPUT_FILES["trace"]
    if trace.is_file():
        return _trace_events(load_json(trace, field="trace", fix="re-run `meshsim run --out DIR`"))
    return resimulate_events(result)


# ----- the comparison -------------------------------------------------------------------------------
def compare_files(path_a: str | Path, path_b: str | Path, *, out_dir: str | Path | None = None) -> dict:
    """Headline and category rows for two results files; with out_dir, write compare.json and the merged
    trace.json there. The returned dict has 'labels', 'headline', 'categories', 'fits', 'trace', 'note'."""
    a, b = load_results(path_a), load_results(path_b)
    label_a, label_b = labels(a, b, Path(path_a), Path(path_b))
    comparison = {"labels": [label_a, label_b], "files": [str(path_a), str(path_b)], "config": config_rows(a, b),
                  "headline": headline_rows(a, b), "categories": category_rows(a, b),
                  "fits": [a.fits, b.fits], "trace": None, "note": ""}
    if out_dir is None:
        return comparison
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        doc = merge_traces(timeline_events(a, Path(path_a)), timeline_events(b, Path(path_b)), label_a, label_b)
        trace = out / "trace.json"  # the merged trace of both runs
        trace.write_text(dumps_finite(doc, separators=(",", ":")))
        comparison["trace"] = str(trace)
    except UserError as err:
        comparison["note"] = f"merged trace not written: {err}"
    (out / "compare.json").write_text(dumps_finite(comparison, indent=1))
    comparison["page"] = str(write_page(comparison, out / "compare.html"))
    return comparison


CONFIG_COLUMNS = (Column("", "left", keep=True), Column("A", "left", keep=True, wrap=True),
                  Column("B", "left", keep=True, wrap=True))
COMPARED_COLUMNS = (Column("", "left", keep=True, wrap=True), *(Column(h, keep=True) for h in COMPARED_HEAD))


def print_comparison(comparison: dict, console) -> None:
    """Which is A and which B, what differs first, then two tables (headline, step time), and where the
    files went. Every table fits the console (sim/core/console.py fitted_table)."""
    label_a, label_b = comparison["labels"]
    console.print(f"{label_a}\n{label_b}", highlight=False, markup=False)
    config = [[("* " if row["differs"] else "  ") + row["name"], fmt_value(row["a"]), fmt_value(row["b"])]
              for row in comparison.get("config", [])]
    styles = ["bold" if row["differs"] else None for row in comparison.get("config", [])]
    print_fitted(console, fitted_table("Configuration (differences first, marked *)", CONFIG_COLUMNS, config,
                                       console.width, row_styles=styles))
    for title, key in COMPARED_TABLES:
        unit, cells = compared_cells(comparison[key])
        rows = section_rows(comparison[key], cells)
        print_fitted(console, fitted_table(title.format(unit=unit), COMPARED_COLUMNS, [c for c, _ in rows],
                                           console.width, row_styles=["bold" if h else None for _, h in rows]))
    fits = ["fits" if f else "does NOT fit" for f in comparison["fits"]]
    console.print(f"memory: A {fits[0]}, B {fits[1]}", highlight=False)
    if comparison["trace"]:
        console.print(f"merged timeline: {user_text(comparison['trace'])} (open in https://ui.perfetto.dev)", highlight=False)
    if comparison.get("page"):
        console.print(f"page: {user_text(comparison['page'])}", highlight=False)
    if comparison["note"]:
        console.print(user_text(comparison["note"]), highlight=False)
