"""How noisy a measurement was, and whether a calibrated profile may be written from it.

A profile is the mean of repeated timings (validate/calibrate/sampling.py). On a machine where other
processes compete for the cores, some repeats are stretched by time slices given to someone else; their
mean then prices the load, not this machine, and a profile calibrated that way mispredicts the step by
+166% to +465% (issue 43, a busy 2-core VM; 2.4% when quiet). The symptom is measurable: repeats of the
same work stop agreeing.

Measure (pure functions, no torch, so a test can inject timings):
- spread(xs) = (p90 - p10) / median of repeated timings of the same work (inclusive quantiles; robust to
  one stray repeat, unlike max / min);
- a calibration's timings come in rounds, each round every measured item once (like one step);
  round_totals sums a round (the mean over ranks for compute and memory kernels, the min over ranks for a
  collective, as reduce_samples reduces them), and calibration_noise takes the spread of those totals per
  phase (compute, memory, collectives) and keeps the largest;
- a cross-check's spread is that of its timed steps (the max over ranks of each step);
- load_per_core: the 1-minute load average over the cores (os.getloadavg / os.cpu_count), read before
  the workers start. Above 1, runnable processes outnumber cores and every timing waits for a core.
The refusal is on the measured spread (what the profile is made of); the load is reported beside it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from meshsim.sim.core.errors import EXIT_USER_ERROR, CommandFailed

# The bound on the spread (p90 - p10) / median of a calibration's round totals beyond which no profile is
# written. A quiet 2-core VM measures below it (docs/validate.md, "Noise"); a busy one well above.
MAX_SPREAD = 0.30
ACCEPT_FLAG = "--accept-noise"
PHASES = ("compute", "memory", "collectives")


@dataclass(frozen=True)
class Noise:
    """The spread of repeated timings (the largest over `what`'s phases) and the load they ran under."""

    spread: float  # (p90 - p10) / median
    what: str  # which timings: "compute rounds", "timed steps", ...
    samples: int  # repeats the spread is taken over
    load_per_core: float | None  # 1-minute load average / cores before measuring; None where unknown
    cores: int

    def too_noisy(self, bound: float = MAX_SPREAD) -> bool:
        return self.spread > bound

    def describe(self) -> str:
        """'spread 42% over 30 compute rounds; load 3.1 per core (2 cores)'."""
        load = "" if self.load_per_core is None else f"; load {self.load_per_core:.1f} per core ({self.cores} cores)"
        return f"spread {self.spread:.0%} over {self.samples} {self.what}{load}"

    def as_record(self) -> dict:
        return {"spread": self.spread, "what": self.what, "samples": self.samples,
                "load_per_core": self.load_per_core, "cores": self.cores, "max_spread": MAX_SPREAD}


def spread(samples_s: Sequence[float]) -> float:
    """(p90 - p10) / median of repeated timings of the same work; 0 for fewer than 2 or a zero median."""
    if len(samples_s) < 2:
        return 0.0
    deciles = statistics.quantiles(samples_s, n=10, method="inclusive")
    middle = statistics.median(samples_s)
    return (deciles[-1] - deciles[0]) / middle if middle > 0 else 0.0


def load_per_core() -> tuple[float | None, int]:
    """(1-minute load average / cores, cores); the load is None where the OS does not report one."""
    cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / cores, cores
    except (OSError, AttributeError):
        return None, cores


def round_totals(per_rank: Sequence[Sequence[Sequence[float]]], collective: bool) -> list[float]:
    """per_rank[rank][item][round] -> per round, the sum over items of the item's time reduced over ranks
    (min for a collective, mean otherwise: validate/calibrate/sampling.py reduce_samples)."""
    reduce = min if collective else statistics.fmean
    rounds = len(per_rank[0][0]) if per_rank and per_rank[0] else 0
    return [sum(reduce([rank[item][k] for rank in per_rank]) for item in range(len(per_rank[0])))
            for k in range(rounds)]


def calibration_noise(per_rank: Sequence[dict], load: tuple[float | None, int]) -> Noise:
    """The noisiest phase of a calibration's samples (per_rank: the workers' results of task "calibrate")."""
    worst = Noise(0.0, "rounds", 0, *load)
    for phase in PHASES:
        totals = round_totals([r[phase] for r in per_rank], collective=phase == "collectives")
        candidate = Noise(spread(totals), f"{phase} rounds", len(totals), *load)
        if candidate.spread >= worst.spread:
            worst = candidate
    return worst


def step_noise(step_s: Sequence[float], load: tuple[float | None, int]) -> Noise:
    """The spread of a cross-check's timed steps."""
    return Noise(spread(step_s), "timed steps", len(step_s), *load)


def refuse_noisy_profile(noise: Noise, accept: bool) -> None:
    """Raise one line (exit 2) naming the spread, the bound and the way out, unless `accept`."""
    if accept or not noise.too_noisy():
        return
    raise CommandFailed(
        f"not writing a calibrated profile: the timings disagree, {noise.describe()}, beyond the bound of "
        f"{MAX_SPREAD:.0%}; other processes are competing for the cores and the profile would price them. "
        f"Fix: rerun when the machine is quiet (fewer --nproc than free cores), or pass {ACCEPT_FLAG} to write "
        "it anyway", EXIT_USER_ERROR)


def noisy_step_warning(noise: Noise) -> str | None:
    """The line a cross-check prints when its own timed steps disagree beyond the bound, else None."""
    if not noise.too_noisy():
        return None
    return (f"measured under noise: {noise.describe()}, beyond the bound of {MAX_SPREAD:.0%}; the error above "
            "is mostly this machine's load, not the model's (rerun when the machine is quiet)")
