"""Accuracy report: simulated vs measured on the public calibration sets, fitted cases apart from predicted.

    python benchmarks/accuracy.py                    # default cost models (no profile)
    python benchmarks/accuracy.py --profile P.yaml   # every case on a calibrated profile (meshsim calibrate)
    python benchmarks/accuracy.py --only ci-         # step cases whose name starts with a prefix
    python benchmarks/accuracy.py --release nemo-25.04  # every step case under one release profile (what-if)
    python benchmarks/accuracy.py --json FILE        # also one JSON record per case
    python benchmarks/accuracy.py --write-bands      # also refresh sim/results/error_bands.json

Groups (GROUPS below), each printed with its rows and two lines: the MAPE (mean absolute percentage
error, max) over all its scored cases, and over its out-of-fit cases - those no constant or per-case
assumption was fitted or chosen on (benchmarks/accuracy/fits.yaml is the one list of what was fitted on
what). The out-of-fit figure is what the model can claim on runs it has not seen; a run report and a
sweep print it as "the model's error" for the scenario's group (sim/results/error_band.py).
- step groups (`dense`, and whatever STEP_GROUPS in sim/results/error_band.py registers): one training
  step per case file benchmarks/accuracy/<group>/<name>.yaml - a scenario plus an `accuracy:` block
  (measured_s, source, assumptions: each dotted field the source does not state, with why). Pipeline
  cases run like the others. A case that does not fit in GPU memory under its stated assumptions is
  printed "DOES NOT FIT" and not scored (its assumptions contradict meshsim's own memory model);
- scaling: ratios of two measured steps against the same simulated ratio (scaling.yaml);
- collectives / collectives-small: nccl-tests all_reduce busbw points from 16 MiB up / below
  (collectives.yaml; targets: within 5% from 16 MiB, 15% below);
- kernels: FLUX's GEMM and NCCL collective times of GPT-3 175B MLP shapes at TP 8 (kernels.yaml);
- moe-layer: Megatron-LM's MoE layer benchmark, one MoELayer forward / backward on 8 H100 per dispatcher, bf16 and
  blockwise FP8
  (benchmarks/accuracy_moe.py); the end-to-end MoE runs are the `moe` step group.
Error = simulated / measured - 1: negative means the simulation is too fast. Nothing here is asserted.

Releases: every step case names the software-release family it was measured on (`accuracy.release`, a
built-in profile of scenarios/profiles/, scenarios/releases.py) and is simulated under that family's profile,
so rows of different releases are never scored against one averaged constant. Each step row prints its
release after its error, and a `[release NAME]` block after the group lines gives the same two MAPE lines
per release family over the step cases of every step group.

Adding a step group (e.g. `fp8`): put its case files in benchmarks/accuracy/fp8/ (copy a dense case: the
`accuracy:` block and a scenario), add one StepGroup("fp8", "iteration-time", rule) line to STEP_GROUPS in
sim/results/error_band.py (rule: which scenarios belong to it, e.g. those with FP8 GEMMs; first match
wins, dense stays last), name in fits.yaml any constant you fit on its cases, add ratios to scaling.yaml if
the group has some, then run `python benchmarks/accuracy.py --write-bands` and commit the band file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import accuracy_cases as cases
import accuracy_nvl72 as nvl72
from accuracy_moe import layer_rows
from accuracy_rows import Context, Row, curve_rows, kernel_row, ratio_rows, step_row

from meshsim.scenarios.releases import builtin_releases
from meshsim.sim.results.error_band import BANDS_FILE, STEP_GROUPS


@dataclass(frozen=True)
class Group:
    name: str
    metric: str  # the summary line's name for what is measured
    target: str  # printed after the all-cases line ("" = none)
    rows: Callable[[Context, dict[str, list[Row]]], list[Row]]  # given the rows of the groups before it


def _step_rows(name: str) -> Callable[[Context, dict[str, list[Row]]], list[Row]]:
    return lambda ctx, done: [step_row(c, ctx) for c in cases.step_cases(name, ctx.only)]


def _scaling(ctx: Context, done: dict[str, list[Row]]) -> list[Row]:
    steps = [r for g in STEP_GROUPS for r in done.get(g.name, [])]
    return ratio_rows(cases.ratios(), steps, ctx)


def _curves(small: bool) -> Callable[[Context, dict[str, list[Row]]], list[Row]]:
    group = "collectives-small" if small else "collectives"
    return lambda ctx, done: [r for r in [*(r for c in cases.curves() for r in curve_rows(c, ctx)),
                                          *nvl72.curve_rows(ctx)] if r.group == group]


def _kernels(ctx: Context, done: dict[str, list[Row]]) -> list[Row]:
    rows, nvlink_gbps = cases.kernels()
    return [kernel_row(k, nvlink_gbps, ctx) for k in rows]


# out-of-fit targets per step group (issue 18 set the fp8 and cp groups'); the others share the dense one
STEP_TARGETS = {"fp8": "<= 8% (max <= 15%) out of fit", "cp": "<= 8% (max <= 15%) out of fit",
                "moe": "<= 12% (max <= 20%) out of fit"}  # issues 18 and 19; dense: issue 22
GROUPS: tuple[Group, ...] = (
    *(Group(g.name, g.metric, STEP_TARGETS.get(g.name, "<= 6% (max <= 12%) out of fit"), _step_rows(g.name))
      for g in STEP_GROUPS),
    Group("scaling", "scaling-ratio", "<= 4%", _scaling),
    Group("collectives", "nccl-tests busbw (>= 16 MiB)", "within 5% per point", _curves(small=False)),
    Group("collectives-small", "nccl-tests busbw (< 16 MiB)", "within 15% per point", _curves(small=True)),
    Group("kernels", "FLUX kernel-time", "", _kernels),
    Group("moe-layer", "MoE layer-time (Megatron-LM moe_perf)", "<= 12% (max <= 20%)",
          lambda ctx, done: layer_rows(Row, ctx.used)),
)


@dataclass(frozen=True)
class Summary:
    mape: float | None  # fraction; None: no case
    max_error: float | None
    cases: int


def summarize(rows: list[Row]) -> Summary:
    errs = [abs(r.error) for r in rows if r.scored]
    return Summary(sum(errs) / len(errs), max(errs), len(errs)) if errs else Summary(None, None, 0)


def summary_line(prefix: str, metric: str, s: Summary) -> str:
    if s.mape is None:
        return f"{prefix}{metric} MAPE n/a (no scored case)"
    return f"{prefix}{metric} MAPE {s.mape * 100:.1f}% (max {s.max_error * 100:.1f}%) over {s.cases} cases"


def group_lines(group: Group, rows: list[Row]) -> list[str]:
    every, out = summarize(rows), summarize([r for r in rows if r.out_of_fit])
    line = summary_line("", group.metric, every) + (f"; target {group.target}" if group.target else "")
    unscored = [r for r in rows if not r.scored]
    if unscored:
        reasons = sorted({r.note.split(" (")[0] for r in unscored})  # a note's "(...)" tail is per case
        line += f"; {len(unscored)} not scored ({', '.join(reasons)})"
    return [f"[{group.name}] {line}", f"[{group.name}] " + summary_line("out-of-fit ", group.metric, out)]


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        sim = "-" if r.simulated is None else f"{r.simulated:9.3f}"
        err = "" if r.error is None else f"{r.error * 100:+6.1f}%"
        tags = (f"  [{r.release}]" if r.release else "") + ("  fit: " + ", ".join(r.used_in_fit) if r.used_in_fit else "")
        tags += f"  ({r.note})" if r.note else ""
        print(f"  {r.label:58s} {r.measured:9.3f} {sim:>9s} {r.unit:5s} {err}{tags}")


def release_lines(results: dict[str, list[Row]]) -> list[str]:
    """Per release family (oldest first): the iteration-time MAPE over its step cases, all and out of fit."""
    steps = [r for g in STEP_GROUPS for r in results.get(g.name, [])]
    lines = []
    for name in builtin_releases():
        rows = [r for r in steps if r.release == name]
        if rows:
            every, out = summarize(rows), summarize([r for r in rows if r.out_of_fit])
            lines += [f"[release {name}] " + summary_line("", "iteration-time", every),
                      f"[release {name}] " + summary_line("out-of-fit ", "iteration-time", out)]
    return lines


def check_fits(all_fits: list[cases.Fit], names: set[str]) -> None:
    unknown = sorted({c for f in all_fits for c in f.cases} - names)
    if unknown:
        raise SystemExit(f"benchmarks/accuracy/fits.yaml names cases that do not exist: {', '.join(unknown)}")


def bands_document(results: dict[str, list[Row]]) -> dict:
    """The error bands of the step groups (sim/results/error_band.py reads them)."""
    groups = {}
    for g in STEP_GROUPS:
        rows = results.get(g.name, [])
        every, out = summarize(rows), summarize([r for r in rows if r.out_of_fit])
        if out.mape is None:
            continue
        # 6 decimals: a report's "12.1%" is then the benchmark's own rounding of the figure, not a second
        # rounding of a 4-decimal one (0.1215 printed 12.2% beside the benchmark's 12.1%)
        groups[g.name] = {"metric": g.metric, "out_of_fit_mape": round(out.mape, 6),
                          "out_of_fit_max": round(out.max_error, 6), "out_of_fit_cases": out.cases,
                          "all_mape": round(every.mape, 6), "all_max": round(every.max_error, 6),
                          "all_cases": every.cases}
    return {"generated_by": "python benchmarks/accuracy.py --write-bands", "date": date.today().isoformat(),
            "groups": groups}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="hardware profile YAML from meshsim calibrate, applied to every case")
    ap.add_argument("--only", default="", help="only step cases whose name starts with this prefix")
    ap.add_argument("--release", choices=list(builtin_releases()), help="simulate every step case under this "
                    "release profile instead of its own accuracy.release (what-if; scenarios/profiles/)")
    ap.add_argument("--json", type=Path, help="write one record per case to this file")
    ap.add_argument("--write-bands", action="store_true", help=f"refresh {BANDS_FILE.name} (full default run only)")
    args = ap.parse_args(argv)
    if args.write_bands and (args.profile or args.only or args.release):
        ap.error("--write-bands needs the full default run (no --profile, --only or --release)")
    all_fits = cases.fits() + nvl72.fits()
    ctx = Context(args.profile, args.only, cases.used_in_fit(all_fits), args.release)
    results: dict[str, list[Row]] = {}
    print(f"{'case':60s} {'measured':>9s} {'simulated':>9s} unit  error (simulated / measured - 1)")
    for group in GROUPS:
        results[group.name] = group.rows(ctx, results)
        print(f"[{group.name}]")
        print_rows(results[group.name])
    if not args.only:
        check_fits(all_fits, {r.name for rows in results.values() for r in rows})
    print()
    for group in GROUPS:
        print("\n".join(group_lines(group, results[group.name])))
    print()
    print("\n".join(release_lines(results)))
    if args.json:
        args.json.write_text(json.dumps([r.as_json() for rows in results.values() for r in rows], indent=1) + "\n")
    if args.write_bands:
        BANDS_FILE.write_text(json.dumps(bands_document(results), indent=1) + "\n")
        print(f"bands: {BANDS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
