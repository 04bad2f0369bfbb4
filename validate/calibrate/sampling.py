"""Timed samples of a list of runs, in rounds, and their reduction over ranks (calibration and kappa)."""

from __future__ import annotations

import statistics
import time

WARMUP, REPEATS = 3, 30


def round_robin_samples_s(items: list[tuple[object, object]], sync, repeats: int = REPEATS) -> list[list[float]]:
    """`repeats` timed samples (seconds) of each (run, barrier-or-None) item, after WARMUP rounds.

    Rounds cycle through all items, as a step does, so an item does not find its operands hot in cache
    from its own previous run."""
    samples: list[list[float]] = [[] for _ in items]
    for round_ in range(WARMUP + repeats):
        for i, (run, barrier) in enumerate(items):
            if barrier is not None:
                barrier()
            start = time.perf_counter()
            run(False)
            sync()
            if round_ >= WARMUP:
                samples[i].append(time.perf_counter() - start)
    return samples


def reduce_samples(per_rank: list[list[list[float]]], collective: bool) -> list[float]:
    """Per item: each round's samples reduced over ranks (min for a collective: the last rank out of
    the barrier waits for nobody, so its time is the collective's own; mean for compute), then the
    mean over rounds. The mean, not the median: nccl-tests reports the mean, and a step is a sum of
    many ops, so its time tracks the sum of their means even when single runs are heavy-tailed (as
    gloo's are on a shared CPU)."""
    out = []
    for item in zip(*per_rank, strict=True):
        rounds = [min(vals) if collective else statistics.fmean(vals) for vals in zip(*item, strict=True)]
        out.append(statistics.fmean(rounds))
    return out
