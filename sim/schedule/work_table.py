"""A schedule's distinct work objects and each op's index among them (Schedule.work_table).

Ops stamped from one template share their work object (sim/schedule/stamping.py), so a schedule of 10^5
ops has ~10^3 works: a question that depends only on the work (its collective group, its bytes and flops,
its compute time, its report row) is asked once per work and spread over the ops by numpy indexing.
tests/test_tiled_shortcuts.py checks the table against the ops and each per-work pass against its per-op one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np


@dataclass(frozen=True, eq=False)
class WorkTable:
    """A schedule's distinct work objects, by identity, in the order of their first op (ops stamped from
    one template share their work, so there are few), and each op's index among them: a per-work question
    is asked once per work and spread over the ops by numpy (`works[index[i]] is ops[i].work`)."""

    works: tuple
    index: np.ndarray  # per op position: its work's index in `works` (np.intp)
    first: np.ndarray  # per work: the position of its first op

    @classmethod
    def of(cls, ops: Sequence) -> WorkTable:
        works = list(map(_WORK, ops))
        ids = list(map(id, works))
        distinct = dict(zip(ids, works, strict=True))  # id -> the work, in first-use order
        number = dict(zip(distinct, range(len(distinct)), strict=False))
        index = np.fromiter(map(number.__getitem__, ids), np.intp, len(ids))
        first = np.unique(index, return_index=True)[1]  # every index 0..k-1 occurs: aligned with the works
        return cls(tuple(distinct.values()), index, first)


_WORK = attrgetter("work")
