"""The critical path as columns: what sim/results/critical_path.py's Segment list holds, one array per field.

A step's path has ~10^4 segments; a Segment record costs ~1 us to build and as much to free, and what a
result reads of the path (category shares, op types, the steady state's cuts and steps) is a sum or a
search over it. `PathColumns` holds, per segment in time order: rank, op id (-1: a wait), start_us,
dur_us, count, its category (a code into `categories`) and its name. critical_path_columns builds it from
the compiled walk's steps with the expressions critical_path uses (start_us = a_s x 1e6, dur_us =
(b_s - a_s) x 1e6, elementwise: the same IEEE double operations), names and categories read off the
stages' op columns (sim/schedule/stamped_ops.py op_column: the values the records carry); without the
compiled walk it is the Python walk's segments, column by column. `segments()` gives the Segment list
back, equal field for field to critical_path's (tests/test_path_columns.py).

category_us, top_op_types and inside_an_op here are critical_path.py's over the columns: the same sums in
the same order (np.bincount adds each bin's weights in index order from 0.0, as the loop and np.add.at do).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain
from operator import attrgetter

import numpy as np

from meshsim.sim.engine.events import EventLog
from meshsim.sim.results import critical_path as cp
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.results.run_arrays import distinct_ints
from meshsim.sim.schedule.ops import Schedule
from meshsim.sim.schedule.stamped_ops import StampedOps, op_column

_WAIT_NAMES = {"waiting": "wait", "pipeline_bubble": "pipeline bubble"}  # critical_path._waiting's names


@dataclass(frozen=True, eq=False)
class PathColumns:
    """A critical path, segment k in time order: rank[k], op_id[k] (-1: a wait, Segment.op_id None),
    start_us[k], dur_us[k], count[k], categories[category[k]], names[k]. The names are built when first
    read (`name_list()`: only op types and Segment records read them)."""

    rank: np.ndarray
    op_id: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    count: np.ndarray
    category: np.ndarray
    categories: tuple[str, ...]
    name_list: Callable[[], list[str]]
    # (per segment: the code of its op type, the op types): what op_types_of(names) gives, by a cheaper
    # route where the maker has one (critical_path_columns: the names' parts); None: from the names
    type_list: Callable[[], tuple[np.ndarray, list[str]]] | None = None

    @cached_property
    def names(self) -> list[str]:
        return self.name_list()

    @cached_property
    def types(self) -> tuple[np.ndarray, list[str]]:
        """(code, types): types[code[k]] == critical_path.op_type(names[k]) for every segment k, the types
        numbered in order of first appearance."""
        return self.type_list() if self.type_list is not None else op_types_of(self.names)

    def __len__(self) -> int:
        return len(self.rank)

    def __getitem__(self, k):
        """Segment k (a list of them for a slice), built when read."""
        if isinstance(k, slice):
            return [self.segment(i) for i in range(*k.indices(len(self)))]
        return self.segment(range(len(self))[k])

    def __iter__(self):
        return iter(self.segments())

    def segment(self, k: int) -> Segment:
        op = int(self.op_id[k])
        return Segment(self.names[k], self.categories[int(self.category[k])], int(self.rank[k]),
                       float(self.start_us[k]), float(self.dur_us[k]), None if op < 0 else op, int(self.count[k]))

    def segments(self) -> list[Segment]:
        """The Segment records, in order."""
        ops = [None if op < 0 else op for op in self.op_id.tolist()]
        cats = list(map(self.categories.__getitem__, self.category.tolist()))
        return cp.segment_records(list(self.names), cats, self.rank.tolist(), self.start_us.tolist(),
                                  self.dur_us.tolist(), ops, self.count.tolist())

    def segment_tuple(self) -> SegmentTuple:
        """The Segment records as a tuple that keeps these columns (a StepResult's critical_path)."""
        out = SegmentTuple(self.segments())
        out.columns = self
        return out

    def with_period(self, s1: int, s2: int, n: int, shift_us: float) -> PathColumns:
        """period_path.extend_path's result: segments [s1, s2) count n + 1, those from s2 on start shift_us
        later (start_us + shift_us, elementwise)."""
        count, start = self.count.copy(), self.start_us.copy()
        count[s1:s2] = n + 1
        start[s2:] = start[s2:] + shift_us
        return replace(self, start_us=start, count=count)


class SegmentTuple(tuple):
    """A tuple of Segments that also holds the PathColumns they were built from (`columns`, None on a copy
    made any other way): what reads the path's ranks and op ids whole (the trace's and timeline's critical
    keys, sim/outputs/row_fields.path_keys) reads the arrays instead of the records. A tuple for everything
    else: equal to, hashed as and compared with the plain tuple of the same Segments."""

    columns: PathColumns | None = None

    def __reduce__(self):
        return tuple, (tuple(self),)


class _Names:
    """A name list handed back as it is (from_segments' name_list)."""

    __slots__ = ("names",)

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __call__(self) -> list[str]:
        return self.names


def from_segments(path: Sequence[Segment]) -> PathColumns:
    """The columns of a Segment list (categories numbered in order of first appearance)."""
    n = len(path)
    codes: dict[str, int] = {}
    cats = list(map(attrgetter("category"), path))
    for c in dict.fromkeys(cats):
        codes[c] = len(codes)
    return PathColumns(
        np.fromiter(map(attrgetter("rank"), path), np.int64, n),
        np.fromiter((-1 if s.op_id is None else s.op_id for s in path), np.int64, n),
        np.fromiter(map(attrgetter("start_us"), path), np.float64, n),
        np.fromiter(map(attrgetter("dur_us"), path), np.float64, n),
        np.fromiter(map(attrgetter("count"), path), np.int64, n),
        np.fromiter(map(codes.__getitem__, cats), np.int64, n), tuple(codes), _Names(list(map(attrgetter("name"), path))))


def critical_path_columns(schedule: Schedule | Sequence[Schedule], log: EventLog) -> PathColumns:
    """critical_path(schedule, log) as columns (module docstring)."""
    if cp._walk is None:
        return from_segments(cp.critical_path_python(schedule, log))
    st = cp._Ranks(schedule, log)
    if not len(st.rank):
        return from_segments([])
    cols = st.cols
    steps = cp._walk.walk(st, cp._last_row(st), *(np.ascontiguousarray(c, t) for c, t in (
        (cols.rank, np.int64), (cols.op_id, np.int64), (cols.start_s, np.float64), (cols.end_s, np.float64),
        (cols.wait_s, np.float64), (cols.peer, np.int64), (cols.peer_op, np.int64))), cp.TIE_S, cp._GAP_S)
    steps.reverse()
    n = len(steps)
    # one pass: every field as a double (codes, ranks and op ids are ints far below 2^53: exact), the
    # times the walk's own doubles
    table = np.fromiter(chain.from_iterable(steps), np.float64, 5 * n).reshape(n, 5)
    code, rank, op_id = (table[:, j].astype(np.int64) for j in range(3))
    a_s, b_s = np.ascontiguousarray(table[:, 3]), np.ascontiguousarray(table[:, 4])
    is_op = (code == cp._walk.OP) | (code == cp._walk.TRANSFER)
    categories = ["waiting", "pipeline_bubble", "pp_comm"]
    category = np.where(code == cp._walk.WAIT, 0, np.where(code == cp._walk.BUBBLE, 1, 2)).astype(np.int64)
    stage = np.where(is_op, 0 if st.single else rank // st.size, -1)  # _Ranks.stage_index
    codes = {c: i for i, c in enumerate(categories)}
    for s in distinct_ints(stage[is_op]):
        ops = st.schedules[s].ops
        at = np.flatnonzero(is_op & (stage == s))
        table = _category_codes(ops, codes)
        on_op = at[code[at] == cp._walk.OP]
        category[on_op] = table[op_id[on_op]]
    bubble = code == cp._walk.BUBBLE
    parts = _PathParts(st.schedules, stage, is_op, bubble, op_id)
    return PathColumns(rank, np.where(is_op, op_id, -1), a_s * 1e6, (b_s - a_s) * 1e6,
                       np.ones(n, np.int64), category, tuple(codes), parts.names, parts.types)


def _category_codes(ops: Sequence, codes: dict) -> np.ndarray:
    """Each op's category code in `codes`, extended in order of first appearance: a StampedOps' codes
    (tiled per stencil, no column built), else coded off the column."""
    if isinstance(ops, StampedOps):
        return ops.codes("category", codes).astype(np.int64)
    stage_cats = op_column(ops, "category")
    for c in dict.fromkeys(stage_cats):
        codes.setdefault(c, len(codes))
    return np.fromiter(map(codes.__getitem__, stage_cats), np.int64, len(stage_cats))


def _name_parts(ops: Sequence) -> tuple[list[str], list[str]]:
    """(prefixes, suffixes) of a stage's ops, prefix + suffix == the op's name: a StampedOps' name_parts
    (no name built), else ("", name)."""
    parts = getattr(ops, "name_parts", None)
    if parts is not None:
        return parts()
    names = op_column(ops, "name")
    return [""] * len(names), names


class _PathParts:
    """Each segment's name as two parts (prefix, suffix), read once for names and op types: an op's from its
    stage's name_parts, a wait's ("", "wait") or ("", "pipeline bubble")."""

    def __init__(self, schedules: Sequence[Schedule], stage: np.ndarray, is_op: np.ndarray, bubble: np.ndarray,
                 op_id: np.ndarray) -> None:
        self._args = (schedules, stage, is_op, bubble, op_id)
        self._parts: tuple[list[str], list[str]] | None = None
        self._names: list[str] | None = None

    def parts(self) -> tuple[list[str], list[str]]:
        if self._parts is None:
            schedules, stage, is_op, bubble, op_id = self._args
            n = len(stage)
            prefixes, suffixes = np.full(n, "", object), np.full(n, _WAIT_NAMES["waiting"], object)
            suffixes[bubble] = _WAIT_NAMES["pipeline_bubble"]
            for s in distinct_ints(stage[is_op]):
                at = np.flatnonzero(is_op & (stage == s))
                pre, suf = _name_parts(schedules[s].ops)
                ids = op_id[at].tolist()
                prefixes[at] = list(map(pre.__getitem__, ids))
                suffixes[at] = list(map(suf.__getitem__, ids))
            self._parts = (prefixes.tolist(), suffixes.tolist())
        return self._parts

    def names(self) -> list[str]:
        """Each segment's name: its op's, "wait" or "pipeline bubble" (kept: with_period's copies share it)."""
        if self._names is None:
            self._names = list(map(str.__add__, *self.parts()))
        return self._names

    def types(self) -> tuple[np.ndarray, list[str]]:
        return op_types_of_parts(*self.parts())


def op_types_of(names: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """(code, types): types[code[k]] == critical_path.op_type(names[k]), the types in order of first
    appearance; each distinct name typed once."""
    type_of = {name: cp.op_type(name) for name in dict.fromkeys(names)}
    codes: dict[str, int] = {}
    for t in type_of.values():
        codes.setdefault(t, len(codes))
    code_of = {name: codes[t] for name, t in type_of.items()}
    return np.fromiter(map(code_of.__getitem__, names), np.intp, len(names)), list(codes)


def _first_seen(values: Sequence) -> tuple[np.ndarray, list]:
    """(code, distinct): distinct[code[k]] == values[k], distinct in order of first appearance."""
    index = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(index.__getitem__, values), np.intp, len(values)), list(index)


def join_types(head: str, tail: str) -> str:
    """The op type of a name split at a dot into a head whose type is `head` and a tail whose type is `tail`:
    op_type joins the typed dotted parts that are not empty with ".", and a type is "" exactly when it has
    no such part, so the whole's is head + "." + tail, or the one that is not empty."""
    return f"{head}.{tail}" if head and tail else head or tail


def op_types_of_parts(prefixes: Sequence[str], suffixes: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """op_types_of(prefix + suffix per segment), without the names. A prefix that is "" or ends in "." splits
    its names at a dot: (p + s).split(".") is p[:-1].split(".") followed by s.split("."), so op_type(p + s) is
    join_types(op_type(p[:-1]), op_type(s)) ("" for the prefix ""). Each distinct prefix and suffix is typed
    once and each distinct pair of their types joined once; a segment whose prefix ends otherwise is typed
    by its whole name (its suffix becomes the name, its prefix "")."""
    odd = {p for p in dict.fromkeys(prefixes) if p and p[-1] != "."}
    if odd:
        pairs = [("", p + s) if p in odd else (p, s) for p, s in zip(prefixes, suffixes, strict=True)]
        prefixes, suffixes = [p for p, _ in pairs], [s for _, s in pairs]
    n = len(prefixes)
    if not n:
        return np.zeros(0, np.intp), []
    p_code, p_distinct = _first_seen(prefixes)
    s_code, s_distinct = _first_seen(suffixes)
    p_type, p_types = _first_seen([cp.op_type(p[:-1]) if p else "" for p in p_distinct])
    s_type, s_types = _first_seen(list(map(cp.op_type, s_distinct)))
    pair = p_type[p_code] * len(s_types) + s_type[s_code]
    uniq, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    codes: dict[str, int] = {}
    table = np.empty(len(uniq), np.intp)
    for k in np.argsort(first, kind="stable").tolist():  # pairs by first appearance: types numbered so
        head, tail = divmod(int(uniq[k]), len(s_types))
        table[k] = codes.setdefault(join_types(p_types[head], s_types[tail]), len(codes))
    return table[np.asarray(inverse).reshape(-1)], list(codes)


def category_us(path: PathColumns, pipeline: bool = False, moe: bool = False, cp_: bool = False) -> dict[str, float]:
    """critical_path.category_us over the columns: each category's sum of dur_us x count in path order from
    0.0 (np.bincount), the fixed categories first, then the others in order of first appearance."""
    total_us = {c: 0.0 for c in cp.CATEGORIES + (cp.PIPELINE_CATEGORIES if pipeline else ())
                + (cp.EP_CATEGORIES if moe else ()) + (cp.CP_CATEGORIES if cp_ else ())}
    if not len(path):
        return total_us
    sums = np.bincount(path.category, weights=path.dur_us * path.count, minlength=len(path.categories)).tolist()
    present = np.zeros(len(path.categories), bool)
    present[path.category] = True
    first = np.full(len(path.categories), len(path), np.int64)
    np.minimum.at(first, path.category, np.arange(len(path)))
    for code in sorted(np.flatnonzero(present).tolist(), key=first.__getitem__):
        total_us[path.categories[code]] = sums[code]
    return total_us


def shares(path: PathColumns, step_time_s: float, pipeline: bool = False, moe: bool = False,
           cp_: bool = False) -> dict[str, float]:
    """critical_path.shares over the columns."""
    total_us = category_us(path, pipeline, moe, cp_)
    if step_time_s <= 0:
        return {c: 0.0 for c in total_us}
    return {c: t / (step_time_s * 1e6) for c, t in total_us.items()}


def top_op_types(path: PathColumns, n: int = 8) -> list[cp.OpTypeRow]:
    """critical_path.top_op_types over the columns: per (op type, category) in order of first appearance,
    the sum of dur_us x count in path order from 0.0 (np.bincount adds each bin's weights in index order)
    and the sum of the counts; the keys are the op type codes (PathColumns.types) and category codes,
    equal codes <=> equal strs, numbered with np.unique."""
    if not len(path):
        return []
    type_code, types = path.types
    same = {c: i for i, c in reversed(list(enumerate(path.categories)))}  # equal categories: one code
    category = np.fromiter(map(same.__getitem__, path.categories), np.intp, len(path.categories))[path.category]
    key = type_code.astype(np.int64) * len(path.categories) + category
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    totals = np.bincount(inverse, weights=path.dur_us * path.count, minlength=len(uniq)).tolist()
    sums = np.bincount(inverse, weights=path.count, minlength=len(uniq)).tolist()
    kinds, cats = np.divmod(uniq, len(path.categories))
    kinds, cats = kinds.tolist(), cats.tolist()
    rows = [(types[kinds[k]], path.categories[cats[k]], totals[k], int(sums[k]))
            for k in np.argsort(first, kind="stable").tolist()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))[:n]


def inside_an_op(path: PathColumns) -> Callable[[float], bool]:
    """period_path.inside_an_op over the columns."""
    starts = path.start_us.tolist()
    ok = np.isin(path.category, [i for i, c in enumerate(path.categories) if c in ("compute", "tp_comm", "dp_comm")])
    ok &= path.op_id >= 0
    good_at = ok.tolist()

    def good(c_s: float) -> bool:
        i = bisect_right(starts, c_s * 1e6) - 1
        return i >= 0 and good_at[i]

    return good
