"""trace.json straight from an event log's arrays: the compiled core's EventRows, written by the compiled
slice writer (sim/outputs/_trace.pyx), no Event built.

What each slice needs besides its row and its op is computed with numpy over the columns: whether the op
is on the critical path (`critical`, one int64 key per (rank, op id): sim/outputs/row_fields.py), and the
index of its collective args (`infos`: the args of each distinct (collective row, rank) encoded once, as
trace.py's _Context caches them). The document around the slices (metadata, steady-state slices,
critical-path arrows) is trace.py's own, encoded the same way; the arrows' hops are found on the columns
(`RowsContext.hops`: no Event built, equal to trace_slices.hops over every critical event, which
tests/test_output_shortcuts.py checks).

`write_rows_trace` returns False where it does not apply (no compiled writer, a log of Event tuples, a time
whose nanoseconds leave [0, 2**62) or are not finite, a rank or op id that does not pack, a pid offset that
is not a small int), and raises _trace.Fallback where a field has no exact compiled rule: the caller then
writes the Python way (trace.py). Either way the bytes are the Python writer's (tests/test_trace_rows.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii as _ascii
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.outputs.row_fields import (
    dense_unique,
    keys_fit,
    member,
    op_codes,
    pair_keys,
    path_keys,
    path_op_arrays,
    row_keys,
    rows_where,
)
from meshsim.sim.outputs.trace_slices import TID, collective_args, encode_json, js
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.results.step_result import StepResult

try:
    from meshsim.sim.outputs import _trace
except ImportError:  # not built (no C compiler at install): trace.py writes the Python way
    _trace = None


class _NotBuilt(Exception):
    """Fallback's stand-in without the compiled writer."""


AVAILABLE = _trace is not None
Fallback = _trace.Fallback if _trace is not None else _NotBuilt
NS_LIMIT = float(2**62)  # t * 1e9 + 0.5 below this: C's truncation to int64 is Python's int()


def _times_fit(c) -> bool:
    """Every time's nanoseconds (as ns() computes them) finite and inside [0, NS_LIMIT)."""
    wait = c.wait_s
    if not (np.isfinite(c.start_s).all() and np.isfinite(c.end_s).all() and np.isfinite(wait).all()):
        return False
    waited = wait > 0
    for t in (c.start_s, c.end_s, c.start_s[waited] + wait[waited]):
        x = t * 1e9 + 0.5
        if len(x) and not (x.min() >= 0 and x.max() < NS_LIMIT):
            return False
    return True


def applies(events: Sequence, pid_offset: Any) -> bool:
    """Whether write_rows_trace can write this log (module docstring)."""
    if _trace is None or not is_rows(events) or type(pid_offset) is not int or not abs(pid_offset) < 2**61:
        return False
    c = events.columns
    return keys_fit(c.rank, c.op_id) and _times_fit(c)


class Lane(NamedTuple):
    """What a critical-path arrow reads of an event (trace_slices.hops_json): its lane and its start."""

    rank: int
    stream: str
    start_s: float


class RowsContext:
    """trace.py's _Context over arrays: ranks and their streams, the critical mask, the collective args."""

    def __init__(self, events, critical_path: Sequence[Segment], result: StepResult | None) -> None:
        c = events.columns
        self.by_op: Mapping = result.op_collectives if result is not None else {}
        self.groups: Mapping = result.rank_groups if result is not None else {}
        self.config = result.config if result is not None else None
        self.per_node = (self.config.gpus_per_node or 0) if self.config is not None else 0
        self.keys = row_keys(c.rank, c.op_id)
        streams, names = op_codes(events, "stream")
        self.stream_codes, self.stream_names = streams, names
        pairs = dense_unique(c.rank.astype(np.int64) * len(names) + streams)[0] if len(names) else np.zeros(0, np.int64)
        self.streams: dict[int, set] = {}
        for rank, code in zip((pairs // max(len(names), 1)).tolist(), (pairs % max(len(names), 1)).tolist(),
                              strict=True):
            self.streams.setdefault(rank, set()).add(names[code])
        self.critical = np.isin(self.keys, path_keys(critical_path)).view(np.uint8) if len(self.keys) else \
            np.zeros(0, np.uint8)

    def infos(self, events) -> tuple[np.ndarray, list[bytes], list[bytes]]:
        """(per row: its entry, intc; entries' escaped name prefixes; entries' args members), the last
        entry an op without a collective row. Only the rows the writer reads an entry for are looked up:
        those whose category is not "compute" (a compute op's slice has no collective prefix nor args; a
        category equal to "compute" but not a str makes the writer fall back)."""
        keys, rows = self._collective_keys()
        order = None if len(keys) < 2 or bool((keys[1:] > keys[:-1]).all()) else np.argsort(keys, kind="stable")
        categories, values = op_codes(events, "category")
        compute = [k for k, v in enumerate(values) if v == "compute"]
        need = np.flatnonzero(categories != compute[0]) if compute else np.arange(len(self.keys))
        at = member(self.keys[need], keys if order is None else keys[order])
        found = np.flatnonzero(at >= 0)
        hit = need[found]
        which = at[found] if order is None else order[at[found]]  # index into ops / rows of each hit row
        # one entry per distinct (row object, rank) among the hits, as _Context.info caches them
        row_code = np.unique(np.fromiter(map(id, rows), np.uint64, len(rows)), return_inverse=True)[1].reshape(-1)
        ident = (row_code[which].astype(np.int64) << 31) | (self.keys[hit] >> 32)
        _, first, inverse = np.unique(ident, return_index=True, return_inverse=True)
        prefixes, members = [], []
        for k in first.tolist():
            row, rank = rows[which[k]], int(self.keys[hit[k]] >> 32)
            info = collective_args(row, self.groups.get((row.group, rank)))
            prefixes.append(self._prefix(info))
            members.append((("," + encode_json(info)[1:-1]) if info else "").encode("ascii"))
        prefixes.append(self._prefix(None))
        members.append(b"")
        entry = np.full(len(self.keys), len(prefixes) - 1, dtype=np.intc)
        entry[hit] = np.asarray(inverse).reshape(-1)
        return entry, prefixes, members

    def _collective_keys(self) -> tuple[np.ndarray, list]:
        """(pair_keys of by_op's keys, its rows), in its order: off a RankOpRows' key columns where they fit
        (row_keys of int pairs that fit is pair_keys of them), else key by key."""
        arrays = getattr(self.by_op, "key_arrays", None)
        arrays = arrays() if arrays is not None else None
        if arrays is not None and keys_fit(arrays[0], arrays[1]):
            return row_keys(arrays[0], arrays[1]), arrays[2]
        return pair_keys(list(self.by_op)), list(self.by_op.values())

    @staticmethod
    def _prefix(info: Mapping[str, Any] | None) -> bytes:
        return _ascii(f"nccl:{(info or {}).get('Collective name') or 'collective'} ")[1:-1].encode("ascii")

    def critical_events(self, events) -> dict[tuple[int, int], Any]:
        """(rank, op id) -> event of the critical path's ops (trace.py's _by_key), only those built."""
        return {(ev.rank, ev.op_id): ev for ev in rows_where(events, self.critical.view(bool))}

    def hops(self, events, path: Sequence[Segment]) -> list[tuple[Lane, Lane]]:
        """trace_slices.hops(path, self.critical_events(events)) as the (rank, stream, start_s) of each hop's
        two events (all trace_slices.hops_json reads), no Event built: the path's chain of critical rows
        ((rank, op id) -> its last critical row, as that dict keeps the last event), its lane changes read
        off the rank and stream-code columns (equal codes <=> equal streams)."""
        c = events.columns
        rows = np.flatnonzero(self.critical)
        chain = self._chain(rows, path) if path_op_arrays(path) is not None else None
        if chain is None:
            row_of = dict(zip(zip(c.rank[rows].tolist(), c.op_id[rows].tolist(), strict=True), rows.tolist(),
                              strict=True))
            chain = np.fromiter((row_of[key] for s in path if s.op_id is not None
                                 and (key := (s.rank, s.op_id)) in row_of), np.intp)
        if len(chain) < 2:
            return []
        rank, stream = c.rank[chain], self.stream_codes[chain]
        at = np.flatnonzero((rank[1:] != rank[:-1]) | (stream[1:] != stream[:-1]))
        ends = np.concatenate([chain[at], chain[at + 1]])
        lanes = list(map(Lane, c.rank[ends].tolist(), map(self.stream_names.__getitem__, self.stream_codes[ends].tolist()),
                         c.start_s[ends].tolist()))
        return list(zip(lanes[:len(at)], lanes[len(at):], strict=True))

    def _chain(self, rows: np.ndarray, path: Sequence[Segment]) -> np.ndarray | None:
        """hops' chain from the path's columns (row_fields.path_op_arrays): per op segment in path order,
        the last critical row of its (rank, op id) key, the segments with none dropped. Keys are sorted
        stably, so among a key's rows the last in sorted order is its last row, as the dict keeps; None
        where the pairs do not pack into keys."""
        arrays = path_op_arrays(path)
        if not keys_fit(*arrays):
            return None
        want, have = row_keys(*arrays), self.keys[rows]
        order = np.argsort(have, kind="stable")
        have = have[order]
        at = np.searchsorted(have, want, side="right") - 1
        found = at >= 0
        found[found] = have[at[found]] == want[found]
        return rows[order[at[found]]].astype(np.intp)


def write_slices(fh: BinaryIO, events, ctx: RowsContext, pid_offset: int, lead: bool) -> int:
    """The op slices of every row into fh, each after a "," (not the first unless `lead`); their count."""
    entry, prefixes, members = ctx.infos(events)
    return _trace.write_slices(fh.write, events, ctx.critical, entry, prefixes, members, TID, pid_offset,
                               ctx.per_node, lead, js, _ascii)
