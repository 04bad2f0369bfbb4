"""A set of per-rank traces: load them, check their clocks agree, summarize every (rank, step).

Clock check (one UserError, exit 2, when it fails): Kineto stamps events with each host's own clock,
so traces from different hosts are comparable only if those clocks agree. A collective cannot end on
one rank before it has started on another (every rank's kernel runs while the last one arrives), so the
k-th collective of the same (op, bytes) on two ranks must overlap in time:
    max(start_a, start_b) <= min(end_a, end_b) + CLOCK_SLACK_US.
When more than half of the matched collectives of a rank fail this against the lowest rank, its clock
is off by about the median difference of their ends (the ends of a collective coincide). Without
collectives, the same ProfilerStep#N must start within half a step on every rank.

Bus bandwidth over several ranks: the k-th collective's time is the minimum over ranks of its kernel
durations (the last rank to arrive waits for nobody, so its kernel time is the collective's own; what
validate's timing does with its barrier'd runs, docs/validate.md section 5).
"""

from __future__ import annotations

import gc
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from meshsim.sim.core.errors import FilePath, UserError
from meshsim.sim.kineto.critical_path import RankIndex, critical_path_breakdown
from meshsim.sim.kineto.jsonstream import Progress
from meshsim.sim.kineto.kernels import Kernel, classify_rank, clipped, kernels_in, step_windows, trace_steps
from meshsim.sim.kineto.load import RankRecords, rank_trace, read_rank
from meshsim.sim.kineto.records import RankTrace, Step
from meshsim.sim.kineto.spill import Window, split
from meshsim.sim.kineto.step_summary import StepSummary, summarize_step

CLOCK_SLACK_US = 50.0
TRACE_SUFFIXES = (".json", ".json.gz")
FIX_PATHS = "give trace files (.json or .json.gz) or folders of them, one file per rank"


@dataclass(frozen=True)
class RankData:
    trace: RankTrace
    kernels: tuple[Kernel, ...]
    starts: tuple[float, ...] = ()  # each kernel's start (us), in order
    longest_us: float = 0.0  # the longest kernel

    @classmethod
    def of(cls, trace: RankTrace) -> RankData:
        kernels = tuple(classify_rank(trace))
        return cls(trace, kernels, tuple(k.ev.ts for k in kernels), max((k.ev.dur for k in kernels), default=0.0))


def trace_files(paths: Sequence[str | Path]) -> list[Path]:
    """The trace files named: files as given, folders expanded to their *.json / *.json.gz files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise UserError("trace", FilePath(p), FIX_PATHS, problem="The folder holds no .json or .json.gz file")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise UserError("trace", FilePath(p), FIX_PATHS, problem="No such file or folder")
    return out


def load_ranks(paths: Sequence[str | Path], progress: Callable[[Path], Progress | None] | None = None
               ) -> list[RankData]:
    """Every rank's trace whole, classified, sorted by rank; two files of one rank are refused."""
    records = _read_all(trace_files(paths), progress, None)
    return _classified([rank_trace(rec, *rec.all_records()) for rec in records])


def _read_all(files: Sequence[Path], progress: Callable[[Path], Progress | None] | None,
              hold: int | None) -> list[RankRecords]:
    """One parse of each file (`hold`: records kept in memory per file, the rest spilled); sorted by rank,
    two files of one rank refused."""
    found: dict[int, RankRecords] = {}
    for path in files:
        rec = read_rank(path, progress(path) if progress else None, hold)
        if rec.rank in found:
            raise UserError("trace", FilePath(path), "give one trace file per rank",
                            problem=f"Rank {rec.rank} is also in {found[rec.rank].path}")
        found[rec.rank] = rec
    return [found[r] for r in sorted(found)]


def _classified(traces: Sequence[RankTrace]) -> list[RankData]:
    ranks = [RankData.of(rt) for rt in traces]
    check_clocks(ranks)
    return ranks


def _collectives(data: RankData) -> list[Kernel]:
    return [k for k in data.kernels if k.coll is not None and not k.coll.p2p]


def _matched(a: Sequence[Kernel], b: Sequence[Kernel]) -> list[tuple[Kernel, Kernel]]:
    """Pairs (k-th of a, k-th of b) when both ranks ran the same collectives in the same order."""
    key = [(k.coll.op, k.coll.nbytes) for k in a]
    return list(zip(a, b, strict=True)) if key == [(k.coll.op, k.coll.nbytes) for k in b] else []


def check_clocks(ranks: Sequence[RankData]) -> None:
    """Raise a UserError when a rank's clock disagrees with the lowest rank's (module docstring)."""
    if len(ranks) < 2:
        return
    ref = ranks[0]
    ref_coll = _collectives(ref)
    for other in ranks[1:]:
        pairs = _matched(ref_coll, _collectives(other))
        if pairs:
            bad = sum(max(a.ev.ts, b.ev.ts) > min(a.ev.end, b.ev.end) + CLOCK_SLACK_US for a, b in pairs)
            if bad * 2 > len(pairs):
                offset = statistics.median(b.ev.end - a.ev.end for a, b in pairs)
                raise _skew(other, ref, f"{bad} of its {len(pairs)} collectives do not overlap rank {ref.trace.rank}'s "
                            f"(its clock is about {offset / 1e3:+.3f} ms off)")
            continue
        steps = {s.number: s for s in ref.trace.steps}
        for s in other.trace.steps:
            mine = steps.get(s.number)
            if mine is not None and abs(s.ts - mine.ts) > 0.5 * max(s.dur, mine.dur):
                raise _skew(other, ref, f"its ProfilerStep#{s.number} starts {(s.ts - mine.ts) / 1e3:+.3f} ms from "
                            f"rank {ref.trace.rank}'s")


def _skew(other: RankData, ref: RankData, what: str) -> UserError:
    return UserError("trace", FilePath(other.trace.path), "trace ranks whose host clocks are synchronized (NTP / PTP), or "
                     "summarize each rank's file on its own", problem=f"Clock-skewed ranks: rank {other.trace.rank}: {what}")


def min_over_ranks_us(ranks: Sequence[RankData]) -> dict[int, list[float]] | None:
    """rank -> the duration of each of its collectives replaced by the minimum over ranks (module
    docstring), when every rank ran the same collectives; else None."""
    seqs = [_collectives(r) for r in ranks]
    if len(ranks) < 2 or any(not _matched(seqs[0], s) for s in seqs[1:]) or not seqs[0]:
        return None
    mins = [min(s[i].ev.dur for s in seqs) for i in range(len(seqs[0]))]
    return {r.trace.rank: mins for r in ranks}


def all_summaries(paths: Sequence[str | Path], progress: Callable[[Path], Progress | None] | None = None,
                  step: int | None = None, critical: bool = True, budget: int | None = None
                  ) -> tuple[list[RankData], list[StepSummary]]:
    """(the last batch's ranks, every (rank, step) summary), the traces read in bounded batches (windowed)."""
    ranks, out = [], []
    with paused_gc():
        for ranks, only in windowed(paths, progress, step, budget or MAX_KEPT_EVENTS):
            out += summaries(ranks, step, critical, only)
    return ranks, out


def load_for(paths: Sequence[str | Path], progress: Callable[[Path], Progress | None] | None = None,
             step: int | None = None) -> list[RankData]:
    """The traces whole, or only ProfilerStep#step's window when a step is named (bounded memory)."""
    with paused_gc():
        if step is None:
            return load_ranks(paths, progress)
        return next(windowed(paths, progress, step))[0]


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while traces are read: they allocate millions of acyclic
    tuples, and every full collection walks all of them (~25% of the reading time at 50 MB, measured
    with gc on and off in one session); reference counting still frees every record as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def summaries(ranks: Sequence[RankData], step: int | None = None, critical: bool = True,
              only: set[int] | None = None, min_over_ranks: bool = True) -> list[StepSummary]:
    """One StepSummary per (rank, step) (`step`: only ProfilerStep#step), with HTA's critical-path
    breakdown unless `critical` is False (sim/kineto/critical_path.py); collective rows from the minimum
    over ranks (module docstring) unless `min_over_ranks` is False (each rank's own kernel times)."""
    mins = min_over_ranks_us(ranks) if min_over_ranks else None
    out = []
    for data in ranks:
        steps = trace_steps(data.trace)
        colls = _collectives(data)
        index = {id(k): i for i, k in enumerate(colls)}
        rank_index = RankIndex(data.trace.host, data.kernels) if critical else None
        for st, window in zip(steps, step_windows(steps), strict=True):
            if (step is not None and st.number != step) or (only is not None and st.number not in only):
                continue
            started = kernels_in(data.kernels, window, data.starts)
            comm_us = None
            if mins is not None:
                comm_us = [mins[data.trace.rank][index[id(k)]] if id(k) in index else k.ev.dur
                           for k in started if k.coll is not None]
            summary = summarize_step(data.trace.rank, st.number, window, started,
                                     clipped(data.kernels, window, data.starts, data.longest_us),
                                     comm_us)
            if critical:
                path = critical_path_breakdown(data.trace.host, started, data.kernels, window, rank_index)
                summary = replace(summary, critical_path=path)
            out.append(summary)
    if step is not None and not out:
        found = sorted({s.number for d in ranks for s in d.trace.steps if s.number is not None})
        raise UserError("--step", step, f"give one of the traced steps: {', '.join(map(str, found)) or 'none'}",
                        problem="No such ProfilerStep in the trace")
    return out


MAX_KEPT_EVENTS = 400_000  # records held at once (~1 KB each with their kernels and launches): larger traces are
# spilled to disk as they are parsed, then summarized per batch of steps (a 1 GB trace: peak RSS in benchmarks/trace_read.py)


def step_windows_of(steps: Sequence[Step], numbers: Sequence[int]) -> Window | None:
    """The span of the given steps, opened one step to the left (the kernels running into the first step
    and the launches of its first kernels) and to the next step's start on the right."""
    mine = [s for s in steps if s.number in numbers]
    if not mine:
        return None
    later = [s.ts for s in steps if s.ts > mine[-1].ts]
    return (mine[0].ts - mine[0].dur, later[0] if later else mine[-1].end)


def _batch_records(rec: RankRecords, windows: Sequence[Window]) -> Iterator[tuple[list, list]]:
    """(host, device) records of each window, in order: sliced from the records sorted by start when
    they are in memory, else from the spill split once by window (sim/kineto/spill.py)."""
    if rec.spill is None:
        host, device = sorted(rec.host, key=lambda r: r.ts), sorted(rec.device, key=lambda r: r.ts)
        hs, ds = [r.ts for r in host], [r.ts for r in device]
        for a, b in windows:
            yield (host[bisect_left(hs, a):bisect_right(hs, b)], device[bisect_left(ds, a):bisect_right(ds, b)])
        return
    parts = split(rec.spill, windows)
    rec.spill.close()
    for part in parts:
        records = part.records_back()
        part.close()
        yield records


def windowed(paths: Sequence[str | Path], progress: Callable[[Path], Progress | None] | None = None,
             step: int | None = None, budget: int = MAX_KEPT_EVENTS) -> Iterator[tuple[list[RankData], set[int] | None]]:
    """The traces in batches of steps, each batch (its ranks, its step numbers) held alone, so that about
    `budget` records are in memory whatever the files' size: each file is parsed once, its records beyond
    budget / files spilled to disk, then each batch takes its steps' windows. Traces that fit (or have
    no steps) come whole, in one batch (step numbers None: all)."""
    files = trace_files(paths)
    records = _read_all(files, progress, max(1, budget // len(files)))
    kept = sum(r.kept for r in records)
    if any(not r.steps for r in records) or (step is None and kept <= budget):
        yield _classified([rank_trace(rec, *rec.all_records()) for rec in records]), None
        return
    numbers = sorted(set.intersection(*({s.number for s in r.steps} for r in records)))
    if step is not None:
        if step not in numbers:
            raise UserError("--step", step, f"give one of the traced steps: {', '.join(map(str, numbers)) or 'none'}",
                            problem="No such ProfilerStep in every trace")
        numbers = [step]
    per_step = max(r.kept / len(r.steps) for r in records) * len(records)
    size = max(1, int(budget // max(per_step, 1.0)))
    batches = [numbers[i:i + size] for i in range(0, len(numbers), size)]
    parts = [_batch_records(rec, [step_windows_of(rec.steps, chunk) for chunk in batches]) for rec in records]
    for chunk in batches:
        yield _classified([rank_trace(rec, *next(part)) for rec, part in zip(records, parts, strict=True)]), set(chunk)
