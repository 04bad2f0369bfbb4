# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""An event log kept as arrays, its Event tuples built only when read (sim/engine/event_rows.py says why).

`EventRows` is a read-only sequence of events.Event: row i is built from the columns (rank, op id, start,
end, wait, peer, peer op: sim/engine/event_columns.py) and the row's op, found by its stage and its index
in that stage's schedule (`stage`, `op_index` columns): the op's id, name, stream, category, phase, layer
and micro-batch, and the (bytes, flops) pair of its work. Nothing is cached: an event read twice is built
twice, equal field for field (floats by value).

`RankEvents` is one rank's events as a mapping op id -> Event, in completion order (what
EventLog.by_rank() held as a dict).
"""

from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM

from operator import eq as _eq  # object equality as a call: Cython 3.3 inlines a typed comparison for `==`
                                # on untyped objects whose bytearray branch trips gcc's -Warray-bounds

import numpy as np

cdef extern from "Python.h":
    object PyType_GenericAlloc(type t, Py_ssize_t nitems)

CHUNK = 4096  # rows built per step of an iteration


cdef inline void _put(object t, Py_ssize_t i, object v):
    Py_INCREF(v)
    PyTuple_SET_ITEM(t, i, v)


cdef class EventRows:
    """Events as columns plus per-stage op tables (module docstring); `columns` is the EventColumns."""
    cdef readonly object columns       # event_columns.EventColumns
    cdef readonly object stage_arr     # int32 per row: the stage whose schedule holds the op
    cdef readonly object op_index_arr  # int32 per row: the op's position in that schedule
    cdef readonly list ops             # per stage: its ops by position (Op records)
    cdef readonly list sizes           # per stage: per op position, (bytes, flops) of its work
    cdef readonly type event_type
    cdef long long[::1] rank, op_id, peer, peer_op
    cdef double[::1] start_s, end_s, wait_s
    cdef int[::1] stage, op_index
    cdef Py_ssize_t n

    def __init__(self, columns, stage, op_index, list ops, list sizes, type event_type):
        self.columns, self.stage_arr, self.op_index_arr = columns, stage, op_index
        self.ops, self.sizes, self.event_type = ops, sizes, event_type
        self.rank, self.op_id, self.peer, self.peer_op = columns.rank, columns.op_id, columns.peer, columns.peer_op
        self.start_s, self.end_s, self.wait_s = columns.start_s, columns.end_s, columns.wait_s
        self.stage, self.op_index = stage, op_index
        self.n = len(columns)
        if len(stage) != self.n or len(op_index) != self.n:
            raise ValueError("stage / op_index columns of another length than the events")

    def __len__(self):
        return self.n

    cdef object row(self, Py_ssize_t i):
        """Event i: event_type(rank, id, name, stream, category, phase, layer, micro_batch, start_s, end_s,
        wait_s, bytes, flops, peer, peer_op), allocated by its type and filled like a tuple."""
        cdef int s = self.stage[i], k = self.op_index[i]
        op = self.ops[s][k]
        cdef tuple size = <tuple>self.sizes[s][k]
        cdef object ev = PyType_GenericAlloc(self.event_type, 15)
        _put(ev, 0, self.rank[i])
        _put(ev, 1, op.id)
        _put(ev, 2, op.name)
        _put(ev, 3, op.stream)
        _put(ev, 4, op.category)
        _put(ev, 5, op.phase)
        _put(ev, 6, op.layer)
        _put(ev, 7, op.micro_batch)
        _put(ev, 8, self.start_s[i])
        _put(ev, 9, self.end_s[i])
        _put(ev, 10, self.wait_s[i])
        _put(ev, 11, size[0])
        _put(ev, 12, size[1])
        _put(ev, 13, None if self.peer[i] < 0 else self.peer[i])
        _put(ev, 14, None if self.peer_op[i] < 0 else self.peer_op[i])
        return ev

    cpdef list build(self, Py_ssize_t lo, Py_ssize_t hi):
        """Events lo .. hi - 1 as a list."""
        cdef Py_ssize_t i
        if lo < 0:
            lo = 0
        if hi > self.n:
            hi = self.n
        return [self.row(i) for i in range(lo, hi)]

    def __getitem__(self, index):
        cdef Py_ssize_t i
        if isinstance(index, slice):
            if index.step is None or _eq(index.step, 1):
                return tuple(self.build(*index.indices(self.n)[:2]))
            return tuple(self.build(0, self.n)[index])
        i = index
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("event index out of range")
        return self.row(i)

    def __iter__(self):
        cdef Py_ssize_t lo
        for lo in range(0, self.n, CHUNK):
            yield from self.build(lo, lo + CHUNK)

    def __reversed__(self):
        cdef Py_ssize_t i
        for i in range(self.n - 1, -1, -1):
            yield self.row(i)

    def __contains__(self, item):
        return any(_eq(ev, item) for ev in self)

    def index(self, item):
        for i, ev in enumerate(self):
            if _eq(ev, item):
                return i
        raise ValueError("event not in the log")

    def count(self, item):
        return sum(1 for ev in self if _eq(ev, item))

    def __eq__(self, other):
        if not isinstance(other, (EventRows, tuple, list)) or len(other) != self.n:
            return NotImplemented if not isinstance(other, (EventRows, tuple, list)) else False
        return all(_eq(a, b) for a, b in zip(self, other))

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        return f"EventRows({self.n} events)"

    def take(self, rows):
        """The rows `rows` (int array of row numbers, any order, repeats allowed) as a new EventRows."""
        idx = np.asarray(rows, dtype=np.intp)
        c = self.columns
        cols = type(c)(c.rank[idx], c.op_id[idx], c.start_s[idx], c.end_s[idx], c.wait_s[idx], c.peer[idx],
                       c.peer_op[idx])
        return EventRows(cols, self.stage_arr[idx], self.op_index_arr[idx], self.ops, self.sizes, self.event_type)

    def retimed(self, rows, start_s, end_s):
        """take(rows) with new start and end times (float64 arrays, one per taken row)."""
        idx = np.asarray(rows, dtype=np.intp)
        c = self.columns
        cols = type(c)(c.rank[idx], c.op_id[idx], np.ascontiguousarray(start_s, dtype=np.float64),
                       np.ascontiguousarray(end_s, dtype=np.float64), c.wait_s[idx], c.peer[idx], c.peer_op[idx])
        return EventRows(cols, self.stage_arr[idx], self.op_index_arr[idx], self.ops, self.sizes, self.event_type)


cdef class RankEvents:
    """One rank's events as a read-only mapping op id -> Event, iterated in completion order."""
    cdef readonly EventRows rows
    cdef readonly object order_arr   # int64: this rank's rows in completion order
    cdef readonly object row_of_arr  # int64 per op id: its row (-1: the rank has no event of that op)
    cdef long long[::1] order, row_of

    def __init__(self, EventRows rows, order, row_of):
        self.rows, self.order_arr, self.row_of_arr = rows, order, row_of
        self.order, self.row_of = order, row_of

    cdef long long find(self, object op_id) except -2:
        cdef long long k
        try:
            k = op_id
        except (TypeError, OverflowError):
            return -1
        if k < 0 or k >= self.row_of.shape[0]:
            return -1
        return self.row_of[k]

    def __getitem__(self, op_id):
        cdef long long r = self.find(op_id)
        if r < 0:
            raise KeyError(op_id)
        return self.rows.row(r)

    def get(self, op_id, default=None):
        cdef long long r = self.find(op_id)
        return default if r < 0 else self.rows.row(r)

    def __contains__(self, op_id):
        return self.find(op_id) >= 0

    def __len__(self):
        return self.order.shape[0]

    def __iter__(self):
        cdef Py_ssize_t k
        for k in range(self.order.shape[0]):
            yield self.rows.op_id[self.order[k]]

    def keys(self):
        return list(self)

    def values(self):
        """The rank's events in completion order, as an EventRows (its rows copied, no event built)."""
        return self.rows.take(self.order_arr)

    def items(self):
        """(op id, event) pairs in completion order, built as iterated."""
        return ((ev.op_id, ev) for ev in self.values())

    def __eq__(self, other):
        try:
            return _eq(dict(self.items()), dict(other.items()))
        except AttributeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"RankEvents({len(self)} events)"
