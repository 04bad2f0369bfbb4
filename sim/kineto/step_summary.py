"""One rank's step as measured: busy time by class and category, communication not hidden by compute,
idle time, collectives with their bus bandwidth, GEMMs with their throughput.

With |X| the length of the union of a set of intervals (overlaps counted once, across streams):
- span = the step's window (sim/kineto/kernels.py step_windows); busy times use the kernels overlapping
  it, cut to it; counts, sums, collectives and GEMMs the kernels that start in it;
- busy[class] = |kernels of the class|; compute_busy = |compute kernels|, comm_busy = |comm kernels|;
- exposed_comm = |comm U compute| - |compute|: communication time during which no compute kernel runs
  (HTA's comm/comp overlap, hta/analyzers/communication_analysis.py, reads the same intervals);
- idle = span - |all kernels| (HTA's temporal breakdown, hta/analyzers/breakdown_analysis.py
  get_temporal_breakdown: kernel time minus merged kernel run time; HolisticTraceAnalysis f4d0062).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from meshsim.sim.kineto.classify import category
from meshsim.sim.kineto.kernels import Kernel
from meshsim.sim.kineto.shapes import GemmShape

US = 1e-6


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


@dataclass(frozen=True)
class CollectiveRow:
    op: str
    nbytes: int
    group: int | None
    dtype: str
    count: int
    mean_us: float
    min_us: float
    busbw_gbps: float | None  # of the mean time
    algo: str = ""
    protocol: str = ""
    pg: str = ""
    assumed_group: bool = False


@dataclass(frozen=True)
class GemmRow:
    shape: GemmShape
    count: int
    mean_us: float

    @property
    def tflops(self) -> float:
        return self.shape.flops / (self.mean_us * US) / 1e12 if self.mean_us > 0 else 0.0


@dataclass(frozen=True)
class StepSummary:
    rank: int
    step: int | None
    start_us: float
    span_s: float
    busy_s: dict[str, float]  # per class (union)
    sum_s: dict[str, float]  # per class, sum of kernel durations
    count: dict[str, int]
    compute_busy_s: float
    comm_busy_s: float
    memory_busy_s: float
    all_busy_s: float
    exposed_comm_s: float
    idle_s: float
    collectives: tuple[CollectiveRow, ...]
    gemms: tuple[GemmRow, ...]
    labels: dict[str, tuple[float, int]] = field(default_factory=dict)  # meshsim op name -> (sum s, count)
    critical_path: dict[str, float] = field(default_factory=dict)  # HTA bound_by -> seconds

    @property
    def kernels(self) -> int:
        return sum(self.count.values())


def _spans(kernels: Iterable[Kernel]) -> list[tuple[float, float]]:
    return [(k.ev.ts, k.ev.end) for k in kernels]


def collective_rows(kernels: Sequence[Kernel], durations_us: Sequence[float] | None = None) -> tuple[CollectiveRow, ...]:
    """Communication kernels grouped by (op, bytes, group, dtype); `durations_us` replaces each kernel's
    own duration (the minimum over ranks, sim/kineto/ranks.py)."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    first: dict[tuple, Kernel] = {}
    for i, k in enumerate(kernels):
        c = k.coll
        key = (c.op, c.nbytes, c.group, c.dtype)
        groups[key].append(durations_us[i] if durations_us is not None else k.ev.dur)
        first.setdefault(key, k)
    rows = []
    for key, durs in groups.items():
        c = first[key].coll
        mean = sum(durs) / len(durs)
        rows.append(CollectiveRow(c.op, c.nbytes, c.group, c.dtype, len(durs), mean, min(durs), c.busbw_gbps(mean),
                                  c.algo, c.protocol, c.pg, c.assumed_group))
    return tuple(sorted(rows, key=lambda r: (r.op, r.group or 0, r.nbytes)))


def gemm_rows(kernels: Iterable[Kernel]) -> tuple[GemmRow, ...]:
    by_shape: dict[GemmShape, list[float]] = defaultdict(list)
    for k in kernels:
        if k.gemm is not None:
            by_shape[k.gemm].append(k.ev.dur)
    return tuple(sorted((GemmRow(s, len(d), sum(d) / len(d)) for s, d in by_shape.items()),
                        key=lambda r: -r.count * r.mean_us))


def summarize_step(rank: int, step: int | None, window: tuple[float, float], started: Sequence[Kernel],
                   inside: Sequence[Kernel], comm_us: Sequence[float] | None = None) -> StepSummary:
    """The StepSummary of one rank's step: `started` are the kernels that start in `window`, `inside` every
    kernel overlapping it cut to it (formulas in the module docstring); `comm_us` replaces the durations of
    the started communication kernels (in order) for their rows."""
    by_class: dict[str, list[Kernel]] = defaultdict(list)
    for k in inside:
        by_class[k.cls].append(k)
    cats: dict[str, list[Kernel]] = defaultdict(list)
    for cls, ks in by_class.items():
        cats[category(cls)].extend(ks)
    labels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    started_by: dict[str, list[Kernel]] = defaultdict(list)
    for k in started:
        started_by[k.cls].append(k)
        if k.label:
            slot = labels[k.label]
            slot[0] += k.ev.dur * US
            slot[1] += 1
    compute, comm = _spans(cats["compute"]), _spans(cats["comm"])
    compute_us, all_us = union_us(compute), union_us(_spans(inside))
    span = (window[1] - window[0]) * US
    return StepSummary(
        rank=rank, step=step, start_us=window[0], span_s=span,
        busy_s={c: union_us(_spans(ks)) * US for c, ks in by_class.items()},
        sum_s={c: sum(k.ev.dur for k in ks) * US for c, ks in started_by.items()},
        count={c: len(ks) for c, ks in started_by.items()},
        compute_busy_s=compute_us * US, comm_busy_s=union_us(comm) * US,
        memory_busy_s=union_us(_spans(cats["memory"])) * US, all_busy_s=all_us * US,
        exposed_comm_s=(union_us(compute + comm) - compute_us) * US, idle_s=max(0.0, span - all_us * US),
        collectives=collective_rows([k for k in started if k.coll is not None], comm_us),
        gemms=gemm_rows(started), labels={name: (t, int(n)) for name, (t, n) in labels.items()})
