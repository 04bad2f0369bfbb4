# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""trace.json's op slices written in C straight from an event log's arrays (sim/outputs/trace_rows.py).

`write_slices` writes, for each row of an EventRows (sim/engine/_rows.pyx), the bytes of
`op_slices_json(events[i], ...)` (sim/outputs/trace_slices.py, the reference), each item after a ",":
the op's slice and, when it waited, its wait slice. No Event tuple is built. The text is the reference's
by construction:
- ints (exact type int, within 64 bits) as "%lld", which is int.__repr__;
- ts / dur are (whole ns) / 1e3: for |ns| < 10**15 the decimal ns / 1000 with its trailing zeros dropped
  (at least one digit after the point), which is repr's: that decimal is within half an ulp of the double
  ns / 1e3 (correctly rounded), so it reads back to it, and no shorter decimal does (another decimal of at
  most 3 places is >= 0.001 away, more than the ulp (< 2**-10) of a double < 10**12); beyond, repr itself;
- other floats through PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0), the function float.__repr__ is;
- strings of printable ASCII other than '"' and '\\' copied between quotes (what encode_basestring_ascii
  writes for them), any other string through encode_basestring_ascii itself, any other value through `js`.
Nanoseconds are int(t * 1e9 + 0.5) in IEEE doubles as Python computes them (the build has no FMA contraction
and no fast-math); the caller checks that every time gives a product inside [0, 2**62), where C's
truncation is Python's int(). A field the writer has no exact rule for (an op whose category, stream or
name is not a str, an op id that is not the row's, a row outside its stage's ops) raises Fallback: the
caller writes the Python way.

Also here: `op_codes`, the per-op field codes of sim/outputs/row_fields.py in one C pass per stage (the
timeline's and the trace's selections), and `micros_text`, the ts / dur rule alone (for tests).
"""

cimport cython
from cpython.buffer cimport PyBUF_READ
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.list cimport PyList_GET_ITEM
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport signbit
from libc.string cimport memcpy, strlen

cdef extern from "Python.h":
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags, int *ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_Compare(object a, object b) except? -1
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    bint PyLong_CheckExact(object o)
    bint PyFloat_CheckExact(object o)
    bint PyUnicode_CheckExact(object o)
    double PyFloat_AS_DOUBLE(object o)
    bint Py_IS_FINITE(double x)

import numpy as np

from meshsim.sim.schedule.ops import OP_FIELDS, Op

FLUSH = 1 << 20  # bytes held before a write
cdef const char* _PAIRS = (b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                           b"4041424344454647484950515253545556575859606162636465666768697071727374757677787980"
                           b"81828384858687888990919293949596979899")
_NONE = object()  # no stream seen yet


class Fallback(Exception):
    """A field the compiled writer has no exact rule for: write the file the Python way."""


@cython.final
cdef class _Out:
    """A growing byte buffer handed to `write` (a binary file's write) every FLUSH bytes."""
    cdef char* data
    cdef Py_ssize_t size, cap
    cdef object write
    cdef object js, ascii

    def __cinit__(self, write, js, ascii):
        self.cap = FLUSH + 65536
        self.data = <char*>PyMem_Malloc(self.cap)
        if self.data == NULL:
            raise MemoryError()
        self.size = 0
        self.write, self.js, self.ascii = write, js, ascii

    def __dealloc__(self):
        PyMem_Free(self.data)

    cdef inline int reserve(self, Py_ssize_t n) except -1:
        cdef char* grown
        if self.size + n > self.cap:
            grown = <char*>PyMem_Realloc(self.data, 2 * (self.size + n))
            if grown == NULL:
                raise MemoryError()
            self.data, self.cap = grown, 2 * (self.size + n)
        return 0

    cdef inline int raw(self, const char* text, Py_ssize_t n) except -1:
        self.reserve(n)
        memcpy(self.data + self.size, text, n)
        self.size += n
        return 0

    cdef inline int lit(self, const char* text) except -1:
        return self.raw(text, strlen(text))

    cdef int ll(self, long long v) except -1:
        """int.__repr__(v): the digits two at a time (a pair's text from _PAIRS), the last one alone."""
        cdef char digits[24]
        cdef int n = 24
        cdef unsigned long long a = <unsigned long long>(-(v + 1)) + 1 if v < 0 else <unsigned long long>v
        cdef unsigned int r
        while a >= 100:
            r = <unsigned int>(a % 100)
            a //= 100
            n -= 2
            digits[n] = _PAIRS[2 * r]
            digits[n + 1] = _PAIRS[2 * r + 1]
        if a >= 10:
            n -= 2
            digits[n] = _PAIRS[2 * a]
            digits[n + 1] = _PAIRS[2 * a + 1]
        else:
            n -= 1
            digits[n] = <char>(48 + a)
        if v < 0:
            n -= 1
            digits[n] = 45
        return self.raw(digits + n, 24 - n)

    cdef int flt(self, double v) except -1:
        """float.__repr__(v) (v finite). A whole v with |v| < 2**53, but -0.0, is written as the int and ".0":
        repr is the shortest decimal that reads back to v, and no decimal of as few significant digits as
        v's is another integer within v's half-ulp (<= 0.5 below 2**53) nor a non-integer (one of that
        size and so few digits is a multiple of a power of ten); below 1e16 repr writes it without an
        exponent, with ".0" (tests/test_asm_trace_text.py compares every case with repr)."""
        cdef char* text
        if -9007199254740992.0 < v < 9007199254740992.0 and v == <double><long long>v and (v != 0.0 or not signbit(v)):
            self.ll(<long long>v)
            return self.raw(".0", 2)
        text = PyOS_double_to_string(v, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
        try:
            self.raw(text, strlen(text))
        finally:
            PyMem_Free(text)
        return 0

    cdef int micros(self, long long k) except -1:
        """repr(k / 1e3) for a whole number of nanoseconds k (module docstring)."""
        cdef long long a = -k if k < 0 else k
        cdef long long frac
        cdef char digits[4]
        cdef int n = 3
        if a >= 1000000000000000:
            return self.flt(<double>k / 1e3)
        if k < 0:
            self.raw("-", 1)
        self.ll(a // 1000)
        frac = a % 1000
        digits[0] = <char>(48 + frac // 100)
        digits[1] = <char>(48 + (frac // 10) % 10)
        digits[2] = <char>(48 + frac % 10)
        while n > 1 and digits[n - 1] == 48:
            n -= 1
        self.raw(".", 1)
        return self.raw(digits, n)

    cdef int text(self, object s) except -1:
        """The characters of str `s` as JSON string contents, without the quotes."""
        cdef const unsigned char* p
        cdef Py_ssize_t i, n
        cdef unsigned char c
        if PyUnicode_IS_ASCII(s):
            p = <const unsigned char*>PyUnicode_DATA(s)
            n = PyUnicode_GET_LENGTH(s)
            for i in range(n):
                c = p[i]
                if c < 32 or c > 126 or c == 34 or c == 92:
                    break
            else:
                return self.raw(<const char*>p, n)
        quoted = self.ascii(s)
        p = <const unsigned char*>PyUnicode_DATA(quoted)
        return self.raw(<const char*>p + 1, PyUnicode_GET_LENGTH(quoted) - 2)

    cdef int value(self, object v) except -1:
        """js(v): the JSON text json writes for the scalar v."""
        cdef int overflow = 0
        cdef long long k
        cdef double x
        if v is None:
            return self.raw("null", 4)
        if PyLong_CheckExact(v):
            k = PyLong_AsLongLongAndOverflow(v, &overflow)
            if not overflow:
                return self.ll(k)
        elif PyFloat_CheckExact(v):
            x = PyFloat_AS_DOUBLE(v)
            if Py_IS_FINITE(x):
                return self.flt(x)
        elif PyUnicode_CheckExact(v):
            self.raw('"', 1)
            self.text(v)
            return self.raw('"', 1)
        return self.ascii_str(self.js(v))

    cdef int span(self, long long s_ns, long long dur_ns, long long pid, object tid, long long oid) except -1:
        """The part every slice shares after its "ts": key: ts,"dur","pid","tid","args":{"op": (args left open)."""
        self.micros(s_ns)
        self.lit(',"dur":')
        self.micros(dur_ns)
        self.lit(',"pid":')
        self.ll(pid)
        self.lit(',"tid":')
        self.value(tid)
        self.lit(',"args":{"op":')
        return self.ll(oid)

    cdef int ascii_str(self, object s) except -1:
        """An ASCII str (encode_json's output) as is."""
        return self.raw(<const char*>PyUnicode_DATA(s), PyUnicode_GET_LENGTH(s))

    cdef int bytes_(self, bytes b) except -1:
        return self.raw(<const char*>b, len(b))

    cdef int flush(self, bint force) except -1:
        if self.size and (force or self.size >= FLUSH):
            self.write(PyMemoryView_FromMemory(self.data, self.size, PyBUF_READ))  # no copy: write() is done with it
            self.size = 0
        return 0


cdef inline long long _ns(double t_s):
    return <long long>(t_s * 1e9 + 0.5)


cdef bint _is(object s, object literal) except -1:
    """s == literal for a str s (Fallback for any other type)."""
    if s is literal:
        return True
    if not PyUnicode_CheckExact(s):
        raise Fallback("a field that is not a str")
    return PyUnicode_Compare(s, literal) == 0


@cython.final
cdef class _Columns:
    """A stage's ops as the columns write_slices reads (id, name, stream, category, phase, layer, micro-batch),
    from a sequence that has them (sim/schedule/stamped_ops.StampedOps.column): no Op record built. A name
    is held as two parts, written one after the other (StampedOps.name_parts: a stamp's prefix and its
    stencil's suffix), so no name str is built; JSON escapes each character alone, so the bytes are the
    whole name's."""
    cdef tuple ids, names, suffixes, streams, categories, phases, layers, mbs
    cdef Py_ssize_t n


cdef object _POSITION = object()  # write_slices' op key of a stage whose ids are its positions


cdef bint _positions(object ids) except -1:
    """Whether `ids` is a list whose item k is the int k (exactly an int, as write_slices checks op ids):
    the stage's _Columns then holds no id column (at 10^5 ops a stage, ~4 MB of int objects each)."""
    if type(ids) is not list:
        return False
    cdef Py_ssize_t k
    cdef int overflow = 0
    for k in range(len(ids)):
        v = <object>PyList_GET_ITEM(ids, k)
        if not PyLong_CheckExact(v) or PyLong_AsLongLongAndOverflow(v, &overflow) != k or overflow:
            return False
    return True


cdef object _op_table(object ops):
    """A stage's ops for write_slices: a tuple of its records, or its _Columns where it has columns."""
    column = getattr(ops, "column", None)
    if column is None:
        return tuple(ops)
    cdef _Columns c = _Columns()
    parts = getattr(ops, "name_parts", None)
    if parts is not None:
        prefixes, suffixes = parts()
        c.names, c.suffixes = tuple(prefixes), tuple(suffixes)
    else:
        c.names, c.suffixes = tuple(column("name")), None
    ids = column("id")
    n_ids = len(ids)
    c.ids, c.streams = (None if _positions(ids) else tuple(ids)), tuple(column("stream"))
    del ids
    c.categories, c.phases = tuple(column("category")), tuple(column("phase"))
    c.layers, c.mbs = tuple(column("layer")), tuple(column("micro_batch"))
    c.n = len(ops)
    if c.suffixes is not None and len(c.suffixes) != c.n:
        raise Fallback("op name parts of another length than the ops")
    if n_ids != c.n or not all(len(t) == c.n for t in (c.names, c.streams, c.categories, c.phases, c.layers, c.mbs)):
        raise Fallback("op columns of another length than the ops")
    return c


def write_slices(write, rows, const unsigned char[::1] critical, const int[::1] info, list prefixes, list infos,
                 dict tid_of, long long pid_offset, long long per_node, bint lead, js, ascii):
    """Write the op slices of every row of `rows` (an EventRows), each item after a "," (none before the
    first when `lead` is false); returns how many items were written.

    critical[i]: row i's op is on the critical path; info[i]: the index in `prefixes` / `infos` of its
    collective row's name prefix ("nccl:<collective> ", escaped, bytes) and args members (",...", bytes);
    the last entry is an op with no collective row ("nccl:collective ", nothing). tid_of: sim/outputs'
    TID. pid = pid_offset + rank; device = rank % per_node (per_node > 0), else rank."""
    c = rows.columns
    cdef const long long[::1] rank = c.rank, op_id = c.op_id, peer = c.peer
    cdef const double[::1] start = c.start_s, end = c.end_s, wait = c.wait_s
    cdef const int[::1] stage = rows.stage_arr, op_index = rows.op_index_arr
    cdef list ops = rows.ops, sizes = rows.sizes
    cdef _Out out = _Out(write, js, ascii)
    cdef Py_ssize_t i, n = rank.shape[0], items = 0
    cdef long long r, pid, s_ns, e_ns, w_ns, oid
    cdef int overflow = 0
    cdef bint compute, bubble, first = not lead
    cdef object op, name, suffix = None, category, phase, stream, layer, mb, size, nbytes, flops, tid = None, op_key
    cdef object last_stream = _NONE
    cdef type op_type = Op
    compute_name, pp_name = "compute", "pp_comm"
    cdef list op_tables = [_op_table(t) for t in ops], size_tables = [tuple(t) for t in sizes]
    cdef tuple stage_ops = (), stage_sizes = ()
    cdef _Columns cols = None
    cdef Py_ssize_t stage_n = 0
    cdef int s, k, last_stage = -1
    for i in range(n):
        s, k = stage[i], op_index[i]
        if s != last_stage:
            if not 0 <= s < len(op_tables) or len(size_tables) != len(op_tables):
                raise Fallback("a row whose stage has no ops")
            table, stage_sizes, last_stage = op_tables[s], size_tables[s], s
            if type(table) is _Columns:
                cols, stage_n = <_Columns>table, (<_Columns>table).n
            else:
                cols, stage_ops = None, <tuple>table
                stage_n = PyTuple_GET_SIZE(stage_ops)
        if not 0 <= k < stage_n or PyTuple_GET_SIZE(stage_sizes) != stage_n:
            raise Fallback("a row whose op is not in its stage")
        if cols is not None:  # the op's fields from its stage's columns
            op_key = <object>PyTuple_GET_ITEM(cols.ids, k) if cols.ids is not None else _POSITION
            name = <object>PyTuple_GET_ITEM(cols.names, k)
            suffix = <object>PyTuple_GET_ITEM(cols.suffixes, k) if cols.suffixes is not None else None
            stream, category = <object>PyTuple_GET_ITEM(cols.streams, k), <object>PyTuple_GET_ITEM(cols.categories, k)
            phase, layer, mb = <object>PyTuple_GET_ITEM(cols.phases, k), <object>PyTuple_GET_ITEM(cols.layers, k), \
                <object>PyTuple_GET_ITEM(cols.mbs, k)
        else:
            op, suffix = <object>PyTuple_GET_ITEM(stage_ops, k), None
        if cols is not None:
            pass
        elif type(op) is op_type:  # an Op is a tuple of its fields (sim/schedule/ops.py OP_FIELDS)
            op_key, name = <object>PyTuple_GET_ITEM(op, 0), <object>PyTuple_GET_ITEM(op, 1)
            stream, category = <object>PyTuple_GET_ITEM(op, 2), <object>PyTuple_GET_ITEM(op, 3)
            phase, layer, mb = <object>PyTuple_GET_ITEM(op, 4), <object>PyTuple_GET_ITEM(op, 7), \
                <object>PyTuple_GET_ITEM(op, 8)
        else:
            op_key, name, stream, category, phase = op.id, op.name, op.stream, op.category, op.phase
            layer, mb = op.layer, op.micro_batch
        oid = op_id[i]
        if op_key is _POSITION:  # the stage's ids are its positions (_positions): op k's id is the int k
            if k != oid:
                raise Fallback("an op id that is not the row's")
        elif not PyLong_CheckExact(op_key) or PyLong_AsLongLongAndOverflow(op_key, &overflow) != oid or overflow:
            raise Fallback("an op id that is not the row's")
        if not PyUnicode_CheckExact(name) or suffix is not None and not PyUnicode_CheckExact(suffix):
            raise Fallback("an op name that is not a str")
        size = <object>PyTuple_GET_ITEM(stage_sizes, k)
        if not PyTuple_CheckExact(size) or PyTuple_GET_SIZE(size) < 2:
            raise Fallback("an op size that is not a (bytes, flops) tuple")
        if stream is not last_stream:  # ops share their stream's str: one lookup per change
            tid, last_stream = tid_of[stream], stream
        r = rank[i]
        pid = pid_offset + r
        s_ns, e_ns = _ns(start[i]), _ns(end[i])
        compute = _is(category, compute_name)
        if first:
            out.lit('{"name":"')
            first = False
        else:
            out.lit(',{"name":"')
        if not compute:
            out.bytes_(<bytes>prefixes[info[i]])
        out.text(name)
        if suffix is not None:
            out.text(suffix)
        out.lit('","cat":"kernel","ph":"X","ts":')
        out.span(s_ns, e_ns - s_ns, pid, tid, oid)
        out.lit(',"category":')
        out.value(category)
        out.lit(',"phase":')
        out.value(phase)
        if critical[i]:
            out.lit(',"critical":true,"stream":')
        else:
            out.lit(',"critical":false,"stream":')
        out.value(tid)
        out.lit(',"correlation":')
        out.ll(oid)
        out.lit(',"device":')
        out.ll(r % per_node if per_node > 0 else r)
        out.lit(',"layer":')
        out.value(layer)
        out.lit(',"micro_batch":')
        out.value(mb)
        nbytes, flops = <object>PyTuple_GET_ITEM(size, 0), <object>PyTuple_GET_ITEM(size, 1)
        if nbytes:
            out.lit(',"bytes":')
            out.value(nbytes)
        if flops:
            out.lit(',"flops":')
            out.value(flops)
        if not compute:
            out.bytes_(<bytes>infos[info[i]])
        items += 1
        if wait[i] <= 0:
            out.lit('}}')
        else:
            out.lit(',"wait_us":')
            out.flt(wait[i] * 1e6)
            w_ns = _ns(start[i] + wait[i])
            if w_ns > e_ns:
                w_ns = e_ns
            bubble = _is(stream, pp_name)  # a P2P waiting for its neighbour
            if bubble:
                out.lit('}},{"name":"pipeline bubble","cat":"wait","ph":"X","ts":')
            else:
                out.lit('}},{"name":"wait","cat":"wait","ph":"X","ts":')
            out.span(s_ns, w_ns - s_ns, pid, tid, oid)
            if bubble:
                out.lit(',"category":"pipeline_bubble","peer":')
            else:
                out.lit(',"category":"waiting","peer":')
            if peer[i] < 0:
                out.lit('null}}')
            else:
                out.ll(peer[i])
                out.lit('}}')
            items += 1
        out.flush(False)
    out.flush(True)
    return items


def micros_text(long long k):
    """The text the writer gives (k ns) / 1e3 (for tests: repr's)."""
    cdef _Out out = _Out(None, None, None)
    out.micros(k)
    return (<char*>out.data)[:out.size].decode("ascii")


def float_text(double v):
    """The text the writer gives a finite float (for tests: repr's)."""
    cdef _Out out = _Out(None, None, None)
    out.flt(v)
    return (<char*>out.data)[:out.size].decode("ascii")


def int_text(long long k):
    """The text the writer gives an int of 64 bits (for tests: repr's)."""
    cdef _Out out = _Out(None, None, None)
    out.ll(k)
    return (<char*>out.data)[:out.size].decode("ascii")


def op_codes(list stages, Py_ssize_t field, str name, dict index):
    """Per stage (a sequence of ops): an intc array of the code of each op's field (tuple position `field`
    of an Op, else attribute `name`) in `index` (value -> code, extended in first-seen order with
    len(index) as each new value's code). sim/outputs/row_fields.op_codes, in C."""
    cdef type op_type = Op
    cdef Py_ssize_t i, n
    cdef int[::1] out
    cdef object value, code
    tables = []
    for ops in stages:
        n = len(ops)
        table = np.empty(n, dtype=np.intc)
        out = table
        for i in range(n):
            op = ops[i]
            if type(op) is op_type:
                value = <object>PyTuple_GET_ITEM(op, field)
            else:
                value = getattr(op, name)
            code = index.get(value)
            if code is None:
                code = index[value] = len(index)
            out[i] = code
        tables.append(table)
    return tables
