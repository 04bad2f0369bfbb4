"""An event log as arrays, its Event tuples built only when read.

A step at today's scale runs ~10^6 (rank, op) pairs; one Event tuple with its float objects is ~400 B, the
same event as a row of arrays 64 B (the EventColumns of sim/engine/event_columns.py, 56 B, plus the row's
stage and the op's index in that stage's schedule, 4 B each). The compiled core records rows
(sim/engine/_core.pyx) and hands the log over as an `EventRows` (sim/engine/_rows.pyx): a read-only
sequence whose item i is built from row i and the row's op when read (the op's id, name, stream,
category, phase, layer, micro-batch; its work's bytes and flops), field for field the Event the Python
engine builds for that op. Nothing is cached, so a consumer that streams the log holds one chunk of events
at a time; one that keeps them all (a list, a dict of them) pays what the tuples cost.

Helpers that work on either form of a log's events (a tuple of Event from the Python and simpy engines, or
an EventRows): `rank_rows` (per rank: its rows in completion order and the row of each op id),
`rank_events` (one rank as a mapping op id -> Event), `retimed` (chosen rows with new start / end times:
the steady-state extrapolation's shifted events).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from meshsim.sim.engine.event_columns import EventColumns

try:
    from meshsim.sim.engine._rows import EventRows, RankEvents
except ImportError:  # no compiled core: every log is a tuple of events
    EventRows = RankEvents = None
else:  # isinstance(rows, Sequence) holds, as it does for the tuples they stand for
    Sequence.register(EventRows)
    Mapping.register(RankEvents)

__all__ = ["EventRows", "RankRows", "events_of_rank", "is_rows", "rank_events", "rank_rows", "retimed"]


class RankRows(NamedTuple):
    """One rank's rows: `order` its rows in completion order (int64), `row_of` op id -> its row (-1: none)."""

    order: np.ndarray
    row_of: np.ndarray


def is_rows(events: Sequence) -> bool:
    """Whether `events` is an EventRows (the compiled core's arrays) rather than a sequence of tuples."""
    return EventRows is not None and isinstance(events, EventRows)


def rank_rows(columns: EventColumns, ranks: Sequence[int]) -> dict[int, RankRows]:
    """rank -> RankRows, for every rank in `ranks` (one with no events: empty arrays); one stable sort."""
    order_all = np.argsort(columns.rank, kind="stable")
    sorted_ranks = columns.rank[order_all]
    out = {}
    for rank in ranks:
        lo, hi = np.searchsorted(sorted_ranks, [rank, rank + 1])
        order = np.ascontiguousarray(order_all[lo:hi], dtype=np.int64)
        ids = columns.op_id[order]
        row_of = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, dtype=np.int64)
        row_of[ids] = order
        out[rank] = RankRows(order, row_of)
    return out


def events_of_rank(events: Sequence, rank: int) -> Sequence:
    """The events of `rank` among `events`, in their order: an EventRows over an EventRows (no event built),
    else a list."""
    if is_rows(events):
        return events.take(np.flatnonzero(events.columns.rank == rank))
    return [e for e in events if e.rank == rank]


def rank_events(events: EventRows, rows: RankRows) -> Mapping:
    """One rank of an EventRows as a read-only mapping op id -> Event, in completion order."""
    return RankEvents(events, rows.order, rows.row_of)


def retimed(events: Sequence, rows: np.ndarray, start_s: np.ndarray, end_s: np.ndarray) -> Sequence:
    """events[rows[k]] with start_s[k] and end_s[k] for each k, in that order: an EventRows over an
    EventRows, a tuple of Event over a tuple (each the same event type, the other 13 fields unchanged)."""
    if is_rows(events):
        if _every_row(rows, len(events)):  # the log itself retimed: its other columns shared, not copied
            c = events.columns
            cols = EventColumns(c.rank, c.op_id, np.ascontiguousarray(start_s, dtype=np.float64),
                                np.ascontiguousarray(end_s, dtype=np.float64), c.wait_s, c.peer, c.peer_op)
            return EventRows(cols, events.stage_arr, events.op_index_arr, events.ops, events.sizes,
                             events.event_type)
        return events.retimed(rows, start_s, end_s)
    new = tuple.__new__
    return tuple(new(type(e), (*e[:8], s, t, *e[10:]))
                 for e, s, t in zip(map(events.__getitem__, rows.tolist()), start_s.tolist(), end_s.tolist(),
                                    strict=True))


def _every_row(rows: np.ndarray, n: int) -> bool:
    """Whether `rows` is 0, 1, ..., n - 1: every row of an n-row log, in order (take(rows) equals the log)."""
    return len(rows) == n and (n == 0 or (rows[0] == 0 and bool(np.all(np.diff(rows) == 1))))
