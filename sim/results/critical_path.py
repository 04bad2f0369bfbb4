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

import dataclasses
import functools
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from meshsim.sim.engine.events import EventLog
from meshsim.sim.results.run_arrays import tiled_stream_prev
from meshsim.sim.schedule.ops import P2P, Collective, Op, Schedule

try:  # the walk as a C loop (sim/results/_walk.pyx); absent, critical_path_python runs
    from meshsim.sim.results import _walk
except ImportError:
    _walk = None

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


@dataclass(frozen=True, slots=True)
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


_SEGMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Segment))
# Segment's __init__ only stores its arguments: what _walk.records does for it without the Python frame
_PLAIN_INIT = not hasattr(Segment, "__post_init__") and all(
    f.init and f.default_factory is dataclasses.MISSING for f in dataclasses.fields(Segment))


def segment_records(*columns: list) -> list[Segment]:
    """list(map(Segment, *columns)) (one list per field, in field order, all of one length): built by the
    compiled walk's `records` where it is built (the same records: tests/test_asm_segments.py)."""
    if _walk is not None and _PLAIN_INIT and hasattr(_walk, "records"):
        return _walk.records(Segment, _SEGMENT_FIELDS, list(columns))
    return list(map(Segment, *columns))


def _stream_prev(schedule: Schedule) -> list[int]:
    """op id -> id of the op before it on the same stream (-1: none; P2P batches are not FIFO)."""
    tiled = schedule.tiled_arrays
    if tiled is not None:  # ids are positions
        return tiled_stream_prev(tiled.stream).tolist()
    prev: list[int] = []
    last: dict[str, int] = {}
    for i, stream in enumerate(map(_STREAM, schedule.ops)):  # ids are list positions
        if stream == "pp_comm":
            prev.append(-1)
            continue
        prev.append(last.get(stream, -1))
        last[stream] = i
    return prev


_STREAM = attrgetter("stream")


def _waiting(rank: int, start_s: float, end_s: float, category: str = "waiting") -> Segment:
    return Segment("wait" if category == "waiting" else "pipeline bubble", category, rank, start_s * 1e6,
                   (end_s - start_s) * 1e6)


def latest_of(ids: Sequence[int], ends: Sequence[float]) -> int:
    """Of ops `ids` (ends[k] the end of ids[k], at least one), the one that ends last; among those ending
    within TIE_S of it, the one of the largest op id (a tie broken by id, not by round-off)."""
    top = max(ends) - TIE_S
    return max(i for i, end in zip(ids, ends, strict=True) if end >= top)


class _Checked(list):
    """A rank's op id -> row list with holes (-1: the op has no event): indexing one raises KeyError."""

    def __init__(self, rows: list[int], rank: int):
        super().__init__(rows)
        self.rank = rank

    def __getitem__(self, op_id: int) -> int:
        row = super().__getitem__(op_id) if 0 <= op_id < len(self) else -1
        if row < 0:
            raise KeyError(f"rank {self.rank} has no event of op {op_id}")
        return row


def _view(column: np.ndarray) -> memoryview:
    """A column read element by element as Python numbers without a list copy: a memoryview of its buffer
    (8 bytes per event instead of a list's pointer plus a boxed number; indexing boxes one on demand)."""
    return memoryview(np.ascontiguousarray(column))


class _Ranks:
    """The log's columns (as memoryviews: read element by element), and per rank (built when the walk first reaches it: it visits few)
    each op's row and its place in the rank's completion order; per stage, its ops and stream order."""

    def __init__(self, schedule: Schedule | Sequence[Schedule], log: EventLog):
        self.schedules = (schedule,) if isinstance(schedule, Schedule) else tuple(schedule)
        self.size = self.schedules[0].tp * self.schedules[0].cp * self.schedules[0].dp
        self.single = len(self.schedules) == 1
        self.cols = cols = log.columns()
        self.rank, self.op_id = _view(cols.rank), _view(cols.op_id)
        self.start, self.end, self.wait = _view(cols.start_s), _view(cols.end_s), _view(cols.wait_s)
        self.peer, self.peer_op = _view(cols.peer), _view(cols.peer_op)
        self._stages: dict[int, tuple[Sequence[Op], list[int]]] = {}
        self._rows: dict[int, tuple[list[int], list[int], list[float], list[int]]] = {}

    def stage(self, rank: int) -> tuple[Sequence[Op], list[int]]:
        """The rank's stage's ops and stream predecessors."""
        stage = 0 if self.single else rank // self.size
        hit = self._stages.get(stage)
        if hit is None:
            sched = self.schedules[stage]
            hit = self._stages[stage] = (sched.ops, _stream_prev(sched))
        return hit

    def rows(self, rank: int) -> tuple[Sequence[int], list[int], list[float], list[int]]:
        """(row of each op id, the rank's op ids in completion order, their ends, each op id's place in
        that order). The rows are a plain list when the rank has one event per op of its stage (every op
        id the walk can meet is in range), else a lookup that raises KeyError for an op with no event."""
        hit = self._rows.get(rank)
        if hit is None:
            rows = np.flatnonzero(self.cols.rank == rank)
            ids = self.cols.op_id[rows]
            n_ops = len(self.stage(rank)[0])
            size = max(int(ids.max()) + 1 if len(ids) else 0, n_ops)
            row_of, place = np.full(size, -1, np.int64), np.full(size, -1, np.int64)
            row_of[ids], place[ids] = rows, np.arange(len(rows))
            lookup = row_of.tolist()
            if size != n_ops or (row_of < 0).any():
                lookup = _Checked(lookup, rank)
            hit = self._rows[rank] = (lookup, ids.tolist(), self.cols.end_s[rows].tolist(), place.tolist())
        return hit

    def stage_index(self, rank: int) -> int:
        return 0 if self.single else rank // self.size

    def stage_arrays(self, stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(kind, dep_ptr, dep_idx as intc; stream predecessor as int64) of a stage's ops, ids = positions
        (Schedule.arrays, _stream_prev): what the compiled walk reads instead of the Op records."""
        sched = self.schedules[stage]
        arrays = sched.arrays
        return (np.ascontiguousarray(arrays.kind, np.intc), np.ascontiguousarray(arrays.dep_ptr, np.intc),
                np.ascontiguousarray(arrays.dep_idx, np.intc), np.asarray(_stream_prev(sched), np.int64))

    def rank_arrays(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """rows(rank) as int64 / float64 arrays: (row of each op id, -1 where it has none; op ids in
        completion order; their ends; each op id's place in that order, -1 where it has none)."""
        rows = np.flatnonzero(self.cols.rank == rank)
        ids = np.ascontiguousarray(self.cols.op_id[rows], np.int64)
        size = max(int(ids.max()) + 1 if len(ids) else 0, len(self.stage(rank)[0]))
        row_of, place = np.full(size, -1, np.int64), np.full(size, -1, np.int64)
        row_of[ids], place[ids] = rows, np.arange(len(rows))
        return row_of, ids, np.ascontiguousarray(self.cols.end_s[rows], np.float64), place

    def row(self, rank: int, op_id: int) -> int:
        return self.rows(rank)[0][op_id]

    def before(self, rank: int, op_id: int, t_s: float) -> int | None:
        """The row of the last event the rank completed before op_id's that ended by t_s."""
        _, order, ends, place = self.rows(rank)
        i = bisect_right(ends, t_s, 0, place[op_id])
        if i == 0:
            return None
        j = bisect_right(ends, ends[i - 1] - TIE_S, 0, i)  # ties: by op id
        return self.row(rank, latest_of(order[j:i], ends[j:i])) if j < i else None


def critical_path(schedule: Schedule | Sequence[Schedule], log: EventLog) -> list[Segment]:
    """Segments in time order from 0 to the step time (see module docstring); `schedule` is one Schedule,
    or one per pipeline stage (rank r runs stage r // (tp dp)). Reads the log's columns, never its
    per-event tuples: the compiled walk (sim/results/_walk.pyx) when it is built, else critical_path_python,
    its reference (tests/test_critical_path_compiled.py compares them)."""
    if _walk is None:
        return critical_path_python(schedule, log)
    st = _Ranks(schedule, log)
    if not len(st.rank):
        return []
    cols = st.cols
    steps = _walk.walk(st, _last_row(st), *(np.ascontiguousarray(c, t) for c, t in (
        (cols.rank, np.int64), (cols.op_id, np.int64), (cols.start_s, np.float64), (cols.end_s, np.float64),
        (cols.wait_s, np.float64), (cols.peer, np.int64), (cols.peer_op, np.int64))), TIE_S, _GAP_S)
    path = []
    for code, rank, op_id, a_s, b_s in reversed(steps):
        if code == _walk.OP or code == _walk.TRANSFER:
            op = st.stage(rank)[0][op_id]
            category = op.category if code == _walk.OP else "pp_comm"
            path.append(Segment(op.name, category, rank, a_s * 1e6, (b_s - a_s) * 1e6, op_id))
        else:
            path.append(_waiting(rank, a_s, b_s, "waiting" if code == _walk.WAIT else "pipeline_bubble"))
    return path


def _last_row(st: _Ranks) -> int:
    """The row the walk starts from: of the events ending within TIE_S of the last end, the one of the
    lowest rank, then the largest op id."""
    cols = st.cols
    last = np.flatnonzero(cols.end_s >= float(cols.end_s.max()) - TIE_S).tolist()
    return max(last, key=lambda r: (-st.rank[r], st.op_id[r]))


def critical_path_python(schedule: Schedule | Sequence[Schedule], log: EventLog) -> list[Segment]:
    """critical_path's walk in Python, row by row over the log's columns (as memoryviews): the reference."""
    st = _Ranks(schedule, log)
    if not len(st.rank):
        return []
    row = _last_row(st)
    path: list[Segment] = []
    ends = st.end
    while row is not None:
        rank, op_id = st.rank[row], st.op_id[row]
        ops, prev = st.stage(rank)
        op = ops[op_id]
        if isinstance(op.work, P2P):
            row = _p2p_step(row, op, st, path)
            continue
        if isinstance(op.work, Collective) and st.peer[row] >= 0 and st.peer[row] != rank:
            peer_op = st.peer_op[row]
            rank, op_id = st.peer[row], peer_op if peer_op >= 0 else op_id
            row = st.row(rank, op_id)
            ops, prev = st.stage(rank)
            op = ops[op_id]
        start_s, wait_s = st.start[row], st.wait[row]
        run_start_s = start_s + wait_s
        path.append(Segment(op.name, op.category, rank, run_start_s * 1e6, (ends[row] - run_start_s) * 1e6, op_id))
        if wait_s > _GAP_S:
            path.append(_waiting(rank, start_s, run_start_s))
        ids = op.deps if prev[op_id] < 0 else (*op.deps, prev[op_id])
        if len(ids) > 1:
            lookup = st.rows(rank)[0]
            row = lookup[latest_of(ids, [ends[lookup[i]] for i in ids])]
            pred_end_s = ends[row]
        elif ids:
            row = st.rows(rank)[0][ids[0]]
            pred_end_s = ends[row]
        else:
            row, pred_end_s = None, 0.0
        if start_s - pred_end_s > _GAP_S:
            path.append(_waiting(rank, pred_end_s, start_s))
    path.reverse()
    return path


def _p2p_step(row: int, op: Op, st: _Ranks, path: list[Segment]) -> int | None:
    """Record a P2P batch's transfer and the bubble before it; return the row of the rank's op that
    precedes both."""
    rank, op_id = st.rank[row], st.op_id[row]
    transfer_start_s = st.start[row] + st.wait[row]
    path.append(Segment(op.name, "pp_comm", rank, transfer_start_s * 1e6,
                        (st.end[row] - transfer_start_s) * 1e6, op_id))
    pred = st.before(rank, op_id, transfer_start_s)
    pred_end_s = st.end[pred] if pred is not None else 0.0
    if transfer_start_s - pred_end_s > _GAP_S:
        path.append(_waiting(rank, pred_end_s, transfer_start_s, "pipeline_bubble"))
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


OpTypeRow = tuple[str, str, float, int]  # (op type, category, total us, count)


def top_op_types(path: Iterable[Segment], n: int = 8) -> list[OpTypeRow]:
    """(op type, category, total us, count) of the op types holding the most critical-path time.

    Per (type, category) in order of first appearance: the sum, in path order from 0.0, of dur_us x count
    (np.add.at adds one element at a time in index order: the loop's additions, top_op_types_per_segment)
    and the sum of the counts; each distinct name is typed once."""
    path = list(path)
    if not path:
        return []
    names = list(map(_NAME, path))
    type_of = {name: op_type(name) for name in dict.fromkeys(names)}
    keys = list(zip(map(type_of.__getitem__, names), map(_CATEGORY, path), strict=True))
    code_of = dict(zip(dict.fromkeys(keys), range(len(keys)), strict=False))
    codes = np.fromiter(map(code_of.__getitem__, keys), np.intp, len(keys))
    counts = np.fromiter(map(_COUNT, path), np.int64, len(path))
    totals = np.zeros(len(code_of))
    np.add.at(totals, codes, np.fromiter(map(_DUR, path), np.float64, len(path)) * counts)
    sums = np.zeros(len(code_of), np.int64)
    np.add.at(sums, codes, counts)
    rows = [(k, c, t, int(cnt)) for (k, c), t, cnt in zip(code_of, totals.tolist(), sums.tolist(), strict=True)]
    return sorted(rows, key=lambda r: (-r[2], r[0]))[:n]


_NAME, _CATEGORY, _COUNT, _DUR = (attrgetter(a) for a in ("name", "category", "count", "dur_us"))


def top_op_types_per_segment(path: Iterable[Segment], n: int = 8) -> list[tuple[str, str, float, int]]:
    """top_op_types segment by segment (the reference tests compare it with)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for seg in path:
        count = seg.count
        slot = acc.setdefault((op_type(seg.name), seg.category), [0.0, 0])
        slot[0] += seg.dur_us * count
        slot[1] += count
    rows = [(k, c, t, int(cnt)) for (k, c), (t, cnt) in acc.items()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))[:n]
