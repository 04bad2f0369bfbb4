"""Which walk steps period_path.decisions_repeat may pass unread: those its loop would pass with nothing
checked (settled_steps), decided for all steps at once from the log's columns, the schedules' tiled deps
and the stage maps' arrays (tests/test_period_path_settled.py, tests/test_path_columns.py compare them
with the loop's own tests)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshsim.sim.engine.events import EventLog
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.results.path_columns import PathColumns
from meshsim.sim.results.period_proof import Proof
from meshsim.sim.results.period_state import StageMap
from meshsim.sim.results.run_arrays import distinct_ints
from meshsim.sim.schedule.ops import Schedule


def settled_steps(path: Sequence[Segment] | PathColumns, spans: Sequence[tuple[int, int]],
                  schedules: Sequence[Schedule], log: EventLog, proof: Proof, images: bool = False
                  ) -> np.ndarray | None:
    """Per step of `spans`, whether decisions_repeat's loop passes it with nothing checked: its op is no P2P
    batch, its event starts at or after c2 (no image check) and every candidate (each dep, the stream
    predecessor) ends at or after c1 (all periodic). Read off the log's columns and the schedules' tiled
    deps, no event built; a step whose op or a candidate has no event is not settled (the loop raises there
    as before). None when a schedule has no tiled arrays.

    `images`: a step starting before c2 is settled too when the loop's image check passes for it (images_hold:
    the op's image is regular and has the image of the op's stream predecessor as its own), which the loop
    does before the candidates' test and returns on when it fails; for the proof's own StageMaps only (a
    map of another kind: the loop looks at those steps)."""
    tiled = [s.tiled_arrays for s in schedules]
    if not spans or any(t is None for t in tiled):
        return None
    c1, c2 = proof.cut.c1, proof.cut.c2
    cols, rows_of = log.columns(), log.rows_of()
    if isinstance(path, PathColumns):
        lasts = [last for _, last in spans]
        rank, op_id = path.rank[lasts], path.op_id[lasts]
    else:
        segs = [path[last] for _, last in spans]
        rank = np.fromiter((seg.rank for seg in segs), np.int64, len(segs))
        op_id = np.fromiter((seg.op_id for seg in segs), np.int64, len(segs))
    settled = np.zeros(len(rank), bool)
    for r in distinct_ints(rank):
        at = np.flatnonzero(rank == r)
        stage = proof.stage_of(r)
        t, row_of = tiled[stage], rows_of[r].row_of
        ids = op_id[at]

        def end_s(op_ids: np.ndarray, row_of: np.ndarray = row_of) -> np.ndarray:
            """The ops' ends (-inf where an op has no event: never settled)."""
            known = (op_ids >= 0) & (op_ids < len(row_of))
            rows = np.where(known, row_of[np.where(known, op_ids, 0)], -1)
            return np.where(rows >= 0, cols.end_s[np.maximum(rows, 0)], -np.inf)

        known = (ids >= 0) & (ids < len(row_of))
        rows = np.where(known, row_of[np.where(known, ids, 0)], -1)
        prev_ids = stream_prev_ids(proof, stage)
        late = cols.start_s[np.maximum(rows, 0)] >= c2
        if images and isinstance(proof.maps[stage], StageMap):
            late |= images_hold(proof.maps[stage], prev_ids, np.where(known, ids, 0))
        ok = (rows >= 0) & late
        ok &= np.asarray(t.kind, np.int64)[np.where(known, ids, 0)] != 2
        ptr, idx = np.asarray(t.dep_ptr, np.int64), np.asarray(t.dep_idx, np.int64)
        safe = np.where(ok, ids, 0)
        count = ptr[safe + 1] - ptr[safe]
        step = np.repeat(np.arange(len(ids)), count)
        deps = idx[np.repeat(ptr[safe], count) + np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)]
        ok[step[~(end_s(deps) >= c1)]] = False  # as all(end >= c1): a NaN end is not settled
        before = prev_ids[safe]
        ok &= (before < 0) | (end_s(before) >= c1)
        settled[at] = ok
    return settled


def stream_prev_ids(proof: Proof, stage: int) -> np.ndarray:
    """The stage's stream predecessors as int64 (-1: None): the proof's arrays, else its lists converted."""
    prev_ids = getattr(proof, "prev_ids", None)  # (a Proof of tests/results_reference has only the lists)
    if prev_ids is not None:
        return prev_ids[stage]
    return np.array([-1 if p is None else p for p in proof.prevs[stage]], np.int64)


def images_hold(m: StageMap, prev_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per op of `ids`, decisions_repeat's image check passes: later = mu(op) is not None, first_regular <=
    later < end_regular, and mu(prev[op]) == prev[later] (None == None; mu of None is None). mu over the
    stage map's arrays: op i itself when it has no micro-batch, else its later key's id (-1: None)."""
    n = len(m.index.none)
    mu = np.where(m.index.none, np.arange(n), np.asarray(m.mu_ids, np.int64))
    later = mu[ids]
    ok = (later >= 0) & (later >= m.first_regular) & (later < m.end_regular)
    before = prev_ids[ids]
    mu_before = np.where(before >= 0, mu[np.maximum(before, 0)], -1)
    return ok & (mu_before == prev_ids[np.maximum(later, 0)])
