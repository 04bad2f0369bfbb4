"""A built schedule's ops held as its stamps, each Op record built again when it is read (Schedule.ops).

A builder stamps templates into a StageOps (sim/schedule/stage_ops.py; the reference, tiling.OpList, builds
the records as it stamps), which records each stamp: its base, Stencil, external inputs, layer, micro-batch
and name prefix (sim/schedule/tiling.py). Those determine every stamped record (stamping.stamp_records), so
the records need not be kept, nor (StageOps) ever made by the builder: `StampedOps` keeps the stamps and
the loose ops (appended by the builder itself, replaced after stamping, or the entry ops of a gated stamp)
and builds a record when it is read, a whole stamp's at a time when iterated (the same C-level passes that
stamped them). A 405B step's short run holds 856k ops: ~250 MB of records a schedule never holds; what
reads every op reads the schedule's columns instead (tiled arrays, OpFields, WorkTable, `column`,
`name_parts`, and `codes`, a field's value codes tiled per stencil for the trace and timeline writers).

A record read twice is built twice: equal field for field (ints and strs by value), not the same object.
The sequence compares equal to any sequence of equal ops (a tuple of the records too), hashes as that
tuple, and pickles as that tuple. tests/test_stamped_ops.py checks it against the records the builder made;
tests/test_output_shortcuts.py checks `codes` and `name_parts` against the columns they shortcut.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import chain, islice, repeat
from operator import attrgetter, eq

import numpy as np

from meshsim.sim.schedule.ops import Op
from meshsim.sim.schedule.stamping import stamp_records

CACHED_BLOCKS = 256  # stamps whose records StampedOps keeps after a read (~100 ops each), oldest dropped first
_STENCIL_COLUMNS = {"stream": "streams", "category": "categories", "phase": "phases", "work": "works",
                    "host_calls": "host_calls"}  # Op fields a stencil holds per op, as tuples
CODED_FIELDS = (*_STENCIL_COLUMNS, "layer", "micro_batch")  # the fields StampedOps.codes codes per stamp


class StampedOps(Sequence):
    """Ops 0..n-1: those of the stamps `order` ((base, stencil, ext inputs, layer, micro-batch, prefix), in
    base order) built on demand, but for `loose` (position -> its record), which are kept. A read builds
    the whole stamp's records and keeps the last CACHED_BLOCKS stamps' (walks read neighbouring ops)."""

    __slots__ = ("_order", "_n", "_loose", "_bases", "_inside", "_cache", "_grouped")

    def __init__(self, order: list[tuple], n: int, loose: dict[int, Op]) -> None:
        self._order, self._n, self._loose = order, n, loose
        self._bases = [stamp[0] for stamp in order]
        inside: dict[int, list[int]] = {}  # stamp index -> the loose positions inside it
        for p in loose:
            j = bisect_right(self._bases, p) - 1
            if j >= 0 and p < order[j][0] + order[j][1].n:
                inside.setdefault(j, []).append(p)
        self._inside = inside
        self._cache: dict[int, list[Op]] = {}
        self._grouped: tuple | None = None  # _groups, once read

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if type(index) is int and 0 <= index < self._n:  # the common read, inline: a kept or cached record
            hit = self._loose.get(index)
            if hit is not None:
                return hit
            j = bisect_right(self._bases, index) - 1
            block = self._cache.get(j)
            if block is not None:
                return block[index - self._bases[j]]
            return self._one(index)
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if step == 1:
                return tuple(islice(chain.from_iterable(self._blocks(start)), start - self._start_of(start),
                                    start - self._start_of(start) + max(0, stop - start)))
            return tuple(map(self._one, range(start, stop, step)))
        i = index.__index__()
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("op index out of range")
        return self._one(i)

    def _one(self, i: int) -> Op:
        hit = self._loose.get(i)
        if hit is not None:
            return hit
        j = bisect_right(self._bases, i) - 1
        block = self._cache.get(j)
        if block is None:
            if len(self._cache) >= CACHED_BLOCKS:
                del self._cache[next(iter(self._cache))]
            block = self._cache[j] = self._block(j)
        return block[i - self._bases[j]]

    def _block(self, j: int) -> list[Op]:
        """Stamp j's records, its loose ones put back."""
        base, s, ext, layer, mb, prefix = self._order[j]
        records = list(stamp_records(s, base, prefix, ext, layer, mb))
        for p in self._inside.get(j, ()):
            records[p - base] = self._loose[p]
        return records

    def _start_of(self, i: int) -> int:
        """Where the block holding position i starts (_blocks(i)'s first position)."""
        j = bisect_right(self._bases, i) - 1
        if j >= 0 and i < self._bases[j] + self._order[j][1].n:
            return self._bases[j]
        return i

    def __iter__(self) -> Iterator[Op]:
        return chain.from_iterable(self._blocks(0))

    def _blocks(self, start: int) -> Iterator[Sequence[Op]]:
        """The ops from _start_of(start) on, in position order: a block per stamp and per run of loose ops
        between stamps."""
        loose, at = self._loose, self._start_of(start)
        for j in range(max(0, bisect_right(self._bases, at) - 1), len(self._order)):
            base, s = self._order[j][:2]
            if base + s.n <= at:
                continue
            if at < base:
                yield list(map(loose.__getitem__, range(at, base)))
            yield self._block(j)
            at = base + s.n
        if at < self._n:
            yield list(map(loose.__getitem__, range(at, self._n)))

    def column(self, field: str) -> list:
        """[op.<field> for op in self], the values the records carry, built per stamp (a stencil's tuple, the
        stamp's layer or micro-batch, prefix + suffix names) without building the records."""
        out: list = []
        loose, at = self._loose, 0
        get = attrgetter(field)
        for base, s, ext, layer, mb, prefix in self._order:
            if at < base:
                out += map(get, map(loose.__getitem__, range(at, base)))
            if field in _STENCIL_COLUMNS:
                out += getattr(s, _STENCIL_COLUMNS[field])
            elif field == "layer":
                out += repeat(layer, s.n)
            elif field == "micro_batch":
                out += repeat(mb, s.n)
            elif field == "name":
                out += map(prefix.__add__, s.suffixes)
            elif field == "id":
                out += range(base, base + s.n)
            elif field == "host_wait":
                waits = [None] * s.n
                for i, w in s.waits:
                    waits[i] = base + w
                out += waits
            else:
                out += map(get, stamp_records(s, base, prefix, ext, layer, mb))
            at = base + s.n
        if at < self._n:
            out += map(get, map(loose.__getitem__, range(at, self._n)))
        for p, op in loose.items():  # the loose ops inside stamps (and, harmlessly, the others) as they are
            out[p] = get(op)
        return out

    def name_parts(self) -> tuple[list[str], list[str]]:
        """(prefixes, suffixes): per op, two strs whose concatenation is its name (column("name")), without
        building the names: a stamped op's stamp prefix and stencil suffix, a loose op's "" and its name."""
        prefixes: list = []
        suffixes: list = []
        loose, at = self._loose, 0
        for base, s, *_, prefix in self._order:
            if at < base:
                prefixes += repeat("", base - at)
                suffixes += (loose[p].name for p in range(at, base))
            prefixes += repeat(prefix, s.n)
            suffixes += s.suffixes
            at = base + s.n
        if at < self._n:
            prefixes += repeat("", self._n - at)
            suffixes += (loose[p].name for p in range(at, self._n))
        for p, op in loose.items():
            prefixes[p], suffixes[p] = "", op.name
        return prefixes, suffixes

    def codes(self, field: str, index: dict) -> np.ndarray:
        """Per op: the code of its `field` in `index` (value -> code), which is extended with len(index) as each
        new value's code in the order the values first occur (intc): what coding column(field) value by value
        gives, for a field a stamp holds per stencil or per stamp (CODED_FIELDS), without the column. The
        stamps' values are numbered per stencil and tiled by numpy; the loose ops read one by one; a value's
        code goes to the value its first op holds (equal values share one code, as dict keys)."""
        first_code: dict = {}  # value -> provisional number

        def numbers(values: list) -> np.ndarray:
            for value in dict.fromkeys(values):
                first_code.setdefault(value, len(first_code))
            return np.fromiter(map(first_code.__getitem__, values), np.intp, len(values))

        groups, loose_at = self._groups()
        prov = np.empty(self._n, dtype=np.intp)
        for s, (pos, places) in groups.items():
            if field in _STENCIL_COLUMNS:
                prov[pos] = numbers(list(getattr(s, _STENCIL_COLUMNS[field])))
            else:  # layer, micro_batch: one value per stamp
                prov[pos] = numbers(places[CODED_FIELDS.index(field) - len(_STENCIL_COLUMNS)])[:, None]
        prov[loose_at] = numbers(list(map(attrgetter(field), map(self._loose.__getitem__, loose_at))))
        first = np.full(len(first_code), self._n, dtype=np.intp)  # each number's first position (n: none)
        np.minimum.at(first, prov, np.arange(self._n, dtype=np.intp))
        table = np.empty(len(first_code), dtype=np.intc)
        present = np.flatnonzero(first < self._n)
        for k in present[np.argsort(first[present], kind="stable")].tolist():
            value = getattr(self[int(first[k])], field)
            table[k] = index.setdefault(value, len(index))
        return table[prov]

    def _groups(self) -> tuple[dict, list[int]]:
        """(stencil -> (its stamps' op positions, one row per stamp, and ([their layers], [their
        micro-batches])), the loose positions), built once."""
        if self._grouped is not None:
            return self._grouped
        out: dict = {}
        for base, s, _, layer, mb, _ in self._order:
            entry = out.get(s)
            if entry is None:
                entry = out[s] = ([], ([], []))
            entry[0].append(base)
            entry[1][0].append(layer)
            entry[1][1].append(mb)
        loose = np.ones(self._n, dtype=bool)
        for s, (bases, places) in out.items():
            pos = np.array(bases, dtype=np.intp)[:, None] + np.arange(s.n)
            loose[pos] = False
            out[s] = (pos, places)
        loose[list(self._loose)] = True
        self._grouped = (out, np.flatnonzero(loose).tolist())
        return self._grouped

    def __reversed__(self) -> Iterator[Op]:
        return reversed(tuple(self))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == self._n and all(map(eq, self, other))

    def __ne__(self, other: object) -> bool:
        same = self.__eq__(other)
        return same if same is NotImplemented else not same

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __reduce__(self):
        return tuple, (tuple(self),)

    def __repr__(self) -> str:
        return f"StampedOps({self._n} ops, {len(self._order)} stamps, {len(self._loose)} loose)"


def op_column(ops: Sequence[Op], field: str) -> list:
    """[op.<field> for op in ops]: a StampedOps' column (no record built), else read off the records."""
    if isinstance(ops, StampedOps):
        return ops.column(field)
    return list(map(attrgetter(field), ops))
