"""What both trace parsers share (sim/kineto/jsonstream.py, jsonstream_py.py): the file opened (plain or
gzip, told by its first two bytes), the limits, the one-line error, json's decoder with the limits' hooks."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from meshsim.sim.core.errors import FilePath, UserError

MAX_VALUE_BYTES = 64 << 20  # a string, an event or a top-level member (64 MiB)
INT64 = 1 << 63
GZIP_MAGIC = b"\x1f\x8b"
FIX = "give the JSON (or .json.gz) file torch.profiler's export_chrome_trace / tensorboard_trace_handler wrote"

Progress = Callable[[int], None]  # called with the compressed/plain bytes read so far


def _error(path: Path, problem: str, at: int | None, unit: str = "byte") -> UserError:
    where = f" at {unit} {at:,}" if at is not None else ""
    return UserError("trace", FilePath(path), FIX, problem=f"{problem}{where}")


def open_binary(path: Path) -> tuple[BinaryIO, Callable[[], int]]:
    """The file's bytes (gunzipped when it starts with the gzip magic) and a function giving the bytes of
    the file itself read so far (for a progress bar)."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed with the returned stream
    except OSError as err:
        raise UserError("trace", FilePath(path), FIX, problem=f"Cannot open it ({err.strerror or err})") from None
    gz = raw.read(2) == GZIP_MAGIC
    raw.seek(0)
    return (gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw), raw.tell


def text_stream(path: Path) -> tuple[io.TextIOBase, Callable[[], int]]:
    """The file as UTF-8 text (the python backend)."""
    binary, bytes_read = open_binary(path)
    return io.TextIOWrapper(binary, encoding="utf-8", errors="strict"), bytes_read


def refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def int64(text: str) -> int:
    if len(text) > 20 or not -INT64 <= (value := int(text)) < INT64:
        raise ValueError("integer overflow")
    return value


def finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("numeric (floating point) overflow")
    return value


DECODER = json.JSONDecoder(parse_constant=refuse_constant, parse_int=int64, parse_float=finite_float)
