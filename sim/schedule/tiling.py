"""A schedule's arrays tiled from the templates it was stamped from, not read off its ops one by one.

A builder collects its ops in a StageOps (sim/schedule/stage_ops.py), or in the reference `OpList` here, which
builds every record as it stamps; either records each stamp (sim/schedule/stamping.stamp) in a Tiling: the
template's Stencil, the base and the external inputs. Grouped per stencil, m stamps at bases B are the
ops B[j] + i (i < n): their kind, stream, host calls and dep counts are the stencil's columns, their host
waits B[j] + w_i, and their deps B[j] + rel_f (ext slots: the stamp's input) written at
dep_ptr[B[j] + owner_f] + within_f: a few numpy passes per template (`Tiling.arrays`).

Ops the builder appended itself (P2P batches, step end, gathers), ops it replaced afterwards (`ops[i] = ...`,
recorded as dirty: a gate added to a block's first op, the parameter gathers' consumers) and the entry ops
of gated stamps are read off their Op records ("loose"). Any other change to the list (insert, delete,
slice assignment, sort) drops the record, and the arrays are read off the ops (ops.arrays_from_ops), as they
are for any ops tuple but the one the record was sealed with (a Schedule copied with other ops). The tiled
arrays need ids = positions: every loose op is checked, stamped ops have it by construction.
tests/test_schedule_arrays.py proves Tiling.arrays equal to arrays_from_ops over generated schedules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshsim.sim.schedule.ops import Op, ScheduleArrays, arrays_from_ops, kind_of
from meshsim.sim.schedule.stamped_ops import StampedOps
from meshsim.sim.schedule.stencil import STREAM_INDEX, Stencil
from meshsim.sim.schedule.work_table import WorkTable


class Tiling:
    """The stamps of one op list, per stencil: (bases, ext inputs); the gated stamps; positions replaced."""

    def __init__(self) -> None:
        self.stamps: dict[Stencil, tuple[list[int], list[tuple]]] = {}
        self.places: dict[Stencil, tuple[list, list, list]] = {}  # per stencil, per stamp: layer, micro-batch, prefix
        self.order: list[tuple] = []  # every stamp's (base, stencil, ext inputs, layer, mb, prefix), in order
        self.gated: list[tuple[int, Stencil]] = []
        self.dirty: list[int] = []
        self.broken = False
        self.ops: tuple[Op, ...] | None = None  # the schedule's ops it describes (OpList.sealed)

    def add(self, s: Stencil, base: int, ext_vals: tuple, gate: tuple[int, ...], layer: object = None,
            mb: object = None, prefix: str = "") -> None:
        if None in ext_vals:  # an input the builder never made (a short schedule Megatron's rules refuse, as
            self.broken = True  # the search's bound builds): its dep is None, read off the ops the long way
            return
        entry = self.stamps.get(s)
        if entry is None:
            entry = self.stamps[s] = ([], [])
        entry[0].append(base)
        entry[1].append(ext_vals)
        place = self.places.get(s)
        if place is None:
            place = self.places[s] = ([], [], [])
        place[0].append(layer)
        place[1].append(mb)
        place[2].append(prefix)
        self.order.append((base, s, ext_vals, layer, mb, prefix))
        if gate:
            self.gated.append((base, s))

    def arrays(self, ops: tuple[Op, ...]) -> ScheduleArrays:
        """ScheduleArrays of `ops` (module docstring); read off the ops when the record does not cover them."""
        tiled = self.tiled(ops)
        return tiled if tiled is not None else arrays_from_ops(ops)

    def tiled(self, ops: tuple[Op, ...]) -> ScheduleArrays | None:
        """ScheduleArrays of `ops` tiled from the stamps, or None where the record does not cover them (then
        they are read off the ops). Not None implies op ids are list positions."""
        n = len(ops)
        if self.broken or ops is not self.ops:  # (a Schedule copied with other ops keeps the record)
            return None
        cols = [np.empty(n, dtype=np.intc) for _ in range(4)]  # kind, stream, host_calls, host_wait
        counts = np.empty(n, dtype=np.intc)
        loose = np.ones(n, dtype=bool)
        groups = [(s, np.array(bases, dtype=np.intp), exts) for s, (bases, exts) in self.stamps.items()]
        for s, b, _ in groups:
            pos = b[:, None] + np.arange(s.n)
            loose[pos] = False
            for col, src in zip(cols[:3], (s.kind, s.stream_idx, s.calls_arr), strict=True):
                col[pos] = src
            cols[3][pos] = np.where(s.wait_arr >= 0, b[:, None] + s.wait_arr, -1)
            counts[pos] = s.counts
        for base, s in self.gated:
            loose[[base + i for i in s.entries]] = True
        loose[self.dirty] = True
        loose_at = np.flatnonzero(loose).tolist()
        for p in loose_at:
            op = ops[p]
            if op.id != p or not _plain(op):  # ids not positions (the long way maps them), or odd values
                return None
            cols[0][p], cols[1][p], cols[2][p] = kind_of(op.work), STREAM_INDEX[op.stream], op.host_calls
            cols[3][p] = -1 if op.host_wait is None else op.host_wait
            counts[p] = len(op.deps)
        ptr = np.zeros(n + 1, dtype=np.intc)
        np.cumsum(counts, out=ptr[1:])
        idx = np.empty(int(ptr[-1]), dtype=np.intc)
        for s, b, exts in groups:
            if s.rel_arr.size:
                _tile_deps(s, b, exts, ptr, idx, loose)
        for p in loose_at:
            idx[ptr[p]:ptr[p + 1]] = ops[p].deps
        return ScheduleArrays(cols[0], cols[1], ptr, idx, cols[2], cols[3])


    def work_table(self, ops: tuple[Op, ...]) -> WorkTable | None:
        """WorkTable.of(ops) from the stamps (each stamp's ops share its stencil's works, by position), the
        loose ops read one by one; None where the record does not cover `ops`. Works are numbered as met
        in position order, as WorkTable.of numbers them (tests/test_ops_arrays.py compares the two)."""
        if self.broken or ops is not self.ops:
            return None
        n = len(ops)
        first_seen: dict[int, int] = {}  # id(work) -> its provisional number
        objs: list = []

        def number(work) -> int:
            k = first_seen.get(id(work))
            if k is None:
                k = first_seen[id(work)] = len(objs)
                objs.append(work)
            return k

        prov = np.empty(n, dtype=np.intp)
        loose = np.ones(n, dtype=bool)
        for s, (bases, _) in self.stamps.items():
            pos = np.array(bases, dtype=np.intp)[:, None] + np.arange(s.n)
            prov[pos] = np.array([number(w) for w in s.works], dtype=np.intp)
            loose[pos] = False
        for base, s in self.gated:
            loose[[base + i for i in s.entries]] = True
        loose[self.dirty] = True
        at = np.flatnonzero(loose)
        prov[at] = np.array([number(ops[p].work) for p in at.tolist()], dtype=np.intp)
        present, first = np.unique(prov, return_index=True)
        order = np.argsort(first, kind="stable")
        renumber = np.empty(len(objs), dtype=np.intp)
        renumber[present[order]] = np.arange(len(order), dtype=np.intp)
        return WorkTable(tuple(objs[k] for k in present[order].tolist()), renumber[prov], first[order])


    def fields(self, ops: tuple[Op, ...]) -> OpFields | None:
        """The ops' phase, layer and micro-batch as columns (OpFields), from the stamps (phase: the stencil's;
        layer, micro-batch: the stamp's), loose ops read one by one; None where the record does not cover
        `ops` or a value is not one the columns hold exactly (a phase that is not a str, a layer or
        micro-batch that is not an int in (NONE, 2^63) or None). tests/test_ops_arrays.py compares them."""
        if self.broken or ops is not self.ops:
            return None
        n = len(ops)
        phases: dict[str, int] = {}
        phase, layer, mb = np.empty(n, dtype=np.intc), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        loose = np.ones(n, dtype=bool)
        for s, (bases, _) in self.stamps.items():
            layers, mbs = self.places[s][:2]
            if not all(map(_int_or_none, layers)) or not all(map(_int_or_none, mbs)):
                return None
            pos = np.array(bases, dtype=np.intp)[:, None] + np.arange(s.n)
            phase[pos] = np.array([phases.setdefault(ph, len(phases)) for ph in s.phases], dtype=np.intc)
            layer[pos] = np.array([NONE if v is None else v for v in layers], dtype=np.int64)[:, None]
            mb[pos] = np.array([NONE if v is None else v for v in mbs], dtype=np.int64)[:, None]
            loose[pos] = False
        for base, s in self.gated:
            loose[[base + i for i in s.entries]] = True
        loose[self.dirty] = True
        for p in np.flatnonzero(loose).tolist():  # gated entries and replaced ops too: their own values
            op = ops[p]
            if type(op.phase) is not str or not _int_or_none(op.layer) or not _int_or_none(op.micro_batch):
                return None
            phase[p] = phases.setdefault(op.phase, len(phases))
            layer[p] = NONE if op.layer is None else op.layer
            mb[p] = NONE if op.micro_batch is None else op.micro_batch
        return OpFields(phase, tuple(phases), layer, mb)


NONE = -2**63  # OpFields' None: below every int the columns take
# a built stage of at least this many ops holds them as stamps (StampedOps), a smaller one as records: the default
# scenario's short run (one stage, ~12k ops) keeps its records (6% faster on them when measured at ~23k ops), the
# 405B's (~0.5M) hold 300 MB less as stamps, and DeepSeek-V3's H100 run (8 stages of 35-41k ops) as stamps skips
# 320k records it mostly never reads (benchmarks/run.py --outputs none, CPU min: 1.58 -> 1.46 s, RSS 324 -> 241 MB)
STAMPED_MIN_OPS = 20_000


def _int_or_none(v: object) -> bool:
    return v is None or type(v) is int and NONE < v < 2**63


@dataclass(frozen=True, eq=False)
class OpFields:
    """Per op position: its phase's code (`phases[code]` is the phase; equal codes <=> equal phases), its layer
    and its micro-batch as int64 (NONE: None; equal values <=> equal fields)."""

    phase: np.ndarray
    phases: tuple[str, ...]
    layer: np.ndarray
    micro_batch: np.ndarray


def _plain(op: Op) -> bool:
    """A loose op the arrays can hold as it is: a known stream, and host calls, deps and host wait (or None)
    as ints the np.intc columns take, the wait not negative (-1 stands for None). Any other op is left to
    the long way, whose check (sim/engine/events.py) names it; the rest of the check (calls not negative,
    deps among the positions, a wait on an earlier op) reads the columns."""
    wait = op.host_wait
    return (op.stream in STREAM_INDEX and _fits(op.host_calls) and (wait is None or _fits(wait) and wait >= 0)
            and all(map(_fits, op.deps)))


def _fits(v: object) -> bool:
    return type(v) is int and -2**31 <= v < 2**31


def _tile_deps(s: Stencil, b: np.ndarray, exts: list[tuple], ptr: np.ndarray, idx: np.ndarray,
               loose: np.ndarray) -> None:
    """Write the deps of the stencil's stamps at bases `b` (ext inputs `exts`) into dep_idx, skipping loose ops."""
    vals = b[:, None] + s.rel_arr
    if s.ext_pos.size:
        vals[:, s.ext_pos] = np.array(exts, dtype=np.intp)[:, s.ext_idx]
    owner = b[:, None] + s.owner
    dest = ptr[owner] + s.within
    keep = ~loose[owner]
    idx[dest[keep]] = vals[keep]


class OpList(list):
    """A builder's op list that records its stamps (`tiling`) and the positions replaced after them."""

    __slots__ = ("tiling", "_ints")

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.tiling = Tiling()
        self._ints: list[int] = []

    def ints(self, size: int) -> list[int]:
        """0..size-1 (at least) as one int object each: stamping takes ids, deps and host waits from it, so
        a position's int is stored once however many ops name it (32 bytes each otherwise)."""
        table = self._ints
        if len(table) < size:
            table.extend(range(len(table), size + 4096))
        return table

    def deps_of(self, i: int) -> tuple:
        """self[i].deps (as StageOps.deps_of, which builds no record)."""
        return self[i].deps

    def __setitem__(self, i, value) -> None:
        list.__setitem__(self, i, value)
        if isinstance(i, int):
            self.tiling.dirty.append(i % len(self))
        else:
            self.tiling.broken = True

    def frozen(self) -> Sequence[Op]:
        """This list's ops as the Schedule holds them: a StampedOps (the stamps' records dropped, built again
        on demand from the record: sim/schedule/stamped_ops.py) while the record covers the list, else a
        tuple. Loose ops (not stamped, replaced, gated entries) are kept as records. A stage of fewer than
        STAMPED_MIN_OPS ops keeps all its records: the same ops either way (tests/test_stamped_ops.py), and below
        that size rebuilding records on each read costs more than holding them."""
        t = self.tiling
        if t.broken or not t.order or len(self) < STAMPED_MIN_OPS:
            return tuple(self)
        n = len(self)
        loose = np.ones(n, dtype=bool)
        for base, s, *_ in t.order:
            loose[base:base + s.n] = False
        for base, s in t.gated:
            loose[[base + i for i in s.entries]] = True
        loose[t.dirty] = True
        return StampedOps(t.order, n, {p: self[p] for p in np.flatnonzero(loose).tolist()})

    def sealed(self, ops: tuple[Op, ...]) -> Tiling:
        """The record, for the Schedule of `ops`: this list as it is now, as a tuple."""
        assert len(ops) == len(self)
        self.tiling.ops = ops
        return self.tiling


def _breaks(name: str):
    method = getattr(list, name)

    def changed(self, *args, **kwargs):
        self.tiling.broken = True
        return method(self, *args, **kwargs)

    changed.__name__ = name
    return changed


for _name in ("__delitem__", "__imul__", "insert", "pop", "remove", "sort", "reverse", "clear"):
    setattr(OpList, _name, _breaks(_name))
