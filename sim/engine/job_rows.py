"""The compiled core's arbiter jobs kept as columns, each arbiter.Job record built when it is read.

A 405B step's short run finishes ~320k arbiter jobs; as Job records (a tuple, its tag and key tuples, two
floats) they held ~95 MB. The core (sim/engine/_core.pyx) writes each finished job as a row instead: its
tag and key as four int64 columns when both are pairs of ints ((rank, op id) and (stage, op id): all but
the P2P transfers' and the compute resource's), else kept as objects in `odd`; start and end as float64;
its loads by reference. `JobRows` reads as the tuple of Job records the Python core keeps (EventLog.jobs):
row i is Job(tag, key, start_s, end_s, load, own) with the same values (ints and floats read back from
int64 / float64 columns are the values written), built anew each time it is read. tests/test_job_rows.py
compares it with the Python core's records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from itertools import chain
from operator import eq

import numpy as np

from meshsim.sim.engine.arbiter import Job

CHUNK = 4096  # records built per step of an iteration
_new_job = partial(tuple.__new__, Job)


class JobRows(Sequence):
    """Finished arbiter jobs in finishing order (module docstring); `start_s`, `end_s` are their columns."""

    __slots__ = ("tag0", "tag1", "key0", "key1", "start_s", "end_s", "loads", "owns", "odd")

    def __init__(self, tag0: np.ndarray, tag1: np.ndarray, key0: np.ndarray, key1: np.ndarray, start_s: np.ndarray,
                 end_s: np.ndarray, loads: list, owns: list, odd: dict[int, tuple]) -> None:
        self.tag0, self.tag1, self.key0, self.key1 = tag0, tag1, key0, key1
        self.start_s, self.end_s, self.loads, self.owns, self.odd = start_s, end_s, loads, owns, odd
        if not all(len(c) == len(start_s) for c in (tag0, tag1, key0, key1, end_s, loads, owns)):
            raise ValueError("job columns of different lengths")

    def __len__(self) -> int:
        return len(self.start_s)

    def build(self, lo: int, hi: int) -> list[Job]:
        """Jobs lo .. hi - 1 (clipped to the rows) as a list of records."""
        lo, hi = max(0, lo), min(hi, len(self))
        if lo >= hi:
            return []
        cut = slice(lo, hi)
        tags = list(zip(self.tag0[cut].tolist(), self.tag1[cut].tolist(), strict=True))
        keys = list(zip(self.key0[cut].tolist(), self.key1[cut].tolist(), strict=True))
        for k, (tag, key) in self.odd.items():
            if lo <= k < hi:
                tags[k - lo], keys[k - lo] = tag, key
        return list(map(_new_job, zip(tags, keys, self.start_s[cut].tolist(), self.end_s[cut].tolist(),
                                      self.loads[cut], self.owns[cut], strict=True)))

    def __getitem__(self, index):
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return tuple(self.build(start, stop))
            return tuple(self.build(0, n)[index])
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("job index out of range")
        return self.build(i, i + 1)[0]

    def __iter__(self) -> Iterator[Job]:
        return chain.from_iterable(self.build(lo, lo + CHUNK) for lo in range(0, len(self), CHUNK))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self) and all(map(eq, self, other))

    def __ne__(self, other: object) -> bool:
        same = self.__eq__(other)
        return same if same is NotImplemented else not same

    __hash__ = None

    def __repr__(self) -> str:
        """The repr of the tuple of its records (what the Python core's log shows)."""
        return repr(tuple(self))
