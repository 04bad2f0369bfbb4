"""rows_by_event's long way, for the RankOpRows tests (tests/test_asm_rank_rows.py, tests/test_rank_rows_arrays.py):
one dict keyed by (rank, op id), filled rank by rank from each rank's stage map; and the rows they draw from."""

from __future__ import annotations

from itertools import repeat

from meshsim.sim.results import step_result as sr
from meshsim.sim.results.records import CollectiveRow

ROWS = [CollectiveRow("all_gather", "dp", 8, 4096), CollectiveRow("all_reduce", "tp", 4, 1 << 20)]


def rows_by_event_dict(per_stage, ranks, stage_size) -> dict:
    """rows_by_event_dict's loop over given per-stage maps."""
    out = {}
    for rank in ranks:
        rows = per_stage[sr._stage_of(rank, stage_size, len(per_stage))]
        out.update(zip(zip(repeat(rank), rows), rows.values(), strict=True))
    return out
