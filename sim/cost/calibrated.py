"""Measured collective times from a hardware profile's collective_table, interpolated in message size.

For one (op, ranks) the measured points (nbytes, time) are sorted by size (repeated sizes averaged):
- between two neighbours: time is linear in log(bytes),
      t = t0 + (t1 - t0) (ln b - ln b0) / (ln b1 - ln b0);
- above the largest point: linear in bytes along the last segment's slope (bandwidth-bound regime),
      t = t1 + (b - b1) (t1 - t0) / (b1 - b0), the slope clamped at >= 0;
- below the smallest point: linear in bytes along the first segment, floored at the proportional
  time t0 b / b0 (a negative intercept from noisy points cannot make a collective free);
- a single point: t0 below it (latency floor), t0 b / b0 above it (its bus bandwidth).
None when no point has this op and rank count: the analytic model (sim/collectives) applies.
"""

from __future__ import annotations

import math
from collections import defaultdict

from meshsim.scenarios.profile import HardwareProfile
from meshsim.sim.core.units import US


def _points(profile: HardwareProfile, op: str, ranks: int) -> list[tuple[int, float]]:
    """(nbytes, mean time_s) of the matching points, sorted by size."""
    by_size: dict[int, list[float]] = defaultdict(list)
    for p in profile.collective_table:
        if p.op == op and p.ranks == ranks:
            by_size[p.nbytes].append(p.time_us * US)
    return sorted((b, sum(ts) / len(ts)) for b, ts in by_size.items())


def _interpolate(points: list[tuple[int, float]], nbytes: int) -> float:
    (b0, t0), (b1, t1) = points[0], points[-1]
    if len(points) == 1:
        return t0 if nbytes <= b0 else t0 * nbytes / b0
    if nbytes <= b0:
        slope = max(0.0, (points[1][1] - t0) / (points[1][0] - b0))
        return max(t0 - slope * (b0 - nbytes), t0 * nbytes / b0)
    if nbytes >= b1:
        bp, tp = points[-2]
        slope = max(0.0, (t1 - tp) / (b1 - bp))
        return t1 + slope * (nbytes - b1)
    for (lo_b, lo_t), (hi_b, hi_t) in zip(points, points[1:], strict=False):
        if lo_b <= nbytes <= hi_b:
            frac = math.log(nbytes / lo_b) / math.log(hi_b / lo_b)
            return lo_t + (hi_t - lo_t) * frac
    raise AssertionError("unreachable: nbytes inside the table range")


def table_collective_time_s(profile: HardwareProfile | None, op: str, ranks: int, nbytes: int) -> float | None:
    """Interpolated measured time of `op` over `ranks` ranks for `nbytes`, or None without a match."""
    if profile is None or nbytes <= 0:
        return None
    points = _points(profile, op, ranks)
    if not points:
        return None
    return _interpolate(points, nbytes)
