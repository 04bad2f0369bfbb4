"""The compiled trace reader (sim/kineto/_collect.pyx, built by setup.py when a C compiler is present) and
its fallback to the reference reader (sim/kineto/jsonstream.py's parsers, load.py's _Collector).

`collect` runs the compiled byte scanner over the file, handing each event to the collector (its compiled
`add`, _collect.Adder, which keeps the common events itself and calls the collector's methods for the
rest); the scanner
accepts only a strict subset of what the reference parser accepts (_collect.pyx's docstring) and decodes
each event into the value yajl2_c builds, so when it finishes, the collector holds what the reference
run gives. At anything else (a byte outside that subset, an unreadable file, a field the collector
refuses) it gives up, discards what it collected, and the reference reads the file from the start: its
result, or its one-line error, is the answer. The members before traceEvents are always the reference
parser's (a few KB). tests/test_kineto_fast.py checks compiled == reference on generated traces.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import UserError
from meshsim.sim.kineto.jsonbase import Progress, open_binary

try:
    from meshsim.sim.kineto import _collect
except ImportError:  # no C compiler at install time: the reference reader runs
    _collect = None

AVAILABLE = _collect is not None
READ_BYTES = 1 << 20  # bytes per read of the (decompressed) file
COMPILED_ADD = True  # the collector's per-event work compiled too (_collect.Adder; tests compare both)


def collect(path: Path, col: Any, progress: Progress | None, members: Callable[[Path], list[tuple[str, Any]]],
            adder: tuple = (), keys: tuple | None = None) -> bool:
    """Feed `col` every event of `path` with the compiled scanner, and the members `members(path)` gives;
    False (col to be discarded) when the reference must read the file instead (module docstring).
    `adder`: the arguments of _collect.Adder after the collector (its compiled `add`; without them, or
    with COMPILED_ADD False, the collector's own `add` takes each event). `keys`: (event keys, args keys),
    the only members the collector reads: the rest are checked and dropped as they are scanned."""
    if _collect is None:
        return False
    try:
        compiled = bool(adder) and COMPILED_ADD
        add = _collect.Adder(col, *adder) if compiled else col.add
        stream, bytes_read = open_binary(path)
        with stream:
            done = _collect.scan(stream, add, progress, bytes_read, READ_BYTES, *(keys or (None, None)))
        if compiled:
            add.finish()
    except (UserError, OSError, EOFError, zlib.error, MemoryError, RecursionError):
        done = False
    if not done:
        if col.spill is not None:
            col.spill.close()
        return False
    for key, value in members(path):
        col.members[key] = value
    return True


def typed(cls: type, rows: list[tuple]) -> list:
    """[cls._make(row) for row in rows], compiled when the extension is built (sim/kineto/spill.py)."""
    return _collect.records(cls, rows) if _collect is not None else list(map(cls._make, rows))
