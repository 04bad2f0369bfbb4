# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The critical-path walk (sim/results/critical_path.py) as a C loop over the event log's columns.

The same walk step for step: from the row critical_path picks, each op's predecessor is the one of its deps
and stream predecessor that ends last (latest_of: ties within TIE_S broken by the largest op id), a
collective reached on a rank that waited for a peer moves to that peer's copy, a P2P batch records its
transfer and the bubble before it (the rank's last op completed by then: bisect_right over its ends in
completion order, the same halving as Python's bisect). Every float is one IEEE double operation the
Python walk also performs (start + wait, a - b, comparisons), compiled with -ffp-contract=off.

It returns the segments as plain tuples (code, rank, op id, start_s, end_s), last first; critical_path
builds the Segment records from them with the Python walk's own expressions.
"""

OP = 0         # an op's run: (OP, rank, op id, run start, end)
WAIT = 1       # waiting: (WAIT, rank, -1, from, to)
TRANSFER = 2   # a P2P batch's transfer: (TRANSFER, rank, op id, transfer start, end)
BUBBLE = 3     # a pipeline bubble: (BUBBLE, rank, -1, from, to)

from cpython.list cimport PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_ITEM

cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1

cdef enum:
    K_COLLECTIVE = 1
    K_P2P = 2


cdef Py_ssize_t _bisect_right(const double[::1] a, double x, Py_ssize_t lo, Py_ssize_t hi):
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef class _Rank:
    """One rank's lookups (critical_path._Ranks.rank_arrays): row of each op id (-1: none), op ids and
    ends in completion order, each op id's place in that order."""
    cdef const long long[::1] row_of
    cdef const long long[::1] order
    cdef const double[::1] ends
    cdef const long long[::1] place
    cdef long long rank

    cdef long long row(self, long long op_id) except -2:
        cdef long long r = self.row_of[op_id] if 0 <= op_id < self.row_of.shape[0] else -1
        if r < 0:
            raise KeyError(f"rank {self.rank} has no event of op {op_id}")
        return r


cdef class _Stage:
    cdef const int[::1] kind
    cdef const int[::1] dep_ptr
    cdef const int[::1] dep_idx
    cdef const long long[::1] prev


def walk(object ranks, long long row, const long long[::1] rank_col, const long long[::1] op_col,
         const double[::1] start, const double[::1] end, const double[::1] wait,
         const long long[::1] peer, const long long[::1] peer_op, double tie_s, double gap_s):
    """The segments of the walk from `row`, last first (module docstring). `ranks`: critical_path._Ranks
    (rank_arrays(rank), stage_arrays(rank): built on first use)."""
    cdef list out = []
    cdef dict rank_cache = {}, stage_cache = {}
    cdef _Rank rk = None
    cdef _Stage sg = None
    cdef long long rank, op_id, po, pred, best, i, lo, hi, k, n_ids, cur_rank = -1
    cdef Py_ssize_t a, b
    cdef double start_s, wait_s, run_start_s, pred_end_s, top, e, transfer_start_s
    cdef long long ids[1]
    while row >= 0:
        rank = rank_col[row]
        op_id = op_col[row]
        if rank != cur_rank:
            rk, sg = _rank_of(ranks, rank, rank_cache, stage_cache)
            cur_rank = rank
        if sg.kind[op_id] == K_P2P:
            transfer_start_s = start[row] + wait[row]
            out.append((TRANSFER, rank, op_id, transfer_start_s, end[row]))
            pred = _before(rk, op_id, transfer_start_s, tie_s)
            pred_end_s = end[pred] if pred >= 0 else 0.0
            if transfer_start_s - pred_end_s > gap_s:
                out.append((BUBBLE, rank, -1, pred_end_s, transfer_start_s))
            row = pred
            continue
        if sg.kind[op_id] == K_COLLECTIVE and peer[row] >= 0 and peer[row] != rank:
            po = peer_op[row]
            rank = peer[row]
            op_id = po if po >= 0 else op_id
            rk, sg = _rank_of(ranks, rank, rank_cache, stage_cache)
            cur_rank = rank
            row = rk.row(op_id)
        start_s = start[row]
        wait_s = wait[row]
        run_start_s = start_s + wait_s
        out.append((OP, rank, op_id, run_start_s, end[row]))
        if wait_s > gap_s:
            out.append((WAIT, rank, -1, start_s, run_start_s))
        a = sg.dep_ptr[op_id]
        b = sg.dep_ptr[op_id + 1]
        n_ids = (b - a) + (1 if sg.prev[op_id] >= 0 else 0)
        if n_ids > 1:
            top = 0.0
            for k in range(n_ids):  # max(ends): the first of the largest
                e = end[rk.row(sg.dep_idx[a + k] if a + k < b else sg.prev[op_id])]
                if k == 0 or e > top:
                    top = e
            top = top - tie_s
            best = -1
            for k in range(n_ids):
                i = sg.dep_idx[a + k] if a + k < b else sg.prev[op_id]
                if end[rk.row(i)] >= top and (best < 0 or i > best):
                    best = i
            row = rk.row(best)
            pred_end_s = end[row]
        elif n_ids == 1:
            row = rk.row(sg.dep_idx[a] if a < b else sg.prev[op_id])
            pred_end_s = end[row]
        else:
            row = -1
            pred_end_s = 0.0
        if start_s - pred_end_s > gap_s:
            out.append((WAIT, rank, -1, pred_end_s, start_s))
    return out


cdef tuple _rank_of(object ranks, long long rank, dict rank_cache, dict stage_cache):
    cdef _Rank rk = rank_cache.get(rank)
    if rk is None:
        row_of, order, ends, place = ranks.rank_arrays(rank)
        rk = _Rank()
        rk.row_of, rk.order, rk.ends, rk.place, rk.rank = row_of, order, ends, place, rank
        rank_cache[rank] = rk
    stage = ranks.stage_index(rank)
    cdef _Stage sg = stage_cache.get(stage)
    if sg is None:
        kind, dep_ptr, dep_idx, prev = ranks.stage_arrays(stage)
        sg = _Stage()
        sg.kind, sg.dep_ptr, sg.dep_idx, sg.prev = kind, dep_ptr, dep_idx, prev
        stage_cache[stage] = sg
    return rk, sg


cdef long long _before(_Rank rk, long long op_id, double t_s, double tie_s) except -2:
    """critical_path._Ranks.before: the row of the rank's last event before op_id's that ended by t_s
    (-1: none); among those ending within tie_s of it, the largest op id."""
    cdef Py_ssize_t i = _bisect_right(rk.ends, t_s, 0, rk.place[op_id]), j, k
    if i == 0:
        return -1
    j = _bisect_right(rk.ends, rk.ends[i - 1] - tie_s, 0, i)
    if j >= i:
        return -1
    cdef double top = rk.ends[j], e
    for k in range(j + 1, i):
        if rk.ends[k] > top:
            top = rk.ends[k]
    top = top - tie_s
    cdef long long best = -1, oid
    for k in range(j, i):
        oid = rk.order[k]
        if rk.ends[k] >= top and (best < 0 or oid > best):
            best = oid
    return rk.row(best)


def records(cls, tuple fields, list columns):
    """[cls(*row) for row in zip(*columns)] for a frozen slots dataclass `cls` whose __init__ only stores its
    arguments (no __post_init__, no default factory: the caller checks, critical_path.records): each record
    made by cls.__new__ and its fields set by object.__setattr__, what that __init__ does, without running
    its Python frame. Every column has the same length; `fields` are cls's fields in order."""
    cdef Py_ssize_t i, j, n = len(columns[0]) if columns else 0, k = len(fields)
    cdef list out = [None] * n
    cdef object obj
    new = cls.__new__
    if len(columns) != k or any(type(c) is not list or len(c) != n for c in columns):
        raise ValueError("one list per field, all of one length")
    for i in range(n):
        obj = new(cls)
        for j in range(k):
            PyObject_GenericSetAttr(obj, <object>PyTuple_GET_ITEM(fields, j),
                                    <object>PyList_GET_ITEM(<list>columns[j], i))
        out[i] = obj
    return out
