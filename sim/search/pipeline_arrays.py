"""The graph of the pipeline's fill and drain (sim/search/pipeline_bound.py) read off the schedules' tiled
arrays (Schedule.tiled_arrays: kind, stream and deps in CSR form, op ids = positions) with numpy passes,
not a Python step per op.

Nodes are global positions: stage k's op at position i is node offset(k) + i, offset(k) the ops of the
stages before it, the same numbering as the long way (Pipeline.long_way, which numbers ops by its
concatenated list). For every node it gives the same lists, in the same order, as the long way:
  own(n)   = n's deps in their order, then the previous op of n's stream when n is on a FIFO stream;
  preds(n) = own(n), then for a P2P batch own(o) for each partner o in turn;
  succs(p) = every n with p in preds(n), n ascending, once per occurrence (a stable sort of the edges by p);
and `ok` False exactly when a dep is not a position of its schedule (the long way: not an op id of it).
A schedule without tiled arrays gives None: the caller takes the long way. tests/test_search_pipeline_arrays.py
checks est, tail, dur and fill_drain equal to the long way's to the bit.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from meshsim.sim.schedule.ops import FIFO_STREAMS, STREAMS, Op, Schedule
from meshsim.sim.schedule.tiling import NONE

PP_COMM = STREAMS.index("pp_comm")
FIFO_CODES = [STREAMS.index(s) for s in FIFO_STREAMS]
View = tuple[int, int, dict[str, list[tuple[int, int]]]]


class Rows:
    """Row n of a CSR table (ptr, idx) as a list of ints, converted row by row as read (the solve reads the
    rows of the fill and drain sets only); ptr becomes a list on the first read."""

    __slots__ = ("idx", "ptr")

    def __init__(self, ptr: np.ndarray, idx: np.ndarray):
        self.ptr, self.idx = ptr, idx

    def __getitem__(self, n: int) -> list[int]:
        ptr = self.ptr
        if type(ptr) is not list:
            ptr = self.ptr = ptr.tolist()
        return self.idx[ptr[n]:ptr[n + 1]].tolist()


class StreamOps:
    """A stage's ops of one stream as (position, node), read one by one from either end (fill_drain stops
    at the first op outside its region, so most are never read)."""

    __slots__ = ("offset", "positions")

    def __init__(self, positions: np.ndarray, offset: int):
        self.positions, self.offset = positions, offset

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for p in self.positions:
            yield int(p), int(p) + self.offset

    def __reversed__(self) -> Iterator[tuple[int, int]]:
        for p in self.positions[::-1]:
            yield int(p), int(p) + self.offset


@dataclass
class PipeGraph:
    """What Pipeline solves on: the links of every node, the fill and drain candidates (`first`: micro-batch
    0 or none, `final`: the last or none, ascending), and per node its op, stage and FIFO-ness."""

    ok: bool
    op: Callable[[int], Op] = None
    stage_of: Callable[[int], int] = None
    fifo: Sequence[bool] = ()
    own: Sequence[list[int]] = ()
    preds: Sequence[list[int]] = ()
    succs: Sequence[list[int]] = ()
    partners: dict[int, list[int]] = None
    first: list[int] = None
    final: list[int] = None
    last_mb: int = 0
    view: Callable[[int], View] = None  # stage -> (first other, last other, stream -> [(position, node)])
    orders: Callable[[], tuple[list[int], list[int]]] | None = None  # the closures (None: Kahn op by op)


def _micro_batches(sched: Schedule) -> np.ndarray | None:
    """The ops' micro-batches as int64 (NONE: None), from the tiled fields or read off the ops; None when one
    is neither None nor an int the column holds."""
    fields = sched.fields
    if fields is not None:
        return fields.micro_batch
    mbs = [op.micro_batch for op in sched.ops]
    if not all(v is None or type(v) is int and NONE < v < 2**63 for v in mbs):
        return None
    return np.array([NONE if v is None else v for v in mbs], dtype=np.int64)


def _own_rows(kind_stream: np.ndarray, dep_ptr: np.ndarray, dep_idx: np.ndarray, off: int) -> tuple:
    """(count, idx) of own(n) for one stage's ops, as global nodes: deps in order, then the stream's previous."""
    n = len(kind_stream)
    fifo = np.isin(kind_stream, FIFO_CODES)
    order = np.argsort(kind_stream, kind="stable")
    same = (kind_stream[order[1:]] == kind_stream[order[:-1]]) & fifo[order[1:]]
    prev = np.full(n, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    deg = np.diff(dep_ptr).astype(np.int64)
    has_prev = prev >= 0
    cnt = deg + has_prev
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt, out=ptr[1:])
    idx = np.empty(int(ptr[-1]), dtype=np.int64)
    rows = np.repeat(np.arange(n), deg)
    idx[ptr[rows] + np.arange(len(rows)) - dep_ptr[rows]] = dep_idx.astype(np.int64) + off
    with_prev = np.flatnonzero(has_prev)
    idx[ptr[with_prev + 1] - 1] = prev[with_prev] + off
    return cnt, idx, fifo


def _csr(cnt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, row of each entry) of a CSR table with these row lengths."""
    ptr = np.zeros(len(cnt) + 1, dtype=np.int64)
    np.cumsum(cnt, out=ptr[1:])
    return ptr, np.repeat(np.arange(len(cnt)), cnt)


def closure(member: np.ndarray, node: np.ndarray, link: np.ndarray) -> list[int]:
    """The members whose every link is in the result, in an order where links come first: Kahn's algorithm as
    pipeline_bound._closure runs it, on edges (node[e] links to link[e]). A member with a link outside the
    members never starts; each counts its distinct links, and is released once each of them is out."""
    n_nodes = len(member)
    outside = np.bincount(node[~member[link]], minlength=n_nodes)
    cand = member & (outside == 0)
    keep = cand[node]
    pairs = np.unique(node[keep] * n_nodes + link[keep])  # distinct (node, link), by node then link
    nodes, links = pairs // n_nodes, pairs % n_nodes
    need = np.bincount(nodes, minlength=n_nodes).tolist()
    by_link = np.argsort(links, kind="stable")
    back = Rows(np.concatenate([[0], np.cumsum(np.bincount(links, minlength=n_nodes))]), nodes[by_link])
    queue = deque(np.flatnonzero(cand & (np.bincount(nodes, minlength=n_nodes) == 0)).tolist())
    order = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for s in back[n]:
            need[s] -= 1
            if need[s] == 0:
                queue.append(s)
    return order


def graph_from_arrays(schedules: Sequence[Schedule], partners_of: Callable) -> PipeGraph | None:
    """The module docstring's graph, or None when a schedule has no tiled arrays or unreadable micro-batches.
    `partners_of(items)`: pipeline_bound's pairing of P2P batches over (stage, op, node) items."""
    arrays = [s.tiled_arrays for s in schedules]
    if any(a is None for a in arrays):
        return None
    mbs = [_micro_batches(s) for s in schedules]
    if any(mb is None for mb in mbs):
        return None
    sizes = [len(a.kind) for a in arrays]
    offsets = [0, *np.cumsum(sizes).tolist()]
    if not all(len(a.dep_idx) == 0 or a.dep_idx.min() >= 0 and a.dep_idx.max() < n
               for a, n in zip(arrays, sizes, strict=True)):
        return PipeGraph(ok=False)
    parts = [_own_rows(a.stream, a.dep_ptr, a.dep_idx, off) for a, off in zip(arrays, offsets, strict=False)]
    own_cnt = np.concatenate([p[0] for p in parts])
    own_idx = np.concatenate([p[1] for p in parts])
    own_ptr, own_row = _csr(own_cnt)
    own = Rows(own_ptr, own_idx)
    p2p = ((s.stage, s.ops[i], off + i) for s, a, off in zip(schedules, arrays, offsets, strict=False)
           for i in np.flatnonzero(a.kind == 2).tolist())
    partners = partners_of(p2p)
    pred_cnt = own_cnt.copy()
    extra = {n: [p for o in others for p in own[o]] for n, others in partners.items()}
    for n, ps in extra.items():
        pred_cnt[n] += len(ps)
    pred_ptr, pred_row = _csr(pred_cnt)
    pred_idx = np.empty(int(pred_ptr[-1]), dtype=np.int64)
    pred_idx[pred_ptr[own_row] + np.arange(len(own_row)) - own_ptr[own_row]] = own_idx
    for n, ps in extra.items():
        pred_idx[pred_ptr[n] + own_cnt[n]:pred_ptr[n + 1]] = ps
    by_pred = np.argsort(pred_idx, kind="stable")
    succ_ptr = np.zeros(len(own_cnt) + 1, dtype=np.int64)
    np.cumsum(np.bincount(pred_idx, minlength=len(own_cnt)), out=succ_ptr[1:])
    mb = np.concatenate(mbs)
    real = mb[mb != NONE]
    last_mb = int(real.max()) if len(real) else 0
    none = mb == NONE
    stage_nums = [s.stage for s in schedules]

    def locate(n: int) -> tuple[int, int]:
        k = bisect_right(offsets, n) - 1
        return k, n - offsets[k]

    def view(stage: int) -> View:
        a, m, off = arrays[stage], mbs[stage], offsets[stage]
        other_first = np.flatnonzero((m != NONE) & (m != 0))
        other_last = np.flatnonzero((m != NONE) & (m != last_mb))
        streams = {STREAMS[code]: StreamOps(np.flatnonzero(a.stream == code), off)
                   for code in np.unique(a.stream).tolist()}
        return (int(other_first[0]) if len(other_first) else len(m),
                int(other_last[-1]) if len(other_last) else -1, streams)

    return PipeGraph(
        ok=True, op=lambda n: schedules[locate(n)[0]].ops[locate(n)[1]],
        stage_of=lambda n: stage_nums[locate(n)[0]], fifo=np.concatenate([p[2] for p in parts]).tolist(),
        own=own, preds=Rows(pred_ptr, pred_idx), succs=Rows(succ_ptr, pred_row[by_pred]), partners=partners,
        first=np.flatnonzero(none | (mb == 0)).tolist(), final=np.flatnonzero(none | (mb == last_mb)).tolist(),
        last_mb=last_mb, view=view,
        orders=lambda: (closure(none | (mb == 0), pred_row, pred_idx), closure(none | (mb == last_mb), pred_idx, pred_row)))
