"""A trace's kept records held on disk while it is read, and split there by time window, so that a trace
larger than memory is parsed once (sim/kineto/load.py, ranks.py).

A Spill is an anonymous temporary file of marshal'd chunks, each (host records, device records) as plain
tuples (marshal keeps an interned name or a shared shape tuple once per chunk), each chunk after its
length (8 bytes): read whole and decoded by marshal.loads (marshal.load on the file reads it object by
object, ~10x slower). `split` reads a spill
once and appends each record to the spill of every window its start falls in ([from, to], inclusive;
any order or overlap), so n batches cost one write and one read of the records, not n parses of the
trace.
"""

from __future__ import annotations

import marshal
import tempfile
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate

from meshsim.sim.kineto.fast import _collect, typed
from meshsim.sim.kineto.records import DeviceEvent, HostOp

Window = tuple[float, float]  # [from, to] in the trace's us
FLUSH_RECORDS = 4096  # records buffered per window before they are appended to its spill


class Spill:
    """Chunks of (host, device) records in a temporary file (deleted when closed or collected)."""

    def __init__(self) -> None:
        self.fh = tempfile.TemporaryFile(prefix="meshsim-trace-")  # noqa: SIM115 - closed by close()
        self.records = 0

    def write(self, host: Sequence[tuple], device: Sequence[tuple]) -> None:
        if host or device:
            data = marshal.dumps(([tuple(h) for h in host], [tuple(d) for d in device]))
            self.fh.write(len(data).to_bytes(8, "little"))
            self.fh.write(data)
            self.records += len(host) + len(device)

    def chunks(self) -> Iterator[tuple[list[tuple], list[tuple]]]:
        """The chunks as written, as plain tuples."""
        self.fh.flush()
        self.fh.seek(0)
        while len(head := self.fh.read(8)) == 8:
            yield marshal.loads(self.fh.read(int.from_bytes(head, "little")))
        self.fh.seek(0, 2)

    def records_back(self) -> tuple[list[HostOp], list[DeviceEvent]]:
        """Every record, as the typed records again."""
        host: list[HostOp] = []
        device: list[DeviceEvent] = []
        for h, d in self.chunks():
            host += typed(HostOp, h)
            device += typed(DeviceEvent, d)
        return host, device

    def close(self) -> None:
        self.fh.close()


class _Index:
    """Which windows hold a time: the windows sorted by start, with the running maximum of their ends, so
    the search stops at the first window (going left) before which none reaches the time."""

    def __init__(self, windows: Sequence[Window]) -> None:
        self.order = sorted(range(len(windows)), key=lambda i: windows[i][0])
        self.starts = [windows[i][0] for i in self.order]
        self.ends = [windows[i][1] for i in self.order]
        self.reach = list(accumulate(self.ends, max))

    def holding(self, ts: float) -> Iterator[int]:
        i = bisect_right(self.starts, ts) - 1
        while i >= 0 and self.reach[i] >= ts:
            if self.ends[i] >= ts:
                yield self.order[i]
            i -= 1


def route(records: list[tuple], side: int, starts: list[float], ends: list[float], reach: list[float],
          order: list[int], bufs: list[tuple[list, list]]) -> None:
    """Append each record to side `side` of the buffer of every window holding its start (_Index.holding,
    inlined: one bisect and a step or two left per record). The reference of _collect.route."""
    for rec in records:
        ts = rec[0]
        i = bisect_right(starts, ts) - 1
        while i >= 0 and reach[i] >= ts:
            if ends[i] >= ts:
                bufs[order[i]][side].append(rec)
            i -= 1


ROUTE = route if _collect is None else _collect.route  # compiled when the extension is built (tests compare)


def split(spill: Spill, windows: Sequence[Window]) -> list[Spill]:
    """One spill per window with the records that start in it (module docstring; `route`)."""
    index = _Index(windows)
    starts, ends, reach, order = index.starts, index.ends, index.reach, index.order
    out = [Spill() for _ in windows]
    bufs: list[tuple[list, list]] = [([], []) for _ in windows]
    for host, device in spill.chunks():
        for side, records in ((0, host), (1, device)):
            ROUTE(records, side, starts, ends, reach, order, bufs)
        for i, buf in enumerate(bufs):
            if len(buf[0]) + len(buf[1]) >= FLUSH_RECORDS:
                out[i].write(*buf)
                bufs[i] = ([], [])
    for i, buf in enumerate(bufs):
        out[i].write(*buf)
    return out
