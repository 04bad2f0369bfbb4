"""Each device event of a rank, classified (sim/kineto/classify.py) and tied to its launch, its collective
and its GEMM shape; and the steps they belong to.

Steps are time windows (HTA clips a trace to an annotation's span the same way): ProfilerStep#N's host
start to the next step's host start. Busy time inside a step counts every kernel overlapping the window,
cut to it, so busy + idle = the window; counts, collectives and GEMM rates take the kernels that start in
it. A trace without ProfilerStep spans is one step, "whole trace", over all its device events.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import NamedTuple

from meshsim.sim.kineto.classify import kernel_class
from meshsim.sim.kineto.collectives import CollectiveInfo, collective_info
from meshsim.sim.kineto.context import Launch, cpu_launches, gpu_launches
from meshsim.sim.kineto.records import DeviceEvent, RankTrace, Step
from meshsim.sim.kineto.shapes import GemmShape, gemm_shape


class Kernel(NamedTuple):
    ev: DeviceEvent
    cls: str
    launch: Launch
    coll: CollectiveInfo | None
    gemm: GemmShape | None

    @property
    def label(self) -> str | None:
        return self.launch.label


def default_group(rt: RankTrace) -> int | None:
    """The group size of a collective that records none (sim/kineto/collectives.py)."""
    sizes = {p.get("pg_size", 0) for p in rt.pg_config if p.get("pg_size", 0) > 1}  # ints (load.py checks)
    if len(sizes) == 1:
        return sizes.pop()
    return rt.world_size if isinstance(rt.world_size, int) and rt.world_size > 1 else None


def classify_rank(rt: RankTrace) -> list[Kernel]:
    """The rank's device events as Kernels, in start order."""
    launches = (cpu_launches if rt.cpu_device else gpu_launches)(rt.host, rt.device)
    group = default_group(rt)
    out = []
    for ev, launch in zip(rt.device, launches, strict=True):
        cls = kernel_class(ev.name, ev.cat)
        coll = shape = None
        if cls == "collective":
            coll = collective_info(ev, launch, group)
            cls = "p2p" if coll.p2p else cls
        elif cls == "gemm" and launch.shape_op is not None:
            shape = gemm_shape(launch.shape_op.name, launch.shape_op.dims)
        out.append(Kernel(ev, cls, launch, coll, shape))
    return out


def trace_steps(rt: RankTrace) -> tuple[Step, ...]:
    """The trace's ProfilerStep spans, else one step covering every device event."""
    if rt.steps:
        return rt.steps
    first = min(ev.ts for ev in rt.device)
    return (Step(None, first, max(ev.end for ev in rt.device) - first),)


def step_windows(steps: Sequence[Step]) -> list[tuple[float, float]]:
    """[start, end) of each step on the device timeline: from its host start to the next step's host start
    (the last: to its own end). In steady state host and device run at one rate, so a window is one step."""
    return [(s.ts, steps[i + 1].ts if i + 1 < len(steps) else s.end) for i, s in enumerate(steps)]


def kernels_in(kernels: Sequence[Kernel], window: tuple[float, float], starts: Sequence[float] | None = None
               ) -> list[Kernel]:
    """The kernels that start inside `window` (start order); `starts`: their starts, when the caller has
    them (one list per rank, not one per step)."""
    starts = [k.ev.ts for k in kernels] if starts is None else starts
    return list(kernels[bisect_left(starts, window[0]):bisect_left(starts, window[1])])


def clipped(kernels: Sequence[Kernel], window: tuple[float, float], starts: Sequence[float] | None = None,
            longest: float | None = None) -> list[Kernel]:
    """Every kernel overlapping `window`, its interval cut to the window (busy time inside a step);
    `starts` and `longest` (the longest duration) when the caller has them."""
    a, b = window
    longest = max((k.ev.dur for k in kernels), default=0.0) if longest is None else longest
    starts = [k.ev.ts for k in kernels] if starts is None else starts
    out = []
    for k in kernels[bisect_left(starts, a - longest):bisect_left(starts, b)]:
        ev = k.ev
        s, e = max(ev.ts, a), min(ev.ts + ev.dur, b)
        if e > s:  # a kernel inside the window is itself (its start the same object, its length equal)
            out.append(k if s is ev.ts and e - s == ev.dur else k._replace(ev=ev._replace(ts=s, dur=e - s)))
    return out
