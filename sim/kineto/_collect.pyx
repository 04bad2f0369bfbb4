# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled trace reader (optional; sim/kineto/fast.py runs it, load.py is the reference).

`scan` walks a trace's bytes once and hands each element of traceEvents, decoded into the same Python
value ijson's yajl2_c backend builds, to `add` (the collector's). It accepts only a strict subset of
what the reference path (sim/kineto/jsonstream.py: _Guard + yajl) accepts, and returns False ("ask the
reference") at the first byte outside that subset, so on any input it either gives what the reference
gives or nothing:
- JSON's grammar with blanks " \\t\\n\\r" only; containers nested at most MAX_NESTING deep (top-level
  object = 1); one object at the top with nothing but blanks after it; at least one traceEvents member,
  an array (every traceEvents array is read, as ijson.items does);
- strings of at most MAX_STRING bytes, valid UTF-8 (Python's strict decoder), escapes \\" \\\\ \\/ \\b
  \\f \\n \\r \\t and \\uXXXX outside 0000 and the surrogates D800-DFFF (yajl makes a lone surrogate '?');
- integers of magnitude at most 2**63 - 1 (yajl refuses the others, -2**63 too: "integer overflow"); other numbers of at most
  MAX_NUMBER characters, read with Python's correctly rounded float(), refused when infinite or when a
  non-zero mantissa rounds to zero (yajl's strtod is correctly rounded too; the edges go to the reference);
- a top-level member (traceEvents' elements one at a time) of at most MAX_UNIT bytes.
The members before traceEvents are not returned: fast.py takes them from the reference parser.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_New, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeASCII, PyUnicode_DecodeUTF8
from libc.math cimport isinf
from libc.string cimport memcmp, memcpy

cimport cython

cdef extern from "Python.h":
    const void *PyUnicode_DATA(object o)
    double PyOS_string_to_double(const char *s, char **endptr, PyObject *overflow_exception) except? -1.0

MAX_NESTING = 32
MAX_STRING = 1 << 20
MAX_NUMBER = 60
MAX_UNIT = 8 << 20
READ_BYTES = 1 << 20

DEF CACHE_SLOTS = 8192
DEF CACHE_MAX = 512

cdef inline const char *_data(object text):
    """The bytes of a compact ASCII str (what PyUnicode_DecodeASCII makes)."""
    return <const char *> PyUnicode_DATA(text)


cdef double _POW10[23]
for _k in range(23):
    _POW10[_k] = float(10 ** _k)


cdef enum:
    OK = 0
    MORE = -1  # ran into the end of the buffer before the end of the file: refill and parse again
    OUT = -2  # outside the accepted subset: the reference parser decides


@cython.final
cdef class _Decoder:
    cdef bytes buf
    cdef const unsigned char *p
    cdef Py_ssize_t n
    cdef bint eof
    cdef list cache  # CACHE_SLOTS str (or None): ASCII strings seen, by a hash of their bytes
    cdef int max_nesting
    cdef Py_ssize_t max_string
    cdef object val  # the value decoded last (with keep)

    def __cinit__(self):
        self.cache = [None] * CACHE_SLOTS
        self.max_nesting = MAX_NESTING
        self.max_string = MAX_STRING
        self.buf = b""
        self.n = 0
        self.eof = False

    cdef void set(self, bytes buf, bint eof):
        self.buf = buf
        self.p = <const unsigned char *> PyBytes_AS_STRING(buf)
        self.n = PyBytes_GET_SIZE(buf)
        self.eof = eof

    cdef inline Py_ssize_t ws(self, Py_ssize_t i):
        cdef unsigned char c
        while i < self.n:
            c = self.p[i]
            if c == 32 or c == 10 or c == 13 or c == 9:
                i += 1
            else:
                return i
        return i

    cdef object ascii(self, Py_ssize_t a, Py_ssize_t b):
        """The str of the ASCII bytes [a, b), one object per distinct text among recent ones."""
        cdef Py_ssize_t length = b - a
        cdef unsigned long long h, w1, w2
        cdef Py_ssize_t k, slot
        cdef object found
        if length > CACHE_MAX:
            return PyUnicode_DecodeASCII(<const char *> self.p + a, length, NULL)
        if length >= 8:  # the length and the first and last 8 bytes, mixed (the slot's text is compared whole)
            memcpy(&w1, self.p + a, 8)
            memcpy(&w2, self.p + b - 8, 8)
            h = (w1 * 0x9E3779B97F4A7C15ULL) ^ (w2 * 0xC2B2AE3D27D4EB4FULL) ^ (<unsigned long long> length << 7)
            h ^= h >> 29
        else:
            h = 1469598103934665603ULL ^ <unsigned long long> length
            k = a
            while k < b:
                h = (h ^ self.p[k]) * 1099511628211ULL
                k += 1
            h ^= h >> 29
        slot = <Py_ssize_t> (h & (CACHE_SLOTS - 1))
        found = self.cache[slot]
        if found is not None and len(<str> found) == length and memcmp(_data(found), self.p + a, length) == 0:
            return found
        found = PyUnicode_DecodeASCII(<const char *> self.p + a, length, NULL)
        self.cache[slot] = found
        return found

    cdef Py_ssize_t string(self, Py_ssize_t i, bint keep) except -3:
        """The string whose opening quote is at i - 1 (into self.val with keep); the index after its closing quote."""
        cdef Py_ssize_t a = i
        cdef unsigned char c
        while i < self.n:
            c = self.p[i]
            if c == 34:
                if i - a > self.max_string:
                    return OUT
                if keep:
                    self.val = self.ascii(a, i)
                return i + 1
            if c == 92 or c < 32 or c >= 128:
                return self.slow_string(a, keep)
            i += 1
        return MORE if not self.eof else OUT

    cdef Py_ssize_t slow_string(self, Py_ssize_t a, bint keep) except -3:
        """A string with escapes or non-ASCII bytes (module docstring)."""
        cdef bytearray text = bytearray()
        cdef Py_ssize_t i = a, start = a
        cdef unsigned char c
        cdef int code, k, d
        while i < self.n:
            c = self.p[i]
            if c == 34:
                text += self.buf[start:i]
                if len(text) > self.max_string or i - a > self.max_string:
                    return OUT
                try:
                    value = PyUnicode_DecodeUTF8(<const char *> text, len(text), NULL)
                except UnicodeDecodeError:
                    return OUT
                if keep:
                    self.val = value
                return i + 1
            if c < 32:
                return OUT
            if c == 92:
                text += self.buf[start:i]
                if i + 1 >= self.n:
                    return MORE if not self.eof else OUT
                c = self.p[i + 1]
                if c == 117:  # \uXXXX
                    if i + 6 > self.n:
                        return MORE if not self.eof else OUT
                    code = 0
                    for k in range(2, 6):
                        d = self.p[i + k]
                        if 48 <= d <= 57:
                            code = code * 16 + d - 48
                        elif 97 <= d <= 102:
                            code = code * 16 + d - 87
                        elif 65 <= d <= 70:
                            code = code * 16 + d - 55
                        else:
                            return OUT
                    if code == 0 or 0xD800 <= code <= 0xDFFF:
                        return OUT
                    text += chr(code).encode("utf-8")
                    i += 6
                else:
                    if c == 34 or c == 92 or c == 47:
                        text.append(c)
                    elif c == 98:
                        text.append(8)
                    elif c == 102:
                        text.append(12)
                    elif c == 110:
                        text.append(10)
                    elif c == 114:
                        text.append(13)
                    elif c == 116:
                        text.append(9)
                    else:
                        return OUT
                    i += 2
                start = i
                continue
            i += 1
        return MORE if not self.eof else OUT

    cdef Py_ssize_t number(self, Py_ssize_t i, bint keep) except -3:
        cdef Py_ssize_t a = i, digits_start
        cdef unsigned long long v = 0
        cdef int digits = 0, frac = 0, exp10 = 0, exp_sign = 1
        cdef bint neg = False, is_float = False, nonzero = False
        cdef char tmp[64]
        cdef double x
        if self.p[i] == 45:
            neg = True
            i += 1
            if i >= self.n:
                return MORE if not self.eof else OUT
        if self.p[i] == 48:
            i += 1
            digits = 1
        elif 49 <= self.p[i] <= 57:
            while i < self.n and 48 <= self.p[i] <= 57:
                if digits < 19:
                    v = v * 10 + (self.p[i] - 48)
                digits += 1
                i += 1
            nonzero = True
        else:
            return OUT
        if i < self.n and self.p[i] == 46:
            is_float = True
            i += 1
            digits_start = i
            while i < self.n and 48 <= self.p[i] <= 57:
                if self.p[i] != 48:
                    nonzero = True
                if digits < 19:
                    v = v * 10 + (self.p[i] - 48)
                    frac += 1
                digits += 1
                i += 1
            if i == digits_start:
                return MORE if i >= self.n and not self.eof else OUT
        if i < self.n and (self.p[i] == 101 or self.p[i] == 69):
            is_float = True
            i += 1
            if i < self.n and (self.p[i] == 43 or self.p[i] == 45):
                exp_sign = -1 if self.p[i] == 45 else 1
                i += 1
            digits_start = i
            while i < self.n and 48 <= self.p[i] <= 57:
                if exp10 < 100000:
                    exp10 = exp10 * 10 + (self.p[i] - 48)
                i += 1
            if i == digits_start:
                return MORE if i >= self.n and not self.eof else OUT
        if i >= self.n and not self.eof:
            return MORE  # the number may go on in the next read
        if not is_float:
            if digits > 19 or v > 9223372036854775807ULL:  # yajl's range: |n| <= 2**63 - 1
                return OUT
            if keep:
                self.val = PyLong_FromLongLong(-<long long> v if neg else <long long> v)
            return i
        while frac > 0 and v % 10 == 0 and digits <= 19:  # 1700000000000000.0: the fraction's trailing zeros
            v //= 10
            frac -= 1
        exp10 = exp_sign * exp10 - frac
        if digits <= 19 and v <= 9007199254740992ULL and -22 <= exp10 <= 22:
            # Clinger's fast path: the mantissa (< 2**53) and 10**|e| (|e| <= 22) are exact doubles, so one
            # IEEE multiplication or division gives the correctly rounded value, as float(text) does.
            x = <double> v * _POW10[exp10] if exp10 >= 0 else <double> v / _POW10[-exp10]
            if keep:
                self.val = -x if neg else x
            return i
        if i - a > MAX_NUMBER:
            return OUT
        memcpy(tmp, self.p + a, i - a)
        tmp[i - a] = 0
        x = PyOS_string_to_double(tmp, NULL, NULL)
        if isinf(x) or (x == 0.0 and nonzero):
            return OUT
        if keep:
            self.val = x
        return i

    cdef Py_ssize_t literal(self, Py_ssize_t i, const char *word, Py_ssize_t size, object value, bint keep) except -3:
        if i + size > self.n:
            if self.eof or memcmp(self.p + i, word, self.n - i) != 0:
                return OUT
            return MORE
        if memcmp(self.p + i, word, size) != 0:
            return OUT
        if keep:
            self.val = value
        return i + size

    cdef Py_ssize_t value(self, Py_ssize_t i, int depth, bint keep) except -3:
        """The value at i (blanks skipped), decoded into self.val with keep (else checked only); the index
        after it, MORE or OUT."""
        cdef unsigned char c
        i = self.ws(i)
        if i >= self.n:
            return MORE if not self.eof else OUT
        c = self.p[i]
        if c == 34:
            return self.string(i + 1, keep)
        if c == 123 or c == 91:
            if depth > self.max_nesting:
                return OUT
            return self.obj(i + 1, depth, keep, None, None) if c == 123 else self.arr(i + 1, depth, keep)
        if c == 45 or 48 <= c <= 57:
            return self.number(i, keep)
        if c == 116:
            return self.literal(i, b"true", 4, True, keep)
        if c == 102:
            return self.literal(i, b"false", 5, False, keep)
        if c == 110:
            return self.literal(i, b"null", 4, None, keep)
        return OUT

    cdef Py_ssize_t obj(self, Py_ssize_t i, int depth, bint keep, frozenset keys, frozenset args_keys) except -3:
        """The object whose '{' is at i - 1 (at `depth`), into self.val with keep. `keys`: only these
        members are kept (the others checked only); `args_keys`: the members kept of an "args" object (a
        non-object "args" is kept as None: the collector reads either as no args)."""
        cdef dict d = PyDict_New() if keep else None
        cdef object key
        cdef Py_ssize_t j
        i = self.ws(i)
        if i >= self.n:
            return MORE if not self.eof else OUT
        if self.p[i] == 125:
            self.val = d
            return i + 1
        while True:
            if i >= self.n:
                return MORE if not self.eof else OUT
            if self.p[i] != 34:
                return OUT
            i = self.string(i + 1, keep)
            if i < 0:
                return i
            key = self.val if keep else None
            i = self.ws(i)
            if i >= self.n:
                return MORE if not self.eof else OUT
            if self.p[i] != 58:
                return OUT
            if not keep or (keys is not None and key not in keys):
                i = self.value(i + 1, depth + 1, False)
                if i < 0:
                    return i
            else:
                if keys is not None and args_keys is not None and key == "args":
                    j = self.ws(i + 1)
                    if j >= self.n:
                        return MORE if not self.eof else OUT
                    if self.p[j] == 123:
                        if depth + 1 > self.max_nesting:
                            return OUT
                        i = self.obj(j + 1, depth + 1, True, args_keys, None)
                    else:
                        i = self.value(j, depth + 1, False)
                        self.val = None
                else:
                    i = self.value(i + 1, depth + 1, True)
                if i < 0:
                    return i
                PyDict_SetItem(d, key, self.val)  # a repeated key: the last value, as ijson's builder
            i = self.ws(i)
            if i >= self.n:
                return MORE if not self.eof else OUT
            if self.p[i] == 125:
                self.val = d
                return i + 1
            if self.p[i] != 44:
                return OUT
            i = self.ws(i + 1)

    cdef Py_ssize_t event(self, Py_ssize_t i, frozenset keys, frozenset args_keys) except -3:
        """An element of traceEvents (depth 3) into self.val: an object with only `keys` kept (obj),
        anything else checked and kept as None (the collector counts it, nothing more)."""
        i = self.ws(i)
        if i >= self.n:
            return MORE if not self.eof else OUT
        if self.p[i] == 123:
            return self.obj(i + 1, 3, True, keys, args_keys)
        i = self.value(i, 3, False)
        self.val = None
        return i

    cdef Py_ssize_t arr(self, Py_ssize_t i, int depth, bint keep) except -3:
        cdef list items = [] if keep else None
        i = self.ws(i)
        if i >= self.n:
            return MORE if not self.eof else OUT
        if self.p[i] == 93:
            self.val = items
            return i + 1
        while True:
            i = self.value(i, depth + 1, keep)
            if i < 0:
                return i
            if keep:
                items.append(self.val)
            i = self.ws(i)
            if i >= self.n:
                return MORE if not self.eof else OUT
            if self.p[i] == 93:
                self.val = items
                return i + 1
            if self.p[i] != 44:
                return OUT
            i += 1


@cython.final
cdef class _Reader:
    """The bytes of the stream in a buffer refilled by READ_BYTES; `unit` decodes one value, refilling
    while it runs past the buffer's end."""
    cdef object stream, progress, bytes_read
    cdef _Decoder dec
    cdef Py_ssize_t pos, read_bytes
    cdef bint eof

    def __cinit__(self, stream, progress, bytes_read, Py_ssize_t read_bytes):
        self.stream, self.progress, self.bytes_read, self.read_bytes = stream, progress, bytes_read, read_bytes
        self.dec = _Decoder()
        self.pos = 0
        self.eof = False

    cdef bint more(self) except -1:
        """Drop what was parsed and read more; False at the end of the file."""
        cdef bytes chunk
        if self.eof:
            return False
        chunk = self.stream.read(self.read_bytes)
        if self.progress is not None:
            self.progress(self.bytes_read())
        if not chunk:
            self.eof = True
            self.dec.set(self.dec.buf[self.pos:], True)
        else:
            self.dec.set(self.dec.buf[self.pos:] + chunk, False)
        self.pos = 0
        return True

    cdef int char(self) except -3:
        """The next non-blank byte (not consumed), -1 at the end of the file."""
        while True:
            self.pos = self.dec.ws(self.pos)
            if self.pos < self.dec.n:
                return self.dec.p[self.pos]
            if not self.more():
                return -1

    cdef int unit(self, int depth, frozenset keys=None, frozenset args_keys=None) except -3:
        """Decode one value into self.dec.val (an event's kept members only, with `keys`): OK or OUT."""
        cdef Py_ssize_t end
        while True:
            end = self.dec.value(self.pos, depth, True) if keys is None else \
                self.dec.event(self.pos, keys, args_keys)
            if end >= 0:
                self.pos = end
                return OK
            if end == OUT or self.dec.n - self.pos > MAX_UNIT:
                return OUT
            if not self.more():
                return OUT


def scan(stream, add, progress=None, bytes_read=None, Py_ssize_t read_bytes=READ_BYTES, keys=None, args_keys=None):
    """Feed every element of the trace's traceEvents to `add`, in order; True when the whole document is
    inside the accepted subset (module docstring), False at the first byte outside it (then `add` has
    seen some events and the caller discards them). With `keys`, each event is decoded with only the
    members `keys` names (and of its "args" object, `args_keys`), the rest checked and dropped; an event
    that is not an object is given as None."""
    cdef frozenset event_keys = frozenset(keys) if keys is not None else None
    cdef frozenset event_args_keys = frozenset(args_keys) if args_keys is not None else None
    cdef _Reader r = _Reader(stream, progress, bytes_read, max(1, read_bytes))
    cdef int c
    cdef bint seen = False, first = True
    cdef Adder fast_add = add if isinstance(add, Adder) else None
    if r.char() != 123:
        return False
    r.pos += 1
    while True:
        c = r.char()
        if c == 125 and first:
            r.pos += 1
            break
        if c != 34:
            return False
        if r.unit(2) != OK:
            return False
        key = r.dec.val
        if r.char() != 58:
            return False
        r.pos += 1
        if key == "traceEvents":
            if r.char() != 91:
                return False
            r.pos += 1
            if r.char() == 93:
                r.pos += 1
            else:
                while True:
                    if r.unit(3, event_keys, event_args_keys) != OK:
                        return False
                    if fast_add is not None:
                        fast_add.add(r.dec.val)
                    else:
                        add(r.dec.val)
                    c = r.char()
                    r.pos += 1
                    if c == 93:
                        break
                    if c != 44:
                        return False
            seen = True
        else:
            if r.unit(2) != OK:
                return False
        first = False
        c = r.char()
        r.pos += 1
        if c == 125:
            break
        if c != 44:
            return False
    return r.char() == -1 and seen


# ----- the collector's per-event work, compiled (load.py's _Collector.add is the reference) -----------
cdef extern from "Python.h":
    PyObject *PyType_GenericAlloc(PyTypeObject *t, Py_ssize_t n) except NULL
    ctypedef struct PyTypeObject

from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.tuple cimport PyTuple_SET_ITEM

cdef dict _NO_ARGS = {}


cdef inline object _record(type cls, tuple items):
    """cls(*items) for a NamedTuple class: the tuple subclass's instance, as tuple.__new__(cls, items)."""
    cdef Py_ssize_t n = len(items), k
    cdef object out = <object> PyType_GenericAlloc(<PyTypeObject *> cls, n)
    Py_DECREF(out)  # the cast took a second reference
    for k in range(n):
        item = items[k]
        Py_INCREF(item)
        PyTuple_SET_ITEM(out, k, item)
    return out


@cython.final
cdef class Adder:
    """The collector's `add` (sim/kineto/load.py _Collector) for the events the scanner decodes: the common
    events (ph "X" of a GPU or host category, well-formed) are kept here, in the reference's order of
    operations and with its checks; everything else calls the collector's own methods (times, name,
    comm_args, step, frozen shapes, thread names, flush), so a refusal is the reference's."""
    cdef object col, frozen, limit
    cdef type device_t, host_t
    cdef frozenset gpu_cats, host_cats
    cdef tuple nccl_args
    cdef double max_t
    cdef dict names
    cdef list host, device
    cdef dict shapes
    cdef public long long count, gpu_events, host_ops
    cdef bint first_seen

    def __init__(self, col, frozen, device_t, host_t, gpu_cats, host_cats, nccl_args, double max_t):
        self.col, self.frozen, self.limit = col, frozen, col.limit
        self.device_t, self.host_t = device_t, host_t
        self.gpu_cats, self.host_cats, self.nccl_args, self.max_t = gpu_cats, host_cats, tuple(nccl_args), max_t
        self.names = col.names
        self.count, self.gpu_events, self.host_ops = col.count, col.gpu_events, col.host_ops
        self.first_seen = col.first_device is not None
        self.refresh()

    cdef void refresh(self):
        self.host, self.device, self.shapes = self.col.host, self.col.device, self.col.shapes

    def finish(self):
        """Write the counts back to the collector."""
        col = self.col
        col.count, col.gpu_events, col.host_ops = self.count, self.gpu_events, self.host_ops

    def __call__(self, ev):
        self.add(ev)

    cdef int add(self, object ev) except -1:
        self.count += 1
        if type(ev) is not dict:
            return 0
        ph = (<dict> ev).get("ph")
        if type(ph) is str and <str> ph == "X":
            cat = (<dict> ev).get("cat")
            if type(cat) is not str:
                cat = None
            if cat in self.gpu_cats:
                self.add_device(<dict> ev, cat)
            elif cat in self.host_cats and type((<dict> ev).get("tid")) is int:
                self.add_host(<dict> ev, cat)
            if self.limit is not None and not self.count & 1023 and \
                    len(self.host) + len(self.device) > self.limit:
                self.col.count = self.count
                self.col.flush()
                self.refresh()
        elif type(ph) is str and <str> ph == "M":
            self.col.count = self.count - 1
            self.col.add(ev)
        return 0

    cdef tuple times(self, dict ev):
        ts, dur = ev.get("ts"), ev.get("dur", 0.0)
        if type(ts) is float and type(dur) is float and -self.max_t <= <double> ts <= self.max_t and \
                0.0 <= <double> dur <= self.max_t:
            return (ts, dur)
        self.col.count = self.count
        return tuple(self.col.times(ev))

    cdef object name(self, dict ev):
        name = ev.get("name", "")
        if type(name) is str:
            found = self.names.get(name)
            if found is not None and len(<str> found):
                return found
        self.col.count = self.count
        return self.col.name(name)

    cdef object comm(self, dict args):
        for key in self.nccl_args:
            if key in args:
                self.col.count = self.count
                return self.col.comm_args(args)
        return None

    cdef object shape(self, object value):
        """col.shared(_frozen(value)) for a truthy value; the common list of flat lists built here."""
        cdef list items
        cdef tuple out
        cdef Py_ssize_t k
        if type(value) is not list:
            return ()
        items = <list> value
        for v in items:
            if type(v) is dict:
                return self.col.shared(self.frozen(value))
            if type(v) is list:
                for x in <list> v:
                    if type(x) is list or type(x) is dict:
                        return self.col.shared(self.frozen(value))
        out = tuple([tuple(<list> v) if type(v) is list else v for v in items])
        if not out:
            return ()
        return self.shapes.setdefault(out, out)

    cdef int add_device(self, dict ev, str cat) except -1:
        args = ev.get("args")
        if type(args) is not dict:
            args = _NO_ARGS
        ts, dur = self.times(ev)
        device, stream = ev.get("pid", 0), (<dict> args).get("stream", ev.get("tid", 0))
        if type(device) is not int or type(stream) is not int:
            return 0
        corr = (<dict> args).get("correlation", -1)
        self.gpu_events += 1
        if not self.first_seen:
            self.first_seen = True
            self.col.first_device = device
        name = self.name(ev)
        self.device.append(_record(self.device_t, (ts, dur, device, stream, name, cat,
                                                   corr if type(corr) is int else -1, self.comm(<dict> args))))
        return 0

    cdef int add_host(self, dict ev, str cat) except -1:
        args = ev.get("args")
        if type(args) is not dict:
            args = _NO_ARGS
        ts, dur = self.times(ev)
        corr = (<dict> args).get("correlation", -1)
        dims, types = (<dict> args).get("Input Dims"), (<dict> args).get("Input type")
        name = self.name(ev)
        self.host.append(_record(self.host_t, (ts, dur, ev["tid"], name, cat, corr if type(corr) is int else -1,
                                               self.shape(dims) if dims else (), self.shape(types) if types else (),
                                               self.comm(<dict> args))))
        self.host_ops += 1
        if cat == "user_annotation":
            self.col.count = self.count
            self.col.step(name, ts, dur)
        return 0


def records(type cls, list rows):
    """[cls._make(row) for row in rows] for a NamedTuple class and rows of tuples (a spill's records back)."""
    cdef Py_ssize_t size = len(cls._fields)
    out = []
    for row in rows:
        if type(row) is not tuple or len(<tuple> row) != size:
            out.append(cls._make(row))  # the reference's own answer (its TypeError included)
        else:
            out.append(_record(cls, <tuple> row))
    return out


from bisect import bisect_right as _bisect_right


def route(list records, int side, list starts, list ends, list reach, list order, list bufs):
    """spill.route compiled (the same statements; Python's comparisons and bisect): each record appended
    to the buffer of every window holding its start (rec[0])."""
    cdef Py_ssize_t i
    for rec in records:
        ts = rec[0]
        i = _bisect_right(starts, ts) - 1
        while i >= 0 and reach[i] >= ts:
            if ends[i] >= ts:
                (<list> (<tuple> bufs[order[i]])[side]).append(rec)
            i -= 1


def sweep_runtime(list ops, set corrs, frozenset runtime, type launch_t, comm_match, label_match):
    """context._sweep(ops, corrs=corrs) with its _launch_of, compiled (the same statements, Python's
    comparisons): correlation -> Launch of each runtime call whose correlation is in `corrs` (ops of one
    thread sorted by start; HostOp fields by position: ts 0, dur 1, tid 2, name 3, cat 4, corr 5, dims 6,
    args 8)."""
    cdef dict found = {}
    cdef list stack = [], ends = []
    cdef Py_ssize_t k
    for op in ops:
        ts, cat = op[0], op[4]
        while ends and ends[len(ends) - 1] <= ts:  # (no negative index: wraparound is off)
            stack.pop()
            ends.pop()
        if cat in runtime:
            corr = op[5]
            if corr in corrs:
                shape = comm = label = None
                for k in range(len(stack) - 1, -1, -1):
                    open_op = stack[k]
                    if shape is None and open_op[4] == "cpu_op" and open_op[6]:
                        shape = open_op
                    if comm is None and (comm_match(open_op[3]) or (open_op[8] and "Collective name" in open_op[8])):
                        comm = open_op
                    if label is None and open_op[4] == "user_annotation" and label_match(open_op[3]):
                        label = open_op[3]
                found[corr] = _record(launch_t, (ts, op[2], shape, comm, label))
        else:
            stack.append(op)
            ends.append(ts + op[1])
    return found
