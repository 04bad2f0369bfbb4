"""A stage's ops while its builder stamps them: held as stamps from the first stamp on, no record per stamped op.

A builder (sim/schedule/builder.py, pipeline_builder.py) appends ops of its own (P2P batches, step end, FSDP
gathers, the combined EP-overlap plans' ops), stamps templates (stamping.stamp) and replaces a few ops
afterwards (a gate added to a block's first op, the parameter gathers' consumers). `StageOps` takes all three
without making an Op record per stamped op: a stamp is one entry (base, stencil, ext inputs, layer,
micro-batch, prefix), appended and replaced ops are kept as records ("loose", as StampedOps keeps them), and
the entry ops of a gated stamp are kept as their records (deps + gate, as stamping.stamp_records builds them).
A chunk's blocks are stamped as one chain (`add_chain`, stamping.stamp_chain: each block fed by the output of
the one before it), one call per (micro-batch, chunk) instead of one per block. What the builder reads of its
own ops it reads without the records: `deps_of` (a gate), `where` (the parameter gathers' first forward
users, sim/schedule/param_gather.py), `layer_name` (the owner of a gradient producer), a single record built
on demand (`ops[i]`), iteration in either direction one stamp at a time.

`frozen` gives what the schedule holds: the same StampedOps (or, under tiling.STAMPED_MIN_OPS ops, the same
tuple of records) that tiling.OpList.frozen gives for the same builder calls, and `tiling` is the same
record (Tiling: stamps, gated stamps, replaced positions). tiling.OpList, which builds every record as it
stamps, stays the reference: `LAZY = False` makes the builders use it, and tests/test_stage_ops.py proves
the two builds equal (records, stamps, loose ops, arrays, work tables, fields) over generated scenarios.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence

from meshsim.sim.schedule import tiling
from meshsim.sim.schedule.ops import Op, new_op
from meshsim.sim.schedule.stamped_ops import StampedOps
from meshsim.sim.schedule.stamping import stamp_records
from meshsim.sim.schedule.stencil import Stencil, stencil_of
from meshsim.sim.schedule.tiling import OpList, Tiling

LAZY = True  # the builders' op list: StageOps; False: tiling.OpList, every record built as stamped (the reference)


def op_list(reserved: int = 0) -> StageOps | OpList:
    """A builder's empty op list with `reserved` leading slots (None) for the parameter all-gathers."""
    return StageOps(reserved) if LAZY else OpList([None] * reserved)


class StageOps(StampedOps):
    """Ops 0..n-1 being built: stamps, and loose records (appended, replaced, gated entries; None for a
    reserved slot not yet filled). Reads build records on demand; nothing is cached, so a replaced op reads
    as its replacement at once."""

    __slots__ = ("tiling",)

    def __init__(self, reserved: int = 0) -> None:
        super().__init__([], 0, {})
        self.tiling = Tiling()
        self.extend([None] * reserved)

    # building
    def add_stamp(self, s: Stencil, prefix: str, ext_vals: tuple, layer: int | None, mb: int | None,
                  gate: tuple[int, ...] = ()) -> int:
        """stamping.stamp's entry (the stamp recorded, no record built but the gated entry ops'); its base.
        The tiling record takes it as Tiling.add does (the same entry; none for an input never made)."""
        base = self._n
        entry = (base, s, ext_vals, layer, mb, prefix)
        self._order.append(entry)
        self._grouped = None
        self._bases.append(base)
        self._n = base + s.n
        t = self.tiling
        if None in ext_vals:
            t.broken = True
        else:
            t.order.append(entry)
            if gate:
                t.gated.append((base, s))
        if gate:
            j = len(self._order) - 1
            for i in s.entries:
                op = self._record(base + i)
                self._loose[base + i] = op._replace(deps=op.deps + gate)
                self._inside.setdefault(j, []).append(base + i)
        return base

    def add_chain(self, links: Sequence[tuple], mb: int, x: int | None) -> list[int]:
        """stamping.stamp_chain's entry: add_stamp per link (no gate) with its ext input, in one call (a
        link whose input key is not given raises stamp's KeyError, the links before it stamped)."""
        order, bases, t = self._order, self._bases, self.tiling
        mbs = f".mb{mb}."
        out = []
        self._grouped = None
        for tpl, block, layer, key in links:
            s = stencil_of(tpl)
            keys = s.ext_keys
            ext_vals = () if not keys else (x,) if keys == (key,) else tuple({key: x}[e] for e in keys)
            base = self._n
            entry = (base, s, ext_vals, layer, mb, block + mbs)
            order.append(entry)
            bases.append(base)
            if x is None and ext_vals:
                t.broken = True
            else:
                t.order.append(entry)
            out.append(base)
            self._n = base + s.n
            x = base + tpl.marks["out"]
        return out

    def append(self, op: Op | None) -> None:
        self._loose[self._n] = op
        self._n += 1
        self._grouped = None

    def extend(self, ops: Iterable[Op | None]) -> None:
        for op in ops:
            self.append(op)

    def __iadd__(self, ops: Iterable[Op | None]) -> StageOps:
        self.extend(ops)
        return self

    def __setitem__(self, index: int, op: Op) -> None:
        """Replace op `index` by the record `op` (tiling records the position as replaced, as OpList does)."""
        if type(index) is not int:
            raise TypeError("StageOps replaces one op at a time")
        i = index + self._n if index < 0 else index
        if not 0 <= i < self._n:
            raise IndexError("op index out of range")
        j = bisect_right(self._bases, i) - 1
        if i not in self._loose and j >= 0 and i < self._bases[j] + self._order[j][1].n:
            self._inside.setdefault(j, []).append(i)
        self._loose[i] = op
        self._grouped = None
        self.tiling.dirty.append(index % self._n)

    # reading
    def __getitem__(self, index):
        if type(index) is int:
            i = index + self._n if index < 0 else index
            if not 0 <= i < self._n:
                raise IndexError("op index out of range")
            return self._one(i)
        return super().__getitem__(index)

    def _one(self, i: int) -> Op | None:
        loose = self._loose
        return loose[i] if i in loose else self._record(i)

    def _record(self, p: int) -> Op:
        """The record stamped at position p (inside a stamp, not loose): stamp_records' op p - base."""
        base, s, ext, layer, mb, prefix = self._order[bisect_right(self._bases, p) - 1]
        i = p - base
        wait = s.wait_arr[i]
        return new_op((p, prefix + s.suffixes[i], s.streams[i], s.categories[i], s.phases[i], s.works[i],
                       self._stamped_deps(s, base, ext, i), layer, mb, s.host_calls[i],
                       None if wait < 0 else base + int(wait)))

    @staticmethod
    def _stamped_deps(s: Stencil, base: int, ext: tuple, i: int) -> tuple:
        sl = s.slices[i]
        deps = [base + r for r in s.flat_rel[sl]]
        slots = s.ext_slots  # (in flat position order: the op's are those from the first at or past sl.start)
        for j in range(bisect_left(slots, (sl.start,)), len(slots)):
            pos, k = slots[j]
            if pos >= sl.stop:
                break
            deps[pos - sl.start] = ext[k]
        return tuple(deps)

    def deps_of(self, i: int) -> tuple:
        """ops[i].deps, without building the record."""
        loose = self._loose
        if i in loose:
            return loose[i].deps
        j = bisect_right(self._bases, i) - 1
        base, s, ext = self._order[j][:3]
        return self._stamped_deps(s, base, ext, i - base)

    def layer_name(self, i: int) -> tuple[int | None, str]:
        """(ops[i].layer, ops[i].name), without building the record."""
        loose = self._loose
        if i in loose:
            op = loose[i]
            return op.layer, op.name
        base, s, _, layer, _, prefix = self._order[bisect_right(self._bases, i) - 1]
        return layer, prefix + s.suffixes[i - base]

    def __reversed__(self) -> Iterator[Op | None]:
        loose, at = self._loose, self._n
        for j in reversed(range(len(self._order))):
            base, s = self._order[j][:2]
            yield from map(loose.__getitem__, range(at - 1, base + s.n - 1, -1))
            yield from reversed(self._block(j))
            at = base
        yield from map(loose.__getitem__, range(at - 1, -1, -1))

    def where(self, start: int, phase: str, mb: int) -> Iterator[tuple[int, int | None, str]]:
        """(id, layer, name) of the ops from position `start` on whose phase is `phase` and micro-batch `mb`,
        in position order, lazily: a stamp of another micro-batch costs only its loose ops' reads."""
        loose, at = self._loose, start
        for j in range(max(0, bisect_right(self._bases, start) - 1), len(self._order)):
            base, s, _, layer, smb, prefix = self._order[j]
            if base + s.n <= at:
                continue
            yield from _matching(loose, range(at, base), phase, mb)
            inside = self._inside.get(j, ())
            lo = max(at, base)
            if smb == mb:
                phases, suffixes = s.phases, s.suffixes
                for p in range(lo, base + s.n):
                    if p in loose:
                        yield from _matching(loose, (p,), phase, mb)
                    elif phases[p - base] == phase:
                        yield p, layer, prefix + suffixes[p - base]
            elif inside:
                yield from _matching(loose, sorted(p for p in inside if p >= lo), phase, mb)
            at = base + s.n
        yield from _matching(loose, range(at, self._n), phase, mb)

    def ids_are_positions(self, start: int) -> bool:
        """Every op from `start` on has id = its position (stamped ones by construction: their loose ones read)."""
        return all(op.id == p for p, op in self._loose.items() if p >= start)

    # the schedule's
    def frozen(self) -> StampedOps | tuple[Op, ...]:
        """tiling.OpList.frozen's result for the same builder calls: a StampedOps of these stamps and loose
        ops, or the records as a tuple (a broken record, no stamp, or fewer than STAMPED_MIN_OPS ops)."""
        t = self.tiling
        if t.broken or not t.order or self._n < tiling.STAMPED_MIN_OPS:
            return self._records()
        return StampedOps(self._order, self._n, dict(sorted(self._loose.items())))

    def sealed(self, ops: tuple[Op, ...]) -> Tiling:
        """The record, for the Schedule of `ops` (OpList.sealed)."""
        assert len(ops) == self._n
        self.tiling.ops = ops
        return self.tiling

    def _records(self) -> tuple[Op, ...]:
        """Every record, in order; a position's int shared by ids, deps and waits (as OpList.ints)."""
        ints, loose, out, at = list(range(self._n)), self._loose, [], 0
        for j, (base, s, ext, layer, mb, prefix) in enumerate(self._order):
            out += map(loose.__getitem__, range(at, base))
            records = list(stamp_records(s, base, prefix, ext, layer, mb, (), ints))
            for p in self._inside.get(j, ()):
                records[p - base] = loose[p]
            out += records
            at = base + s.n
        out += map(loose.__getitem__, range(at, self._n))
        return tuple(out)


def _matching(loose: dict, positions: Iterable[int], phase: str, mb: int) -> Iterator[tuple[int, int | None, str]]:
    for p in positions:
        op = loose[p]
        if op.phase == phase and op.micro_batch == mb:
            yield op.id, op.layer, op.name
