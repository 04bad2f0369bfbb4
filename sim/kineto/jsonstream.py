"""A Kineto trace JSON read one event at a time, in bounded time and memory.

A PyTorch-profiler trace is one JSON object: a few small members (schemaVersion, deviceProperties,
distributedInfo, ...) and `traceEvents`, an array of millions of small objects. `iter_trace` yields
("member", (key, value)) for each top-level member written before traceEvents, then ("event", value) for
each element of traceEvents. Members after traceEvents (Kineto writes traceName, displayTimeUnit and
baseTimeNanoseconds there; meshsim reads none of them) are parsed as JSON and checked, not returned.

Three parsers, one result (tests/test_kineto_hostile.py runs the same hostile corpus through each):
- "compiled" (default when the optional extension is built): sim/kineto/_collect.pyx scans the bytes and
  hands each event to the collector (sim/kineto/fast.py; read_rank only), giving way to the reference
  parser (yajl2_c, else python) at anything outside the strict subset it accepts; `iter_trace` itself
  runs the reference parser;
- "yajl2_c" (default when ijson's C backend is installed): ijson.items(..., "traceEvents.item") builds
  each event in C, ~2.2x the events per CPU-second of json's decoder called per event (benchmarks/
  trace_read.py); the members before traceEvents come from ijson.parse (a few KB). yajl refuses NaN,
  Infinity, integers outside int64 and floats that overflow.
- "python" (the fallback without ijson): the top-level object walked by hand, each element decoded by
  json.JSONDecoder.raw_decode on a text buffer refilled from the file, with NaN / Infinity, integers
  outside int64 and overflowing floats refused by the decoder's hooks.
Limits on both (meshsim.sim.core.limits, README "Limits"): containers nested at most MAX_NESTING deep
(the top-level object is depth 1, an event depth 3), a string or a member of at most MAX_VALUE_BYTES.
The yajl path checks nesting and string length on the raw bytes before yajl sees them (`_Guard`: its
prefix bookkeeping grows with depth squared, 6 GB at 50,000 levels), so a hostile file costs its bytes'
reading, never more. Every failure is one UserError naming the file, the byte or character offset and
what was found (`meshsim trace` exits 2, no traceback).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from meshsim.sim.core.limits import MAX_NESTING
from meshsim.sim.kineto.jsonbase import FIX, MAX_VALUE_BYTES, Progress, _error, open_binary
from meshsim.sim.kineto.jsonstream_py import iter_trace_python

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "FIX", "Progress", "iter_trace"]

try:  # the C backend only: ijson's pure-Python backends are slower than the fallback below
    import ijson.backends.yajl2_c as _yajl
    from ijson.common import JSONError, ObjectBuilder
except ImportError:  # pragma: no cover - exercised by forcing backend="python" in the tests
    _yajl = None

try:  # the compiled byte scanner (setup.py builds it where a C compiler is present; sim/kineto/fast.py)
    from meshsim.sim.kineto import _collect
except ImportError:
    _collect = None

BACKENDS = ("compiled", "yajl2_c", "python")
PARSER_ENV = "MESHSIM_TRACE_PARSER"  # compiled, yajl2_c or python: the parser used when none is named
REFERENCE = "yajl2_c" if _yajl is not None else "python"  # the reference parser (and the compiled one's fallback)
DEFAULT_BACKEND = os.environ.get(PARSER_ENV) if os.environ.get(PARSER_ENV) in BACKENDS else \
    "compiled" if _collect is not None and _yajl is not None else REFERENCE
READ_BYTES = 1 << 18  # bytes per read of the (decompressed) file


# ----- nesting and string length on raw bytes (yajl path) --------------------------------------------
_KEEP = bytes(range(256)).translate(None, b'"[]{}')  # every byte but quotes and brackets: deleted
QUOTE = ord('"')
_SIGN = np.zeros(256, dtype=np.int8)  # openers +1, closers -1
_SIGN[[ord("["), ord("{")]], _SIGN[[ord("]"), ord("}")]] = 1, -1


class _Guard:
    """A file-like reader handing yajl the raw bytes, after refusing nesting deeper than MAX_NESTING or a
    string longer than MAX_VALUE_BYTES in them. Exact for valid JSON: escapes (\\\\, \\") are dropped, then
    everything but quotes and brackets; a bracket after an odd number of quotes is inside a string; the
    running sum of +1 (opener) / -1 (closer) over the others is the depth (numpy: ~1 ms per MB). State carried across reads: the depth, whether
    a string is open, a trailing backslash."""

    def __init__(self, stream: BinaryIO, path: Path, progress: Progress | None, bytes_read: Callable[[], int]):
        self.stream, self.path, self.progress, self.bytes_read = stream, path, progress, bytes_read
        self.offset = self.depth = self.string_run = 0
        self.in_string, self.carry = False, b""

    def read(self, size: int = READ_BYTES) -> bytes:
        try:
            data = self.stream.read(size)
        except (EOFError, OSError, zlib.error) as err:
            raise _error(self.path, f"Unreadable or truncated file ({type(err).__name__}: {err})", self.offset) from None
        if self.progress is not None:
            self.progress(self.bytes_read())
        self._check(data)
        self.offset += len(data)
        return data

    def _check(self, data: bytes) -> None:
        text = self.carry + data if self.carry else data
        self.carry = b""
        if b"\\" in text:
            tail = len(text) - len(text.rstrip(b"\\"))
            if tail % 2:  # an escape cut by the read: its backslash goes with the next read
                text, self.carry = text[:-1], b"\\"
            text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
        marks = np.frombuffer(text.translate(None, _KEEP), dtype=np.uint8)
        was_open = self.in_string
        if marks.size:
            quotes = np.cumsum(marks == QUOTE, dtype=np.int64) + was_open  # odd: inside a string
            steps = _SIGN[marks[(quotes & 1) == 0]]
            self.in_string = bool(quotes[-1] & 1)
            if steps.size:
                path = np.cumsum(steps, dtype=np.int64) + self.depth
                if path.max() > MAX_NESTING:
                    raise _error(self.path, f"Nested more than {MAX_NESTING} levels (README, Limits)", self.offset)
                self.depth = int(path[-1])
        last_quote = text.rfind(b'"')
        self.string_run = (self.string_run + len(text) if was_open and last_quote < 0 else len(text) - last_quote - 1) \
            if self.in_string else 0
        if self.string_run > MAX_VALUE_BYTES:
            raise _error(self.path, f"A string longer than {MAX_VALUE_BYTES >> 20} MiB (README, Limits)", self.offset)


def _yajl_problem(err: Exception) -> str:
    text = str(err).strip().strip("b'\"").split("\\n")[0].split("\n")[0]
    if "premature EOF" in text:
        return "The file ends inside the document (truncated?)"
    if "trailing garbage" in text:
        return "Unexpected text after the trace object"
    return f"Malformed JSON ({text[:120]})"


def _yajl_members(path: Path) -> Iterator[tuple[str, Any]]:
    """(key, value) of the top-level members before traceEvents (ijson.parse, stopped at traceEvents);
    UserError when the document is not an object or has no traceEvents."""
    stream, bytes_read = open_binary(path)
    with stream:
        guard = _Guard(stream, path, None, bytes_read)
        tokens = _yajl.parse(guard, use_float=True, buf_size=READ_BYTES)
        try:
            first = next(tokens, None)
            if first is None or first[1] != "start_map":
                raise _error(path, "Expected '{' (a trace is one JSON object)" if first else
                             "The file ends where '{' was expected (truncated?)", 0)
            key, builder, start = None, None, 0
            for prefix, event, value in tokens:
                if prefix == "" and event == "map_key":
                    if value == "traceEvents":
                        return
                    key, builder, start = value, ObjectBuilder(), guard.offset
                elif prefix == "" and event == "end_map":
                    raise _error(path, "No traceEvents in it (not a PyTorch profiler trace?)", None)
                else:
                    builder.event(event, value)
                    if guard.offset - start > MAX_VALUE_BYTES:
                        raise _error(path, f"Member {key[:80]!r} is larger than {MAX_VALUE_BYTES >> 20} MiB", start)
                    if prefix == key and event not in ("start_map", "start_array", "map_key"):
                        yield key, builder.value
        except (JSONError, UnicodeDecodeError, ValueError) as err:
            raise _error(path, _yajl_problem(err), guard.offset) from None
    raise _error(path, "The file ends inside the document (truncated?)", None)


def _yajl_events(path: Path, progress: Progress | None) -> Iterator[Any]:
    stream, bytes_read = open_binary(path)
    with stream:
        guard = _Guard(stream, path, progress, bytes_read)
        try:
            yield from _yajl.items(guard, "traceEvents.item", use_float=True, buf_size=READ_BYTES)
        except (JSONError, UnicodeDecodeError, ValueError) as err:
            raise _error(path, _yajl_problem(err), guard.offset) from None


def iter_trace(path: str | Path, progress: Progress | None = None, backend: str | None = None
               ) -> Iterator[tuple[str, Any]]:
    """("member", (key, value)) for each top-level member before traceEvents, then ("event", value) for
    each element of traceEvents, in file order (module docstring); `backend`: one of BACKENDS."""
    path = Path(path)
    backend = backend or DEFAULT_BACKEND
    if backend == "compiled":  # events one by one: the reference parser (sim/kineto/load.py runs the compiled one)
        backend = REFERENCE
    if backend == "python" or _yajl is None:
        yield from iter_trace_python(path, progress)
        return
    for member in _yajl_members(path):
        yield "member", member
    for event in _yajl_events(path, progress):
        yield "event", event


