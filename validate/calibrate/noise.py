"""How noisy a measurement was, and whether a calibrated profile may be written from it.

A profile is the mean of repeated timings (validate/calibrate/sampling.py). On a machine where other
processes compete for the cores, some repeats are stretched by time slices given to someone else; their
mean then prices the load, not this machine, and a profile calibrated that way mispredicts the step by
+166% to +465% (issue 43, a busy 2-core VM; 2.4% when quiet). The symptom is measurable: repeats of the
same work stop agreeing.

Measure (pure functions, no torch, so a test can inject timings):
- excess(xs) = mean(xs) / min(xs) - 1 over repeats of the same work: how far the mean, the figure a
  profile keeps, sits above the best repeat, the time the machine needs when nothing else runs. A
  repeat that lost time slices to another process raises the mean and not the minimum;
- a calibration's excess is time-weighted over the works a profile prices from their means, the compute
  works and the memory kernels (each round's sample reduced over ranks with the mean, as reduce_samples
  does): sum of means / sum of minima - 1. Collectives are reported apart and not judged: on gloo a
  collective's tail is waiting for the slower rank, which the timed step pays as well;
- a cross-check's excess is that of its timed steps (the max over ranks of each step);
- load_per_core: the 1-minute load average over the cores (os.getloadavg / os.cpu_count), read before
  the workers start. Above 1, runnable processes outnumber cores and every timing waits for a core.
  A machine loaded so evenly that every repeat is equally slow shows no excess: the load says so.
The refusal is on the measured excess (what the profile is made of); the load is reported beside it.
Measured on the 2-core project VM at load 6.2 per core: a calibration's excess 908% and the cross-check's
compute error +908% (docs/benchmarks.md, "Noise").
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from meshsim.sim.core.errors import EXIT_USER_ERROR, CommandFailed

# The bound on a calibration's excess (mean / best repeat - 1) beyond which no profile is written.
MAX_EXCESS = 0.5
ACCEPT_FLAG = "--accept-noise"
JUDGED = ("compute", "memory")  # phases whose means the profile keeps (collectives: see the module docstring)


@dataclass(frozen=True)
class Noise:
    """The excess of repeated timings over their best repeat, and the load they ran under."""

    excess: float  # mean / min - 1, time-weighted over `what`
    what: str  # which timings: "compute and memory kernels", "timed steps"
    samples: int  # repeats per work
    load_per_core: float | None  # 1-minute load average / cores before measuring; None where unknown
    cores: int
    collectives_excess: float | None = None  # reported, not judged

    def too_noisy(self, bound: float = MAX_EXCESS) -> bool:
        return self.excess > bound

    def describe(self) -> str:
        """'mean 320% above the best of 30 repeats of compute and memory kernels; load 2.8 per core (2 cores)'."""
        load = "" if self.load_per_core is None else f"; load {self.load_per_core:.1f} per core ({self.cores} cores)"
        colls = "" if self.collectives_excess is None else f" (collectives {self.collectives_excess:.0%})"
        return f"mean {self.excess:.0%} above the best of {self.samples} repeats of {self.what}{colls}{load}"

    def as_record(self) -> dict:
        return {"excess": self.excess, "what": self.what, "samples": self.samples,
                "load_per_core": self.load_per_core, "cores": self.cores,
                "collectives_excess": self.collectives_excess, "max_excess": MAX_EXCESS}


def excess(samples_s: Sequence[float]) -> float:
    """mean / min - 1 of repeated timings of the same work; 0 without samples or with a zero minimum."""
    return weighted_excess([samples_s])


def weighted_excess(items: Sequence[Sequence[float]]) -> float:
    """sum of the items' means / sum of their minima - 1: the excess of a sum of works, each weighed by its
    time (a 10 ms GEMM's slow repeats matter more than a 10 us kernel's)."""
    items = [xs for xs in items if xs]
    best = sum(min(xs) for xs in items)
    return sum(statistics.fmean(xs) for xs in items) / best - 1.0 if best > 0 else 0.0


def load_per_core() -> tuple[float | None, int]:
    """(1-minute load average / cores, cores); the load is None where the OS does not report one."""
    cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / cores, cores
    except (OSError, AttributeError):
        return None, cores


def over_ranks(per_rank: Sequence[Sequence[Sequence[float]]], collective: bool) -> list[list[float]]:
    """per_rank[rank][item][round] -> per item, each round's sample reduced over ranks (min for a
    collective, mean otherwise: validate/calibrate/sampling.py reduce_samples)."""
    reduce = min if collective else statistics.fmean
    return [[reduce(vals) for vals in zip(*(rank[item] for rank in per_rank), strict=True)]
            for item in range(len(per_rank[0]) if per_rank else 0)]


def calibration_noise(per_rank: Sequence[dict], load: tuple[float | None, int]) -> Noise:
    """The excess of a calibration's samples (per_rank: the workers' results of task "calibrate")."""
    judged = [item for phase in JUDGED for item in over_ranks([r[phase] for r in per_rank], collective=False)]
    colls = over_ranks([r["collectives"] for r in per_rank], collective=True)
    return Noise(weighted_excess(judged), "compute and memory kernels", max((len(x) for x in judged), default=0),
                 *load, collectives_excess=weighted_excess(colls) if colls else None)


def step_noise(step_s: Sequence[float], load: tuple[float | None, int]) -> Noise:
    """The excess of a cross-check's timed steps over its fastest."""
    return Noise(excess(step_s), "timed steps", len(step_s), *load)


def refuse_noisy_profile(noise: Noise, accept: bool) -> None:
    """Raise one line (exit 2) naming the excess, the bound and the way out, unless `accept`."""
    if accept or not noise.too_noisy():
        return
    raise CommandFailed(
        f"not writing a calibrated profile: the timings disagree, {noise.describe()}, beyond the bound of "
        f"{MAX_EXCESS:.0%}; other processes are competing for the cores and the profile would price them. "
        f"Fix: rerun when the machine is quiet (fewer --nproc than free cores), or pass {ACCEPT_FLAG} to write "
        "it anyway", EXIT_USER_ERROR)


def noisy_step_warning(noise: Noise) -> str | None:
    """The line a cross-check prints when its own timed steps disagree beyond the bound, else None."""
    if not noise.too_noisy():
        return None
    return (f"measured under noise: {noise.describe()}, beyond the bound of {MAX_EXCESS:.0%}; the error above "
            "is mostly this machine's load, not the model's (rerun when the machine is quiet)")
