"""The pure-Python trace parser (sim/kineto/jsonstream.py's fallback, without ijson): the top-level object
walked by hand, each element of traceEvents decoded by json's C decoder (`raw_decode`) on a text buffer
of CHUNK_CHARS characters refilled from the file.

An element that straddles the end of the buffer fails to decode (at the end, or earlier for a cut escape
or literal); the buffer is then refilled and the element decoded again, up to MAX_VALUE_BYTES. An error
that stays once the file is read to its end is a malformed or truncated trace. The same limits as the yajl path: NaN,
Infinity, integers outside int64 and overflowing floats refused by the decoder's hooks; containers
nested at most MAX_NESTING deep (top-level object = 1); a value of at most MAX_VALUE_BYTES characters.
Members after traceEvents are parsed and checked, not returned (as the yajl path).
"""

from __future__ import annotations

import io
import json
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import FilePath, UserError
from meshsim.sim.core.limits import MAX_NESTING
from meshsim.sim.kineto.jsonbase import DECODER, FIX, MAX_VALUE_BYTES, Progress, _error, text_stream

CHUNK_CHARS = 1 << 22  # characters read per refill (4 Mi: the buffer holds at most ~2 chunks)

_NOT_BLANK = re.compile(r"[^ \t\n\r]")


def check_nesting(value: object, depth: int, path: Path, at: int) -> None:
    """UserError when a container inside `value` (itself at `depth`) is deeper than MAX_NESTING."""
    stack = [(value, depth)]
    while stack:
        node, d = stack.pop()
        if d > MAX_NESTING:
            raise _error(path, f"Nested more than {MAX_NESTING} levels (README, Limits)", at, "character")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, d + 1) for c in children if isinstance(c, dict | list))


class _Buffer:
    """A window of the text: `text[pos:]` is still to be parsed; `more()` appends a chunk."""

    def __init__(self, fh: io.TextIOBase, path: Path, progress: Progress | None, bytes_read: Callable[[], int]):
        self.fh, self.path, self.progress, self.bytes_read = fh, path, progress, bytes_read
        self.text, self.pos, self.offset, self.eof = "", 0, 0, False

    def more(self) -> bool:
        """Read one more chunk (dropping what was parsed); False at the end of the file."""
        if self.eof:
            return False
        try:
            chunk = self.fh.read(CHUNK_CHARS)
        except (EOFError, OSError, zlib.error, UnicodeDecodeError) as err:
            raise self.error(f"Unreadable or truncated file ({type(err).__name__}: {err})") from None
        if self.progress is not None:
            self.progress(self.bytes_read())
        if not chunk:
            self.eof = True
            return False
        self.offset += self.pos
        self.text = self.text[self.pos:] + chunk
        self.pos = 0
        return True

    def skip_ws(self) -> str:
        """The next non-blank character (refilling as needed), '' at the end of the file."""
        while True:
            found = _NOT_BLANK.search(self.text, self.pos)
            if found is not None:
                self.pos = found.start()
                return self.text[self.pos]
            self.pos = len(self.text)
            if not self.more():
                return ""

    def expect(self, chars: str, what: str) -> str:
        found = self.skip_ws()
        if not found or found not in chars:
            raise self.error(f"Malformed JSON (expected {what}, found {found[:1]!r})" if found else
                             f"The file ends where {what} was expected (truncated?)")
        self.pos += 1
        return found

    def value(self, depth: int) -> Any:
        """Decode one JSON value at the cursor (at nesting `depth`), refilling while it runs past the
        buffer's end."""
        self.skip_ws()
        while True:
            try:
                value, end = DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as err:  # perhaps only cut by the buffer's end: refill, decode again
                if len(self.text) - self.pos <= MAX_VALUE_BYTES and self.more():
                    continue
                if not self.eof:
                    raise self.error(f"A value larger than {MAX_VALUE_BYTES >> 20} MiB (README, Limits)") from None
                if err.pos >= len(self.text) - 1 or "Unterminated" in err.msg:
                    raise self.error("The file ends inside the document (truncated?)") from None
                raise self.error(f"Malformed JSON ({err.msg})", err.pos) from None
            except RecursionError:
                raise self.error(f"Nested more than {MAX_NESTING} levels (README, Limits)") from None
            except ValueError as err:  # the decoder's hooks: NaN / Infinity, integer or float overflow
                raise self.error(f"Malformed JSON ({str(err)[:120]})") from None
            if end >= len(self.text) and not isinstance(value, dict | list | str) and self.more():
                continue  # a number or literal cut by the buffer's end: decode it again, whole
            if end - self.pos > MAX_VALUE_BYTES:
                raise self.error(f"A value larger than {MAX_VALUE_BYTES >> 20} MiB (README, Limits)")
            if isinstance(value, dict | list):
                check_nesting(value, depth, self.path, self.offset + self.pos)
            self.pos = end
            return value

    def error(self, problem: str, pos: int | None = None) -> UserError:
        return _error(self.path, problem, self.offset + (self.pos if pos is None else pos), "character")


def iter_trace_python(path: Path, progress: Progress | None = None) -> Iterator[tuple[str, Any]]:
    """jsonstream.iter_trace's items, parsed with json's decoder (module docstring)."""
    fh, bytes_read = text_stream(path)
    with fh:
        buf = _Buffer(fh, path, progress, bytes_read)
        buf.expect("{", "'{' (a trace is one JSON object)")
        seen = False
        if buf.skip_ws() != "}":
            while True:
                key = buf.value(2)
                if not isinstance(key, str):
                    raise buf.error("Expected a member name")
                buf.expect(":", "':'")
                if key == "traceEvents":  # a second one is read too, as ijson.items reads it
                    yield from _events(buf)
                    seen = True
                elif seen:
                    buf.value(2)  # after traceEvents: checked, not returned
                else:
                    yield "member", (key, buf.value(2))
                if buf.expect(",}", "',' or '}'") == "}":
                    break
        else:
            buf.pos += 1
        if buf.skip_ws():
            raise buf.error("Unexpected text after the trace object")
        if not seen:
            raise UserError("trace", FilePath(path), FIX, problem="No traceEvents in it (not a PyTorch "
                            "profiler trace?)")


def _events(buf: _Buffer) -> Iterator[tuple[str, Any]]:
    buf.expect("[", "'[' (traceEvents is a list)")
    if buf.skip_ws() == "]":
        buf.pos += 1
        return
    while True:
        yield "event", buf.value(3)
        if buf.expect(",]", "',' or ']' between events") == "]":
            return
