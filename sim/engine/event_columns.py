"""An event log as arrays: one row per event, in the log's completion order (row i is `events[i]`).

What array consumers (the steady-state proof, the critical path, the breakdown, the writers) read instead
of the per-event tuples: `rank`, `op_id`, `peer`, `peer_op` as int64 (-1 where the event's field is None),
`start_s`, `end_s`, `wait_s` as float64. The op's static fields (name, stream, category, phase, layer,
micro-batch, bytes, flops) are the schedule's, looked up by (stage of rank, op id).

`columns_of(events)` builds them from Event tuples; an engine that records into arrays may hand them over
directly (EventLog.columns), and the two must agree row for row (tests/test_event_columns.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

NONE = -1  # rank / op id columns: the event's field is None


@dataclass(frozen=True, eq=False)
class EventColumns:
    rank: np.ndarray  # int64
    op_id: np.ndarray  # int64
    start_s: np.ndarray  # float64
    end_s: np.ndarray  # float64
    wait_s: np.ndarray  # float64
    peer: np.ndarray  # int64, NONE where no peer
    peer_op: np.ndarray  # int64, NONE where no peer op

    def __len__(self) -> int:
        return len(self.rank)


def _ints(values, count: int) -> np.ndarray:
    return np.fromiter((NONE if v is None else v for v in values), dtype=np.int64, count=count)


def columns_of(events: Sequence) -> EventColumns:
    """The arrays of Event tuples (sim/engine/events.Event's field order), row i = events[i]."""
    n = len(events)
    fields = (0, 1, 8, 9, 10, 13, 14)  # rank, op_id, start_s, end_s, wait_s, peer, peer_op
    if n == 0:
        empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0, np.float64)
        return EventColumns(empty_i, empty_i, empty_f, empty_f, empty_f, empty_i, empty_i)
    rank, op_id, start, end, wait, peer, peer_op = (list(map(itemgetter(i), events)) for i in fields)
    return EventColumns(np.fromiter(rank, np.int64, n), np.fromiter(op_id, np.int64, n),
                        np.fromiter(start, np.float64, n), np.fromiter(end, np.float64, n),
                        np.fromiter(wait, np.float64, n), _ints(peer, n), _ints(peer_op, n))
