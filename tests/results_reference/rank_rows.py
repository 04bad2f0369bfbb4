"""rows_by_event's long way, for the RankOpRows tests (tests/test_asm_rank_rows.py, tests/test_rank_rows_arrays.py):
one dict keyed by (rank, op id), filled rank by rank from each rank's stage map; and the rows they draw from."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from meshsim.sim.results import step_result as sr
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.schedule.ops import Schedule

ROWS = [CollectiveRow("all_gather", "dp", 8, 4096), CollectiveRow("all_reduce", "tp", 4, 1 << 20)]


def rows_from_stage_maps(per_stage, ranks, stage_size) -> dict:
    """rows_by_event_dict's loop over given per-stage maps."""
    out = {}
    for rank in ranks:
        rows = per_stage[sr._stage_of(rank, stage_size, len(per_stage))]
        out.update(zip(zip(repeat(rank), rows), rows.values(), strict=True))
    return out


def rows_by_event_dict(schedules: Sequence[Schedule], collectives: Sequence[CollectiveRow], ranks: Sequence[int],
                       stage_size: int) -> dict[tuple[int, int], CollectiveRow]:
    """rows_by_event as a dict, rank by rank."""
    return rows_from_stage_maps([sr.op_collectives(s, collectives) for s in schedules], ranks, stage_size)
