"""How close `meshsim run S --profile P` gets to a traced step when P is learnt from that trace.

    python benchmarks/trace_calibration.py [--scenario tiny-2gpu] [--nproc 2] [--trials 1]

Per trial: `meshsim validate S --nproc N --trace DIR` (gloo on this CPU; the traced steps are 3 extra
as-scheduled steps), `meshsim calibrate --from-trace DIR --scenario DIR/scenario.yaml`, then the shrunk
scenario simulated with the scenario's own hardware and with the learnt profile, each against the mean
traced step (rank 0, the 3 profiled steps). Prints the step times and errors. Not run by the tests
(tests/test_kineto_validate.py asserts only that calibration reduces the error).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.kineto.ranks import load_ranks, summaries
from meshsim.sim.results.simulate import simulate


def trial(scenario: str, nproc: int, tmp: Path) -> tuple[float, float, float]:
    """(traced step s, simulated with the scenario's hardware s, simulated with the learnt profile s)."""
    trace, profile = tmp / "trace", tmp / "profile.yaml"
    meshsim = [sys.executable, "-m", "meshsim.sim.cli.main"]
    subprocess.run(meshsim + ["validate", scenario, "--nproc", str(nproc), "--trace", str(trace), "--out",
                              str(tmp / "out")], check=True, capture_output=True)
    subprocess.run(meshsim + ["calibrate", "--from-trace", str(trace), "--scenario", str(trace / "scenario.yaml"),
                              "--out", str(profile)], check=True, capture_output=True)
    steps = [s for s in summaries(load_ranks([trace]), critical=False, min_over_ranks=False) if s.rank == 0]
    traced = statistics.fmean(s.span_s for s in steps)
    sc, source = load_scenario(trace / "scenario.yaml")
    plain = simulate(resolve(sc, source), full=True).step_time_s
    learnt = simulate(resolve(with_overrides(sc, {"hardware.profile": str(profile)}, source), source),
                      full=True).step_time_s
    return traced, plain, learnt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="tiny-2gpu")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    errors = []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            traced, plain, learnt = trial(args.scenario, args.nproc, Path(tmp))
        err = 100 * (learnt - traced) / traced
        errors.append(err)
        print(f"trial {i + 1}: traced step {traced * 1e3:.2f} ms; simulated with the scenario's hardware "
              f"{plain * 1e3:.2f} ms ({100 * (plain - traced) / traced:+.1f}%), with the profile learnt from the "
              f"trace {learnt * 1e3:.2f} ms ({err:+.1f}%)")
    if len(errors) > 1:
        print(f"median error with the learnt profile: {statistics.median(errors):+.1f}% over {len(errors)} trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
