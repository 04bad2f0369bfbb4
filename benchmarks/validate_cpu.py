"""Simulated vs measured step time on this CPU (gloo), for a few scenarios shrunk to 2 processes.

Each trial is a whole `meshsim validate` cross-check: calibrate this machine on the shrunk schedule's
works (validate/calibrate.py) -> simulate the shrunk scenario with that profile -> run it for real as
scheduled (validate/timing.py) -> error = (simulated - measured) / measured. The target is |error| <= 10%;
a shared, loaded CPU adds run-to-run noise (gloo latencies are heavy-tailed), so every case runs
`--trials` times and the median error is reported with the spread. "serial" is the simulated rank's busy
time without any overlap: on a CPU, gloo's work shares the cores with the compute, so communication the
simulator overlaps (as NCCL does on a GPU) is not free here (validate/crosscheck.py).

    python benchmarks/validate_cpu.py [--trials 3] [--nproc 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.validate.crosscheck import run_crosscheck

CASES = [  # (label, built-in scenario, overrides applied before shrinking)
    ("tiny tp2", "tiny-2gpu", {}),
    ("tiny tp2 + SP", "tiny-2gpu", {"parallel.sp": True}),
    ("tiny tp2 + SP + full recompute", "tiny-2gpu", {"parallel.sp": True, "parallel.recompute": "full"}),
    ("llama3-8b (swiglu, GQA) tp2 + SP", "llama3-8b-h200", {}),
    ("tiny dp2 (tp1)", "tiny-2gpu", {"parallel.tp": 1}),
]


def run_case(name: str, overrides: dict, nproc: int, repeats: int) -> dict:
    sc, src = load_scenario(name)
    if overrides:
        sc = with_overrides(sc, overrides, src)
    with tempfile.TemporaryDirectory() as tmp:
        return run_crosscheck(sc, src, nproc, out_dir=tmp, repeats=repeats, numerics=False).report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':34s} {'sim ms':>7s} {'serial':>7s} {'real ms':>7s}  {'error [trials]':24s} "
          f"{'serial error [trials]':24s}")
    summary = {"error_pct": [], "error_serial_pct": []}
    for label, name, overrides in CASES:
        reports = [run_case(name, overrides, args.nproc, args.repeats) for _ in range(args.trials)]
        cells = []
        for key in summary:
            errors = [r[key] for r in reports]
            summary[key].append(abs(statistics.median(errors)))
            cells.append(f"{statistics.median(errors):+6.1f}% [{', '.join(f'{e:+.0f}' for e in errors)}]")
        ms = [statistics.median(r[k] for r in reports) * 1e3
              for k in ("simulated_step_s", "simulated_serial_s", "measured_step_s")]
        print(f"{label:34s} {ms[0]:7.2f} {ms[1]:7.2f} {ms[2]:7.2f}  {cells[0]:24s} {cells[1]:24s}")
    for key, errs in summary.items():
        print(f"{key}: {sum(e <= 10.0 for e in errs)} of {len(errs)} cases within 10% (median of {args.trials} "
              f"trials); median |error| {statistics.median(errs):.1f}%")


if __name__ == "__main__":
    main()
