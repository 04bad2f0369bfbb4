"""EventLog.columns(): row i of the arrays is events[i], None fields as -1 (sim/engine/event_columns.py)."""

import numpy as np

from meshsim.sim.engine.event_columns import NONE, columns_of
from meshsim.sim.engine.events import Event, EventLog


def _event(rank, op_id, start, end, wait=0.0, peer=None, peer_op=None):
    return Event(rank, op_id, f"op{op_id}", "compute", "compute", "fwd", None, None, start, end, wait, 0, 0.0,
                 peer, peer_op)


def test_columns_match_events_row_for_row():
    events = (_event(0, 3, 0.0, 1.5), _event(1, 7, 0.25, 2.0, 0.125, peer=0, peer_op=9))
    cols = EventLog(events, (0, 1), 2.0).columns()
    assert len(cols) == 2
    assert cols.rank.tolist() == [0, 1] and cols.op_id.tolist() == [3, 7]
    assert cols.start_s.tolist() == [0.0, 0.25] and cols.end_s.tolist() == [1.5, 2.0]
    assert cols.wait_s.tolist() == [0.0, 0.125]
    assert cols.peer.tolist() == [NONE, 0] and cols.peer_op.tolist() == [NONE, 9]
    assert cols.rank.dtype == np.int64 and cols.end_s.dtype == np.float64


def test_columns_built_once_and_empty_log():
    log = EventLog((_event(0, 0, 0.0, 1.0),), (0,), 1.0)
    assert log.columns() is log.columns()
    assert len(columns_of(())) == 0
