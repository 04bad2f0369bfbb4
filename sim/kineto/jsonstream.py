"""A Kineto trace JSON read one event at a time, in bounded memory, with the standard library only.

A PyTorch-profiler trace is one JSON object: a few small members (schemaVersion, deviceProperties,
distributedInfo, traceName, baseTimeNanoseconds, ...) and `traceEvents`, an array of millions of small
objects. `iter_trace` walks the top-level object itself and hands each array element to
`json.JSONDecoder.raw_decode` (the C decoder json.load uses), on a text buffer of CHUNK_CHARS characters
refilled from the file (gzip or plain, told by its first two bytes, 1f 8b). Memory is the buffer plus
one event, whatever the file's size; time is json's own per byte plus one Python call per event. Why
not ijson: the C decoder is as fast on objects of ~300 bytes, and no dependency is added.

An element that straddles the end of the buffer fails to decode with an error at the buffer's end; the
buffer is then refilled and the element decoded again. An error before the buffer's end, or the file
ending inside the document, is a malformed or truncated trace: one UserError naming the file, the
character offset and what was found (`meshsim trace` exits 2, no traceback).
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import UserError
from meshsim.sim.core.limits import MAX_NESTING
from meshsim.sim.core.userio import check_depth

CHUNK_CHARS = 1 << 22  # characters read per refill (4 Mi: the buffer holds at most ~2 chunks)
MAX_MEMBER_CHARS = 1 << 26  # a top-level member other than traceEvents larger than this is refused (64 Mi)
GZIP_MAGIC = b"\x1f\x8b"
FIX = "give the JSON (or .json.gz) file torch.profiler's export_chrome_trace / tensorboard_trace_handler wrote"
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()

Progress = Callable[[int], None]  # called with the compressed/plain bytes read so far


def open_text(path: Path) -> tuple[io.TextIOBase, Callable[[], int]]:
    """The file as text (gunzipped when it starts with the gzip magic) and a function giving the bytes
    of the file read so far (for a progress bar)."""
    raw = open(path, "rb")  # noqa: SIM115 - closed with the text wrapper
    gz = raw.read(2) == GZIP_MAGIC
    raw.seek(0)
    binary = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    return io.TextIOWrapper(binary, encoding="utf-8", errors="strict"), raw.tell


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
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(text):
                return text[pos]
            if not self.more():
                return ""

    def expect(self, chars: str, what: str) -> str:
        found = self.skip_ws()
        if not found or found not in chars:
            raise self.error(f"Expected {what}, found {found[:1]!r}" if found else
                             f"The file ends where {what} was expected (truncated?)")
        self.pos += 1
        return found

    def value(self, limit: int | None = None) -> Any:
        """Decode one JSON value at the cursor, refilling while it runs past the buffer's end."""
        self.skip_ws()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as err:
                at_end = err.pos >= len(self.text) - 1 or "Unterminated" in err.msg
                if at_end and (limit is None or len(self.text) - self.pos < limit) and self.more():
                    continue
                if at_end and self.eof:
                    raise self.error("The file ends inside an event (truncated?)") from None
                raise self.error(f"Malformed JSON ({err.msg})", err.pos) from None
            except RecursionError:
                raise self.error(f"Nested more than {MAX_NESTING} levels (README, Limits)") from None
            except ValueError as err:  # an integer of more than 4,300 digits
                raise self.error(f"Not a plain JSON number ({err})"[:160]) from None
            if isinstance(value, dict | list):
                check_depth(value, str(self.path), "trace JSON", start=2)
            if end >= len(self.text) and not isinstance(value, dict | list | str) and self.more():
                continue  # a number or literal cut by the buffer's end: decode it again, whole
            self.pos = end
            return value

    def error(self, problem: str, pos: int | None = None) -> UserError:
        at = self.offset + (self.pos if pos is None else pos)
        return UserError("trace", str(self.path), FIX, problem=f"{problem} at character {at:,}")


def iter_trace(path: str | Path, progress: Progress | None = None) -> Iterator[tuple[str, Any]]:
    """("member", (key, value)) for each top-level member but traceEvents, ("event", dict) for each
    element of traceEvents, in file order."""
    path = Path(path)
    try:
        fh, bytes_read = open_text(path)
    except OSError as err:
        raise UserError("trace", str(path), FIX, problem=f"Cannot open it ({err.strerror or err})") from None
    with fh:
        buf = _Buffer(fh, path, progress, bytes_read)
        buf.expect("{", "'{' (a trace is one JSON object)")
        if buf.skip_ws() == "}":
            return
        while True:
            key = buf.value(limit=MAX_MEMBER_CHARS)
            if not isinstance(key, str):
                raise buf.error("Expected a member name")
            buf.expect(":", "':'")
            if key == "traceEvents":
                yield from _events(buf)
            else:
                yield "member", (key, buf.value(limit=MAX_MEMBER_CHARS))
            if buf.expect(",}", "',' or '}'") == "}":
                break
        if buf.skip_ws():
            raise buf.error("Unexpected text after the trace object")


def _events(buf: _Buffer) -> Iterator[tuple[str, Any]]:
    buf.expect("[", "'[' (traceEvents is a list)")
    if buf.skip_ws() == "]":
        buf.pos += 1
        return
    while True:
        yield "event", buf.value(limit=MAX_MEMBER_CHARS)
        if buf.expect(",]", "',' or ']' between events") == "]":
            return
