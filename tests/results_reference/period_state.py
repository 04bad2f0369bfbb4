"""The engine's state at a cut through one run, and whether it repeats one period later.

sim/results/steady_state.py states the theorem these checks serve and why they suffice; here each check
is one function that returns None when it holds and a one-line reason when it does not. Notation: mu maps
an op to the op one period later (micro-batch + unit, same ordinal among its micro-batch's ops); P is a
stage's ops per period, so that mu(op i) = op i + P throughout the regular part of its schedule.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from meshsim.sim.engine.events import Event, EventLog, Job, Transfer
from meshsim.sim.schedule.ops import P2P, Collective, Op, Schedule

Key = tuple  # (micro-batch, ordinal) or, for a P2P batch, (micro-batch, its transfers' identities)


def op_keys(schedule: Schedule) -> list[Key]:
    """op id -> its identity across periods: (micro-batch, ordinal among that micro-batch's ops that are
    not P2P batches), or for a P2P batch (its micro-batch, ((send, direction, micro-batch, sender's
    virtual stage) of each transfer)): a batch is labelled by its first transfer's micro-batch, so the
    warm-up's batches would shift the ordinals of later ones."""
    seen: dict[int | None, int] = {}
    keys: list[Key] = []
    for op in schedule.ops:
        if isinstance(op.work, P2P):
            keys.append((op.micro_batch, tuple((t.send, t.direction, t.micro_batch, t.sender_vstage)
                                               for t in op.work.transfers)))
            continue
        k = seen.get(op.micro_batch, 0)
        keys.append((op.micro_batch, k))
        seen[op.micro_batch] = k + 1
    return keys


def later(key: Key, unit: int) -> Key:
    """mu on keys: micro-batches + unit (an op of no micro-batch is its own image)."""
    mb, tag = key
    if mb is None:
        return key
    if isinstance(tag, tuple):
        tag = tuple((send, d, t_mb + unit, q) for send, d, t_mb, q in tag)
    return (mb + unit, tag)


@dataclass(frozen=True)
class StageMap:
    """One stage's ops by key, mu on them, and its regular part: ids [first_regular, end_regular) hold ops
    equal to mu of the op P before them (same work, stream, layer, phase, deps and transfers, each one
    period later), and nothing before end_regular belongs to the drain."""

    ops: tuple[Op, ...]
    keys: list[Key]
    id_of: dict[Key, int]
    unit: int
    period_ops: int  # P
    first_regular: int
    end_regular: int

    def mu(self, op_id: int) -> int | None:
        key = self.keys[op_id]
        return op_id if key[0] is None else self.id_of.get(later(key, self.unit))

    def mu_inv(self, op_id: int) -> int | None:
        key = self.keys[op_id]
        return op_id if key[0] is None else self.id_of.get(later(key, -self.unit))


def _same_inputs(a: Op, b: Op, keys: list[Key], shifted: list[Key], unit: int) -> bool:
    """b is a one period later (shifted[i] = later(keys[i])): what the engine reads of them is the same
    (the host's calls and the op it waits for included)."""
    if a.stream != b.stream or a.phase != b.phase or a.layer != b.layer or len(a.deps) != len(b.deps):
        return False
    if a.host_calls != b.host_calls or (a.host_wait is None) != (b.host_wait is None):
        return False
    if a.host_wait is not None and keys[b.host_wait] != shifted[a.host_wait]:
        return False
    for da, db in zip(a.deps, b.deps, strict=True):
        if keys[db] != shifted[da]:
            return False
    wa, wb = a.work, b.work
    if wa is wb:
        return True
    if isinstance(wa, P2P) and isinstance(wb, P2P):
        return len(wa.transfers) == len(wb.transfers) and all(
            (x.send, x.direction, x.micro_batch + unit, x.sender_vstage, x.peer_stage, x.nbytes)
            == (y.send, y.direction, y.micro_batch, y.sender_vstage, y.peer_stage, y.nbytes)
            for x, y in zip(wa.transfers, wb.transfers, strict=True))
    return wa == wb


def stage_map(schedule: Schedule, lead: int, unit: int) -> StageMap | str:
    """The stage's StageMap, or why its schedule has no period where the plan says."""
    keys = op_keys(schedule)
    id_of = {key: i for i, key in enumerate(keys)}
    first, second = id_of.get((lead, 0)), id_of.get((lead + unit, 0))
    if first is None or second is None:
        return f"stage {schedule.stage} has no micro-batch {lead + unit}"
    p, ops = second - first, schedule.ops
    shifted = [later(key, unit) for key in keys]

    def regular(i: int) -> bool:
        return (i >= p and keys[i - p][0] is not None and keys[i] == shifted[i - p]
                and _same_inputs(ops[i - p], ops[i], keys, shifted, unit))

    end = second
    while end < len(keys) and regular(end):
        end += 1
    start = second
    while start - 1 >= p and regular(start - 1):
        start -= 1
    if end - start < p:
        return f"stage {schedule.stage}: fewer than one period of ops repeats one period later"
    return StageMap(ops, keys, id_of, unit, p, start, end)


def mu_tag(tag: tuple, maps: Callable[[int], StageMap], unit: int) -> tuple | None:
    """An arbiter job's tag one period later: (rank, op id) of a collective or compute op, or a P2P
    transfer's (src, dst, direction, micro-batch, sender's virtual stage)."""
    if len(tag) == 2:
        op = maps(tag[0]).mu(tag[1])
        return None if op is None else (tag[0], op)
    return (*tag[:3], tag[3] + unit, tag[4])


def mu_key(key: tuple, stage_maps: Sequence[StageMap], unit: int) -> tuple | None:
    """An arbiter key one period later: (stage, op id) of a collective, ("p2p", direction, micro-batch,
    sender's virtual stage); the others (the tied-embedding all-reduce, a rank's compute) are their own."""
    if key[0] == "p2p":
        return (*key[:2], key[2] + unit, key[3])
    if isinstance(key[0], int):
        op = stage_maps[key[0]].mu(key[1])
        return None if op is None else (key[0], op)
    return key


def time_values(log: EventLog, lo: float, hi: float) -> list[float]:
    """Every time the run's state changes at, within [lo, hi], sorted."""
    vals = [v for e in log.events if e.end_s >= lo and e.start_s <= hi
            for v in (e.start_s, e.start_s + e.wait_s, e.end_s)]
    vals += [v for t in (*log.transfers, *log.jobs) if t.end_s >= lo and t.start_s <= hi for v in (t.start_s, t.end_s)]
    return sorted(v for v in vals if lo <= v <= hi)


def choose_cut(log: EventLog, lo: float, period_s: float, tol_s: float,
               good: Callable[[float], bool] = lambda c: True) -> float | None:
    """A time c in [lo, lo + T) at least 4 tol from every state change, with c + T too: the middle of the
    widest gap between changes that `good` accepts, else of the widest gap (None if none is wide enough)."""
    vals = time_values(log, lo, lo + 2 * period_s + tol_s)
    inside = [v for v in vals if v < lo + period_s] + [lo + period_s]
    gaps = sorted(((b - a, (a + b) / 2) for a, b in zip([lo, *inside], inside, strict=False)), reverse=True)
    fallback = None
    for width, c in gaps:
        if width < 8 * tol_s:
            break
        i = bisect_left(vals, c + period_s)
        near = [abs(vals[j] - c - period_s) for j in (i - 1, i) if 0 <= j < len(vals)]
        if min(near, default=period_s) <= 4 * tol_s:
            continue
        if good(c):
            return c
        fallback = c if fallback is None else fallback
    return fallback


DONE, RUNNING, TODO = 0, 1, 2


def phase(t_start: float, t_end: float, c: float) -> int:
    return DONE if t_end < c else TODO if t_start > c else RUNNING


def _side(a: float, b: float, c1: float, c2: float, period_s: float, tol_s: float) -> bool:
    """a (of run time) and b are on the same side of their cuts, and one period apart when before them."""
    if (a < c1) != (b < c2):
        return False
    return a > c1 or abs(b - a - period_s) <= tol_s


@dataclass(frozen=True)
class Cut:
    c1: float
    period_s: float
    tol_s: float
    kappa: float  # compute ops are arbiter jobs when > 0

    @property
    def c2(self) -> float:
        return self.c1 + self.period_s


def transfer_index(transfers: Sequence[Transfer]) -> dict[tuple, Transfer]:
    """(rank, direction, micro-batch, sender's virtual stage) -> the transfer, for both of its ends."""
    index = {}
    for tr in transfers:
        index[(tr.src, *tr[2:5])] = index[(tr.dst, *tr[2:5])] = tr
    return index


def same_state(ea: Event, eb: Event, op: Op, cut: Cut, transfers: Mapping[tuple, Transfer], unit: int) -> bool:
    """Op ea (at c1) and its image eb (at c2) are in the same phase, with every past time one period apart:
    start; a collective's rendezvous end; a compute op's end (fixed at its start when kappa = 0); each P2P
    transfer's start and end. What is still to come (a collective's draining, a transfer's) the arbiter
    check compares."""
    c1, c2, t, tol = cut.c1, cut.c2, cut.period_s, cut.tol_s
    pa = phase(ea.start_s, ea.end_s, c1)
    if pa != phase(eb.start_s, eb.end_s, c2):
        return False
    if pa != RUNNING:
        return True
    if abs(eb.start_s - ea.start_s - t) > tol:
        return False
    work = op.work
    if isinstance(work, Collective):
        return _side(ea.start_s + ea.wait_s, eb.start_s + eb.wait_s, c1, c2, t, tol)
    if isinstance(work, P2P):
        return all(_transfers_repeat(ea.rank, x, transfers, cut, unit) for x in work.transfers)
    return cut.kappa > 0 or abs(eb.end_s - ea.end_s - t) <= tol


def _transfers_repeat(rank: int, x, transfers: Mapping[tuple, Transfer], cut: Cut, unit: int) -> bool:
    a = transfers.get((rank, x.direction, x.micro_batch, x.sender_vstage))
    b = transfers.get((rank, x.direction, x.micro_batch + unit, x.sender_vstage))
    return (a is not None and b is not None and _side(a.start_s, b.start_s, cut.c1, cut.c2, cut.period_s, cut.tol_s)
            and _side(a.end_s, b.end_s, cut.c1, cut.c2, cut.period_s, cut.tol_s))


def jobs_repeat(jobs: Sequence[Job], cut: Cut, tag_later: Callable[[tuple], tuple | None],
                key_later: Callable[[tuple], tuple | None]) -> str | None:
    """The arbiter's jobs draining at c1 got the same rates as their images at c2: every job that drained
    at some time in [w, c1] (w: when the first job draining at c1 started) has an image one period later
    with the same key (mapped), the same load objects and its interval clipped to [w, c1] shifted by T,
    and no other job drained in [w + T, c2]. Rates depend only on the keys and loads draining at each
    instant, so the work left to each job at c1 equals its image's at c2."""
    c1, c2, t, tol = cut.c1, cut.c2, cut.period_s, cut.tol_s
    w = min((j.start_s for j in jobs if j.start_s < c1 < j.end_s), default=c1)
    first = [j for j in jobs if j.start_s < c1 and j.end_s > w]
    second = {j.tag: j for j in jobs if j.start_s < c2 and j.end_s > w + t}
    if len(first) != len(second):
        return f"{len(first)} arbiter jobs overlap the first cut's window, {len(second)} the second's"
    for a in first:
        b = second.get(tag_later(a.tag))
        if b is None or b.key != key_later(a.key) or b.load is not a.load and b.load != a.load \
                or b.own is not a.own and b.own != a.own:
            return f"arbiter job {a.tag} has no image one period later"
        if abs(max(b.start_s, w + t) - max(a.start_s, w) - t) > tol or \
                abs(min(b.end_s, c2) - min(a.end_s, c1) - t) > tol:
            return f"arbiter job {a.tag} drains at other times one period later"
    return None
