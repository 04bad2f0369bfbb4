"""The host's clock with device-to-host syncs: when it issues each op (the engine only compares these
times with when an op is ready; sim/cost/host_dispatch.py gives the static clock).

Without syncs the host issues op i at static_s[i], its cumulative dispatch time, whatever the GPU does.
An op with `host_wait = y` (sim/schedule/ops.py) is issued after a sync: the host blocks until op y has
finished (y < the op's id: .item(), .tolist(), an event it synchronizes on) and issues on from there:

    h_j = max(h_{j-1}, end(y_j)) + dispatch_j           (end(y_j) = -inf for an op without a wait)

Unrolled, h_j = static_s[j] + D_j with D_j = max(0, max over syncs k <= j of end(y_k) - static_s[k - 1])
(static_s[-1] = 0): how much later than its static clock the latest binding sync released the host. D is
a running maximum over the syncs in id order; the engine extends it sync by sync as the awaited ops finish
(processes.py), the steady-state proof reads it back from a run's events (sim/results/period_proof.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import is_not

import numpy as np

from meshsim.sim.schedule.ops import Op, Schedule
from meshsim.sim.schedule.stamped_ops import op_column


@dataclass(frozen=True)
class HostSyncs:
    """One schedule's syncs: `point_of[i]` is the index of the last sync at or before op i (-1: none);
    per sync, the op that waits, the op it waits for, and the static clock when it starts waiting."""

    point_of: tuple[int, ...]
    ops: tuple[int, ...]
    awaited: tuple[int, ...]
    base_s: tuple[float, ...]


def host_syncs(ops: Sequence[Op], static_s: Sequence[float]) -> HostSyncs | None:
    """The syncs of a schedule whose host issues at `static_s` (per op id); None when it has none or no
    host model (static_s empty: every op issued at once). Read off the ops' host_wait and id columns
    (stamped_ops.op_column: a StampedOps builds no record), by C-level passes."""
    waits = op_column(ops, "host_wait")
    has_wait = list(map(is_not, waits, repeat(None)))
    if not any(has_wait) or not static_s:
        return None
    point_of = list(accumulate(has_wait, initial=-1))[1:]  # the syncs at or before each op, minus one
    ids = list(compress(op_column(ops, "id"), has_wait))
    bases = tuple(static_s[i - 1] if i else 0.0 for i in ids)
    return HostSyncs(tuple(point_of), tuple(ids), tuple(compress(waits, has_wait)), bases)


def schedule_syncs(schedule: Schedule, static_s: Sequence[float]) -> HostSyncs | None:
    """host_syncs(schedule.ops, static_s), read off the tiled host_wait column where the schedule has one
    (ids are positions; tests/test_ops_arrays.py compares the two), else off the ops."""
    tiled = schedule.tiled_arrays
    if tiled is None:
        return host_syncs(schedule.ops, static_s)
    wait = tiled.host_wait
    at = np.flatnonzero(wait >= 0)
    if not at.size or not static_s:
        return None
    point_of = np.cumsum(wait >= 0, dtype=np.intp) - 1  # the syncs at or before each op, minus one
    ops = at.tolist()
    bases = tuple(static_s[i - 1] if i else 0.0 for i in ops)
    return HostSyncs(tuple(point_of.tolist()), tuple(ops), tuple(wait[at].tolist()), bases)


def next_delay_s(prev_s: float, awaited_end_s: float, base_s: float) -> float:
    """D after one more sync: the running maximum (the first sync's prev_s is 0)."""
    return max(prev_s, awaited_end_s - base_s)


def delays_s(syncs: HostSyncs, end_of: Callable[[int], float]) -> list[float]:
    """D after each sync, from when the awaited ops ended (`end_of(op id)`, e.g. a finished run's)."""
    out: list[float] = []
    for awaited, base_s in zip(syncs.awaited, syncs.base_s, strict=True):
        out.append(next_delay_s(out[-1] if out else 0.0, end_of(awaited), base_s))
    return out


def last_known(syncs: HostSyncs, end_of: Callable[[int], float], t_s: float) -> int:
    """The last sync whose awaited op, and every earlier sync's, had finished by t_s (-1: none): the
    host's D there is fixed at t_s, the later ones are still to come."""
    for i, awaited in enumerate(syncs.awaited):
        if end_of(awaited) > t_s:
            return i - 1
    return len(syncs.awaited) - 1
