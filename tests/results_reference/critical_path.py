"""The critical path of a simulated step: the chain of ops that set the step time.

Walk back from the op that finishes last. Each op's predecessor is whichever finished last among
(a) its deps, (b) the previous op on its stream, and (c) for a collective, the issuing op of the
last-arriving peer: the walk moves to that peer's copy of the collective (it waited for nobody) and goes
on along the peer's rank. Each op therefore starts exactly when its predecessor ends; any gap left
(an op that started after its predecessor finished, or after time 0) is recorded as a segment of
category "waiting", as is the rendezvous wait of a collective reached on a rank that waited. The
segments tile [0, step_time], so their durations sum to the step time.

Pipeline parallelism: each rank runs its stage's schedule. The walk does not follow a P2P batch to its
peer: it records the transfer itself (category "pp_comm", from the moment both ends had posted), then
the time the stage sat waiting for its neighbour, from the end of the last op the rank completed before
the transfer started, as "pipeline_bubble", and goes on from that op. So the path stays on the stage
that finished last and its bubble is named as such.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.schedule.ops import P2P, Collective, Op, Schedule

CATEGORIES = ("compute", "tp_comm", "dp_comm", "waiting")
PIPELINE_CATEGORIES = ("pp_comm", "pipeline_bubble")  # present when pp > 1
EP_CATEGORIES = ("ep_comm",)  # present when the step has MoE layers (the dispatch / combine and expert-TP)
CP_CATEGORIES = ("cp_comm",)  # present when cp > 1 (the KV ring, all-to-alls and KV all-gathers)
# how every report, plot and sentence names and colours them
CATEGORY_NAMES = {"compute": "compute", "tp_comm": "TP communication", "dp_comm": "DP communication",
                  "waiting": "waiting", "pp_comm": "P2P communication", "pipeline_bubble": "pipeline bubble",
                  "ep_comm": "EP communication", "cp_comm": "CP communication"}
CATEGORY_COLORS = {"compute": "#4c78a8", "tp_comm": "#f58518", "dp_comm": "#54a24b", "waiting": "#bab0ac",
                   "pp_comm": "#b279a2", "pipeline_bubble": "#e45756", "ep_comm": "#72b7b2", "cp_comm": "#eeca3b"}
_INDEX = re.compile(r"^(L|mb)\d+$")  # builder naming: "L3.mb0.fwd.qkv", "dp.bucket7.reduce_scatter", "_c2" chunks
_BUCKET = re.compile(r"^bucket\d+$")
_CHUNK = re.compile(r"_c\d+$")
# Ends closer than this are one instant: float round-off (times repeat ~1e-15 relative apart), far below any
# cost (>= ~1 us). Such near-ties are broken by op id, not by which rounding came out larger, so that a
# walk over equal times takes the same route whatever the round-off (sim/results/period_path.py relies on
# it); gaps shorter than this are not waits.
TIE_S = 1e-10
_GAP_S = TIE_S


@dataclass(frozen=True)
class Segment:
    name: str
    category: str  # compute | tp_comm | dp_comm | waiting
    rank: int
    start_us: float
    dur_us: float
    op_id: int | None = None  # None for a waiting segment
    count: int = 1  # > 1: the segment recurs in `count` consecutive periods (sim/results/steady_state.py)

    def to_json(self) -> dict:
        """The results-JSON row (`meshsim run --full-critical-path`)."""
        return {"name": self.name, "category": self.category, "rank": self.rank, "start_us": self.start_us,
                "dur_us": self.dur_us, "op_id": self.op_id, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping) -> Segment:
        return cls(data["name"], data["category"], data["rank"], data["start_us"], data["dur_us"],
                   data.get("op_id"), data.get("count", 1))


def _stream_prev(schedule: Schedule) -> dict[int, int]:
    """op id -> id of the op before it on the same stream."""
    prev: dict[int, int] = {}
    last: dict[str, int] = {}
    for op in schedule.ops:
        if op.stream == "pp_comm":  # P2P batches are not FIFO
            continue
        if op.stream in last:
            prev[op.id] = last[op.stream]
        last[op.stream] = op.id
    return prev


_END_THEN_ID = itemgetter(9, 1)  # Event -> (end_s, op_id), the order that picks a predecessor (C speed)
_END = itemgetter(9)  # Event -> end_s
_OP_ID = itemgetter(1)


def latest(events: Sequence[Event]) -> Event | None:
    """The event that ends last; among those ending within TIE_S of it, the one of the largest op id."""
    if not events:
        return None
    best = max(events, key=_END_THEN_ID)
    top = best.end_s - TIE_S
    tied = [e for e in events if e.end_s >= top]
    return best if len(tied) == 1 else max(tied, key=_OP_ID)


def _predecessor(events_of_rank: Mapping[int, Event], op: Op, prev: dict[int, int]) -> Event | None:
    """The last to finish among the op's deps and the previous op on its stream (events of one rank)."""
    ids = op.deps
    before = prev.get(op.id)
    if before is not None:
        ids = (*ids, before)
    return latest(list(map(events_of_rank.__getitem__, ids)))


def _waiting(rank: int, start_s: float, end_s: float, category: str = "waiting") -> Segment:
    return Segment("wait" if category == "waiting" else "pipeline bubble", category, rank, start_s * 1e6,
                   (end_s - start_s) * 1e6)


class _Stages:
    """Per rank: its stage's ops and stream order, and its events in completion order (each built when the
    walk first reaches that stage or rank: the walk visits few of them)."""

    def __init__(self, schedule: Schedule | Sequence[Schedule], log: EventLog):
        self.schedules = (schedule,) if isinstance(schedule, Schedule) else tuple(schedule)
        self.size = self.schedules[0].tp * self.schedules[0].cp * self.schedules[0].dp
        self.single = len(self.schedules) == 1
        self.index = log.by_rank()  # per rank, in completion order (events are appended as they finish)
        self._tables: dict[int, tuple[dict[int, Op], dict[int, int]]] = {}
        self._order: dict[int, list[Event]] = {}
        self._ends: dict[int, list[float]] = {}
        self._pos: dict[int, dict[int, int]] = {}

    def stage(self, rank: int) -> int:
        return 0 if self.single else rank // self.size

    def tables(self, rank: int) -> tuple[dict[int, Op], dict[int, int]]:
        """The rank's stage's (op id -> op, op id -> previous op id on its stream)."""
        stage = self.stage(rank)
        hit = self._tables.get(stage)
        if hit is None:
            sched = self.schedules[stage]
            hit = self._tables[stage] = ({op.id: op for op in sched.ops}, _stream_prev(sched))
        return hit

    def before(self, ev: Event, t_s: float) -> Event | None:
        """The last event the rank completed before `ev` that ended by t_s."""
        rank = ev.rank
        if rank not in self._order:
            order = self._order[rank] = list(self.index[rank].values())
            self._ends[rank] = list(map(_END, order))
            self._pos[rank] = {op_id: i for i, op_id in enumerate(self.index[rank])}
        i = bisect_right(self._ends[rank], t_s, 0, self._pos[rank][ev.op_id])
        if i == 0:
            return None
        j = bisect_right(self._ends[rank], self._ends[rank][i - 1] - TIE_S, 0, i)  # ties: by op id
        return latest(self._order[rank][j:i])


def critical_path(schedule: Schedule | Sequence[Schedule], log: EventLog) -> list[Segment]:
    """Segments in time order from 0 to the step time (see module docstring); `schedule` is one Schedule,
    or one per pipeline stage (rank r runs stage r // (tp dp))."""
    if not log.events:
        return []
    st = _Stages(schedule, log)
    index = st.index
    last_end_s = max(map(_END, log.events))  # then (-rank, op_id) picks among the last to end
    ev: Event | None = max((e for e in log.events if e.end_s >= last_end_s - TIE_S), key=lambda e: (-e.rank, e.op_id))
    path: list[Segment] = []
    while ev is not None:
        ops, prev = st.tables(ev.rank)
        op = ops[ev.op_id]
        if isinstance(op.work, P2P):
            ev = _p2p_step(ev, st, path)
            continue
        if isinstance(op.work, Collective) and ev.peer is not None and ev.peer != ev.rank:
            ev = index[ev.peer][ev.peer_op if ev.peer_op is not None else ev.op_id]
            ops, prev = st.tables(ev.rank)
            op = ops[ev.op_id]
        run_start_s = ev.start_s + ev.wait_s
        path.append(Segment(ev.name, ev.category, ev.rank, run_start_s * 1e6, (ev.end_s - run_start_s) * 1e6,
                            ev.op_id))
        if ev.wait_s > _GAP_S:
            path.append(_waiting(ev.rank, ev.start_s, run_start_s))
        pred = _predecessor(index[ev.rank], op, prev)
        pred_end_s = pred.end_s if pred is not None else 0.0
        if ev.start_s - pred_end_s > _GAP_S:
            path.append(_waiting(ev.rank, pred_end_s, ev.start_s))
        ev = pred
    path.reverse()
    return path


def _p2p_step(ev: Event, st: _Stages, path: list[Segment]) -> Event | None:
    """Record a P2P batch's transfer and the bubble before it; return the rank's op that precedes both."""
    transfer_start_s = ev.start_s + ev.wait_s
    path.append(Segment(ev.name, "pp_comm", ev.rank, transfer_start_s * 1e6,
                        (ev.end_s - transfer_start_s) * 1e6, ev.op_id))
    pred = st.before(ev, transfer_start_s)
    pred_end_s = pred.end_s if pred is not None else 0.0
    if transfer_start_s - pred_end_s > _GAP_S:
        path.append(_waiting(ev.rank, pred_end_s, transfer_start_s, "pipeline_bubble"))
    return pred


def category_us(path: Iterable[Segment], pipeline: bool = False, moe: bool = False,
                cp: bool = False) -> dict[str, float]:
    """Microseconds each category holds on the critical path (a segment counts `count` times; with
    pipeline: the P2P and pipeline-bubble categories too; with moe: EP communication; with cp: CP
    communication)."""
    total_us = {c: 0.0 for c in CATEGORIES + (PIPELINE_CATEGORIES if pipeline else ()) + (EP_CATEGORIES if moe else ())
                + (CP_CATEGORIES if cp else ())}
    for seg in path:
        total_us[seg.category] = total_us.get(seg.category, 0.0) + seg.dur_us * seg.count
    return total_us


def shares(path: list[Segment], step_time_s: float, pipeline: bool = False, moe: bool = False,
           cp: bool = False) -> dict[str, float]:
    """Fraction of the step time each category holds on the critical path."""
    total_us = category_us(path, pipeline, moe, cp)
    if step_time_s <= 0:
        return {c: 0.0 for c in total_us}
    return {c: t / (step_time_s * 1e6) for c, t in total_us.items()}


def critical_ops(path: Iterable[Segment]) -> set[tuple[int, int]]:
    """(rank, op id) of every op on the path (for trace / timeline highlighting)."""
    return {(s.rank, s.op_id) for s in path if s.op_id is not None}


@functools.lru_cache(maxsize=4096)
def _type_part(part: str) -> str:
    """One dotted part of an op name without its index ("" for "L3", "mb0"); few distinct parts recur."""
    return "" if _INDEX.match(part) else _CHUNK.sub("", _BUCKET.sub("bucket", part))


@functools.lru_cache(maxsize=1 << 17)
def op_type(name: str) -> str:
    """An op name without its layer, micro-batch, bucket and chunk indices:
    "L3.mb0.fwd.fc1_c2" -> "fwd.fc1", "dp.bucket7.reduce_scatter" -> "dp.bucket.reduce_scatter".
    Memoized (a pure function of the name): a run summarises one critical path several times (report rows,
    EP totals, the printed table), each time over the same names."""
    return ".".join(t for t in map(_type_part, name.split(".")) if t)


def top_op_types(path: Iterable[Segment], n: int = 8) -> list[tuple[str, str, float, int]]:
    """(op type, category, total us, count) of the op types holding the most critical-path time."""
    acc: dict[tuple[str, str], list[float]] = {}
    for seg in path:
        count = seg.count
        slot = acc.setdefault((op_type(seg.name), seg.category), [0.0, 0])
        slot[0] += seg.dur_us * count
        slot[1] += count
    rows = [(k, c, t, int(cnt)) for (k, c), (t, cnt) in acc.items()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))[:n]
