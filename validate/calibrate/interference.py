"""Calibrating kappa, the compute/communication interference (sim/engine/events.py, docs/cost-models.md).

The engine's model: while a compute op and a collective's bandwidth part overlap on a rank, the rank's
compute resource (capacity 1) carries load 1 + kappa, so max-min sharing gives both the rate 1/(1+kappa);
alone each runs at full speed. A compute op of g seconds and a collective of c seconds started together
therefore take

    t_both = max(g, c) + kappa min(g, c)        (the shorter ends at min (1 + kappa); the longer's
                                                  remaining max - min then runs alone)
so  kappa = clamp((t_both - max(g, c)) / min(g, c), 0, 1)                        (`kappa_from_times`).

Measured on every rank at once, as a step runs (the task "calibrate", validate/calibrate/calibration.py):
- g: a representative GEMM alone: the schedule's largest (most FLOPs), with the executor's kernel;
- c: a representative collective alone, after a barrier on its group: the schedule's most frequent
  collective kind on the TP group (the DP group when tp = 1);
- t_both: both, overlapped the way the executor overlaps them (validate/timing/worker.py, scheduled_step_cpu):
  the collective issued asynchronously, the GEMM run, then the wait; after a barrier on the group.
Sizes: the collective keeps the schedule's own size (the overlaps a step really has); the compute side
is the GEMM run n = round(COVER c / g) times back to back (1 <= n <= MAX_GEMMS), so that it covers the
collective in most rounds. Why: with the compute side's time g steady (GEMM times are tight), t_both =
f(c) = max(g, c) + kappa min(g, c) is increasing in c, so median(t_both) = f(median(c)) whatever c's
distribution, and = g + kappa median(c) once g >= median(c). Sizing the compute side, not the collective,
keeps the sizes from being random variables: on a loaded CPU gloo's times are bimodal (trying c = g by
resizing the collective swung kappa between 0 and 0.9 from run to run). Only when c < g / SIZE_RANGE is
the collective grown instead, by g / (COVER c), so that the signal kappa c stands out of g's noise and
the collective's latency part, which the model does not load, is a small fraction of c. The g and c of
these decisions are medians of SIZING_REPEATS runs averaged over all ranks by an all-reduce, so every
rank decides alike.
Reduction: per round, the mean over ranks for g and the min over ranks for c and t_both (the last rank
out of the barrier waits for nobody; calibrate.reduce_samples' rule); then the median over ROUNDS rounds
of each. Medians, not the means the tables use: kappa is a difference of two times, and gloo's
heavy-tailed collectives (a 256 KiB all-reduce on this 2-core VM: median ~0.5 ms, a third of the calls
2-5 ms) move the mean of c by more than the whole effect; the median measures the typical overlap.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import torch
import torch.distributed as dist

from meshsim.sim.schedule.ops import Collective, Gemm, Schedule
from meshsim.validate.calibrate.sampling import round_robin_samples_s
from meshsim.validate.timing.executor import Device, Runners

ROUNDS = 200  # timed rounds of (g, c, t_both): 200 x ~4 ms on a CPU; seconds at most
SIZING_REPEATS = 15
SIZE_RANGE = 4.0  # the collective is grown only when c < g / 4
COVER = 2.0  # the compute side is made about 2 c long
MAX_GEMMS = 64  # most GEMMs run back to back to cover a long collective
MIN_BYTES, MAX_BYTES = 1 << 10, 1 << 28  # clamp of the rescaled collective: 1 KiB .. 256 MiB


def kappa_from_times(g_s: float, c_s: float, both_s: float) -> float:
    """kappa = clamp((t_both - max(g, c)) / min(g, c), 0, 1) (module docstring)."""
    lo, hi = min(g_s, c_s), max(g_s, c_s)
    if lo <= 0:
        return 0.0
    return min(1.0, max(0.0, (both_s - hi) / lo))


def kappa_note(g_s: float, c_s: float, both_s: float, kappa: float | None = None) -> str:
    """What the three medians say, in words, beside the kappa written to the profile (`kappa`; default
    kappa_from_times of the medians): a clamped kappa is named as such, with what the measurement showed
    instead of a bare 0 or 1."""
    lo, hi = min(g_s, c_s), max(g_s, c_s)
    kappa = kappa_from_times(g_s, c_s, both_s) if kappa is None else kappa
    if lo <= 0:
        return "kappa 0: a part took no measurable time, so there was no overlap to measure"
    if both_s < c_s:
        return (f"the overlapped run ({both_s * 1e3:.3f} ms) was faster than the collective alone "
                f"({c_s * 1e3:.3f} ms): overlapping slowed nothing measurably, so kappa is 0 (the simulator "
                "overlaps compute and communication at full speed); the collective's own time varies by more "
                "than the effect (gloo's times are heavy-tailed on a loaded CPU)")
    if both_s < hi:
        return (f"the overlapped run ({both_s * 1e3:.3f} ms) was faster than its longer part alone "
                f"({hi * 1e3:.3f} ms): no measurable interference, so kappa is 0 (full-speed overlap)")
    if (both_s - hi) / lo > 1:
        return (f"the overlapped run ({both_s * 1e3:.3f} ms) was slower than both parts back to back "
                f"({(g_s + c_s) * 1e3:.3f} ms): kappa is clamped to 1 (the two share the compute resource "
                "fully: overlapping gains nothing)")
    return (f"kappa {kappa:.3f}: while they overlap, compute and communication each run at 1/(1 + kappa) = "
            f"{100 / (1 + kappa):.0f}% of their speed alone")


def representative(schedule: Schedule) -> tuple[Gemm, str, str, int] | None:
    """(largest GEMM, collective kind, group name, starting nbytes) or None when nothing can overlap:
    the most frequent collective kind of the TP group (else the DP group), at its largest size."""
    gemms = [op.work for op in schedule.ops if isinstance(op.work, Gemm)]
    group = "tp" if schedule.tp > 1 else "dp" if schedule.dp > 1 else None
    colls = [op.work for op in schedule.ops if isinstance(op.work, Collective) and op.work.group == group]
    if not gemms or not colls:
        return None
    kind = Counter(c.op for c in colls).most_common(1)[0][0]
    nbytes = max(c.nbytes for c in colls if c.op == kind)
    return max(gemms, key=lambda g: g.flops), kind, group, nbytes


def _median_s(run, sync, barrier=None, repeats: int = SIZING_REPEATS) -> float:
    samples = []
    for _ in range(repeats):
        if barrier is not None:
            barrier()
        start = time.perf_counter()
        run(False)
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _sizes(gemm, make_coll, nbytes: int, dev: Device, sync, barrier) -> tuple[int, int]:
    """(GEMMs back to back n, collective nbytes) so that n g ~ COVER c (module docstring); the figures
    are averaged over all ranks, so every rank decides the same."""
    g_s, c_s = _median_s(gemm, sync), _median_s(make_coll(nbytes), sync, barrier)
    figures = torch.tensor([g_s, c_s], dtype=torch.float64, device=dev.device)
    dist.all_reduce(figures)
    g_s, c_s = figures.tolist()
    if c_s < g_s / SIZE_RANGE:
        return 1, int(min(MAX_BYTES, max(MIN_BYTES, round(nbytes * g_s / (COVER * c_s)))))
    return max(1, min(MAX_GEMMS, round(COVER * c_s / g_s))), nbytes


def repeated(gemm, n: int):
    """n runs of the GEMM back to back: the compute side of the measurement."""
    def run(async_op=False):
        for _ in range(n):
            gemm(False)
    return run


def overlapped(coll, gemm):
    """The executor's overlap: the collective issued async, the GEMM run, then the wait."""
    def run(async_op=False):
        handle = coll(True)
        gemm(False)
        if handle is not None:
            handle.wait()
    return run


def interference_samples(schedule: Schedule, dev: Device, groups: dict, sync) -> dict | None:
    """This rank's samples of [g, c, t_both] per round (seconds) and what was measured; None when the
    schedule has nothing to overlap. `groups`: group size -> this rank's process group of that size."""
    rep = representative(schedule)
    if rep is None:
        return None
    gemm_work, kind, group_name, nbytes = rep
    size = schedule.tp if group_name == "tp" else schedule.dp
    group = groups.get(size)
    if group is None:  # no consecutive block of that size in this world
        return None
    runners = Runners(dev, {"tp": group})
    gemm = runners(gemm_work)

    def barrier():
        dist.barrier(group=group)

    gemms, nbytes = _sizes(gemm, lambda n: runners(Collective(kind, "tp", n)), nbytes, dev, sync, barrier)
    compute, coll = repeated(gemm, gemms), runners(Collective(kind, "tp", nbytes))
    items = [(compute, None), (coll, barrier), (overlapped(coll, compute), barrier)]
    samples = round_robin_samples_s(items, sync, repeats=ROUNDS)
    return {"gemm": [gemm_work.m, gemm_work.n, gemm_work.k, gemm_work.batch], "gemms": gemms, "op": kind,
            "ranks": size, "nbytes": nbytes, "samples": samples}


def kappa_for_table(g_s: float, c_median_s: float, c_mean_s: float, both_s: float) -> float:
    """kappa in the units the engine applies it in: clamp((t_both - max(g, c)) / min(g, c_mean), 0, 1).

    The engine charges kappa x the collective's time from the profile's collective_table, and the table
    holds the mean over rounds (calibrate.reduce_samples), while the overlap's cost is measured on a
    typical (median) round. On a loaded CPU gloo's times are heavy-tailed (a 600 KB all-gather on this
    2-core VM: median 0.7 ms, table mean 2.5 ms): the tail is waiting (peer and scheduler wake-ups), which
    costs an overlapped GEMM nothing, so kappa_from_times' extra / median(c) applied to mean(c) charged
    the compute mean / median (3-4x) the extra the overlap really cost. Dividing the same extra by the
    statistic it will be multiplied with makes kappa x c_table equal the measured extra. Where mean =
    median (steady collectives, a GPU) this is kappa_from_times."""
    lo, hi = min(g_s, c_mean_s), max(g_s, c_median_s)
    if lo <= 0:
        return 0.0
    return min(1.0, max(0.0, (both_s - hi) / lo))


def reduce_interference(per_rank: list[dict | None]) -> tuple[float, dict[str, float], str] | None:
    """(kappa, {g_s, c_s, both_s} medians and c_mean_s, a one-line record) from every rank's
    interference_samples; kappa = kappa_for_table (the extra over the collective's table statistic)."""
    if any(r is None for r in per_rank):
        return None
    rounds = {}
    for i, (name, over_ranks) in enumerate((("g_s", statistics.fmean), ("c_s", min), ("both_s", min))):
        per_round = [over_ranks(vals) for vals in zip(*(r["samples"][i] for r in per_rank), strict=True)]
        rounds[name] = statistics.median(per_round)
        if name == "c_s":  # the table's statistic: per round the min over ranks, then the mean over rounds
            rounds["c_mean_s"] = statistics.fmean(per_round)
    median_kappa = kappa_from_times(rounds["g_s"], rounds["c_s"], rounds["both_s"])
    kappa = kappa_for_table(rounds["g_s"], rounds["c_s"], rounds["c_mean_s"], rounds["both_s"])
    r0 = per_rank[0]
    m, n, k, batch = r0["gemm"]
    record = (f"gemm {batch}x{m}x{n}x{k} x{r0['gemms']} {rounds['g_s'] * 1e3:.3f} ms, {r0['op']} on {r0['ranks']} ranks "
              f"{r0['nbytes']} B {rounds['c_s'] * 1e3:.3f} ms (mean {rounds['c_mean_s'] * 1e3:.3f}), overlapped "
              f"{rounds['both_s'] * 1e3:.3f} ms -> kappa {kappa:.3f} over c's mean ({median_kappa:.3f} over its median; "
              f"medians of {len(r0['samples'][0])} rounds); "
              + kappa_note(rounds["g_s"], rounds["c_s"], rounds["both_s"], kappa))
    return kappa, rounds, record
