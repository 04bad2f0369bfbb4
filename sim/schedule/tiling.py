"""A schedule's arrays tiled from the templates it was stamped from, not read off its ops one by one.

A builder collects its ops in a StageOps (sim/schedule/stage_ops.py), or in the reference `OpList` here, which
builds every record as it stamps; either records each stamp (sim/schedule/stamping.stamp) in a Tiling: the
template's Stencil, the base and the external inputs, in order (`order`; grouped per stencil when read: `stamps`,
`places`). Stamp j of a stencil of n ops at base B_j holds the ops B_j + i (i < n): their kind, stream, host
calls and dep counts are the stencil's columns, their host waits B_j + w_i, and their deps B_j + rel_f (ext
slots: the stamp's input) written at dep_ptr[B_j + owner_f] + within_f: a few numpy passes per stencil
(`Tiling.arrays`); the loose ops' values are checked and written column by column (_all_plain, _int64_column: the
per-op rules of tests/results_reference/build_rules.py, tests/test_build_shortcuts.py). (Laying every stamp over
the positions in one pass, a 1-D gather per column, was measured slower on the default sweep's stages: its per-op
temporaries cost more than the per-stencil 2-D writes.)

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
from functools import partial
from itertools import chain
from operator import attrgetter, is_not

import numpy as np

from meshsim.sim.schedule.ops import Op, ScheduleArrays, arrays_from_ops, kind_of
from meshsim.sim.schedule.stamped_ops import StampedOps
from meshsim.sim.schedule.stencil import STREAM_INDEX, Stencil
from meshsim.sim.schedule.work_table import WorkTable


class Tiling:
    """The stamps of one op list, in order (`order`: (base, stencil, ext inputs, layer, micro-batch, prefix));
    the gated stamps; the positions replaced. `stamps` and `places` group them per stencil, once read."""

    def __init__(self) -> None:
        self.order: list[tuple] = []  # every stamp's (base, stencil, ext inputs, layer, mb, prefix), in order
        self.gated: list[tuple[int, Stencil]] = []
        self.dirty: list[int] = []
        self.broken = False
        self.ops: tuple[Op, ...] | None = None  # the schedule's ops it describes (OpList.sealed)
        self._grouping: tuple | None = None  # (len(order) grouped, stamps, places)

    def add(self, s: Stencil, base: int, ext_vals: tuple, gate: tuple[int, ...], layer: object = None,
            mb: object = None, prefix: str = "") -> None:
        if None in ext_vals:  # an input the builder never made (a short schedule Megatron's rules refuse, as
            self.broken = True  # the search's bound builds): its dep is None, read off the ops the long way
            return
        self.order.append((base, s, ext_vals, layer, mb, prefix))
        if gate:
            self.gated.append((base, s))

    @property
    def stamps(self) -> dict[Stencil, tuple[list[int], list[tuple]]]:
        """Per stencil (in first-use order): its stamps' (bases, ext inputs), in order."""
        return self._grouped()[1]

    @property
    def places(self) -> dict[Stencil, tuple[list, list, list]]:
        """Per stencil: its stamps' (layers, micro-batches, prefixes), in order."""
        return self._grouped()[2]

    def _grouped(self) -> tuple:
        """`order` grouped per stencil, one pass, kept until a stamp is added."""
        g = self._grouping
        if g is None or g[0] != len(self.order):
            stamps: dict = {}
            places: dict = {}
            for base, s, ext_vals, layer, mb, prefix in self.order:
                entry = stamps.get(s)
                if entry is None:
                    entry = stamps[s] = ([], [])
                    places[s] = ([], [], [])
                entry[0].append(base)
                entry[1].append(ext_vals)
                place = places[s]
                place[0].append(layer)
                place[1].append(mb)
                place[2].append(prefix)
            g = self._grouping = (len(self.order), stamps, places)
        return g

    def _layout(self, n: int) -> tuple[list[tuple], np.ndarray, list[int]]:
        """([(stencil, its stamps' bases, their op positions (one row per stamp), ext inputs)], the loose mask,
        the loose positions): what tiled, work_table and fields start from (a few numpy passes per stencil)."""
        groups = []
        loose = np.ones(n, dtype=bool)
        for s, (bases, exts) in self.stamps.items():
            b = np.array(bases, dtype=np.intp)
            pos = b[:, None] + np.arange(s.n)
            loose[pos] = False
            groups.append((s, b, pos, exts))
        for base, s in self.gated:
            loose[[base + i for i in s.entries]] = True
        loose[self.dirty] = True
        return groups, loose, np.flatnonzero(loose).tolist()

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
        groups, loose, loose_at = self._layout(n)
        los = list(map(ops.__getitem__, loose_at))
        if list(map(_ID, los)) != loose_at or not _all_plain(los):  # ids not positions (the long way maps
            return None  # them), or odd values
        cols = [np.empty(n, dtype=np.intc) for _ in range(4)]  # kind, stream, host_calls, host_wait
        counts = np.empty(n, dtype=np.intc)
        for s, b, pos, _ in groups:
            for col, src in zip(cols[:3], (s.kind, s.stream_idx, s.calls_arr), strict=True):
                col[pos] = src
            cols[3][pos] = np.where(s.wait_arr >= 0, b[:, None] + s.wait_arr, -1)
            counts[pos] = s.counts
        deps = list(map(_DEPS, los))
        cols[0][loose_at] = list(map(kind_of, map(_WORK, los)))
        cols[1][loose_at] = list(map(STREAM_INDEX.__getitem__, map(_STREAM, los)))
        cols[2][loose_at] = list(map(_CALLS, los))
        cols[3][loose_at] = [-1 if w is None else w for w in map(_WAIT, los)]
        counts[loose_at] = list(map(len, deps))
        ptr = np.zeros(n + 1, dtype=np.intc)
        np.cumsum(counts, out=ptr[1:])
        idx = np.empty(int(ptr[-1]), dtype=np.intc)
        for s, b, _, exts in groups:
            if s.rel_arr.size:
                _tile_deps(s, b, exts, ptr, idx, loose)
        if loose_at:  # the loose ops' deps, in order, at ptr[p] + 0, 1, ... for each loose p
            lens = counts[loose_at].astype(np.intp)
            starts = ptr[loose_at].astype(np.intp) - (np.cumsum(lens) - lens)
            idx[np.repeat(starts, lens) + np.arange(int(lens.sum()))] = list(chain.from_iterable(deps))
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

        def numbers(works) -> list[int]:
            out = []
            for work in works:
                k = first_seen.get(id(work))
                if k is None:
                    k = first_seen[id(work)] = len(objs)
                    objs.append(work)
                out.append(k)
            return out

        groups, loose, loose_at = self._layout(n)
        prov = np.empty(n, dtype=np.intp)
        first_at: dict[int, int] = {}  # provisional number -> its first position
        for s, _, pos, _ in groups:
            nums = numbers(s.works)
            prov[pos] = nums
            at = np.where(loose[pos], n, pos).min(axis=0).tolist()  # per stencil op: its first stamped position
            for i, k in enumerate(nums):  # (not loose: a loose op there is read off its record below)
                if first_at.get(k, n) > at[i]:
                    first_at[k] = at[i]
        nums = numbers(map(_WORK, map(ops.__getitem__, loose_at)))
        prov[loose_at] = nums
        for p, k in zip(loose_at, nums, strict=True):
            if first_at.get(k, n) > p:
                first_at[k] = p
        first = np.array([first_at.get(k, n) for k in range(len(objs))], dtype=np.intp)  # np.unique's return_index
        present = np.flatnonzero(first < n)  # (n: a stencil's work at loose positions only, held by no op)
        order = present[np.argsort(first[present], kind="stable")]
        renumber = np.empty(len(objs), dtype=np.intp)
        renumber[order] = np.arange(len(order), dtype=np.intp)
        return WorkTable(tuple(objs[k] for k in order.tolist()), renumber[prov], first[order])

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
        groups, _, loose_at = self._layout(n)
        places = self.places
        for s, _, pos, _ in groups:
            layers, mbs = places[s][:2]
            layer_col, mb_col = _int64_column(layers), _int64_column(mbs)
            if layer_col is None or mb_col is None:
                return None
            phase[pos] = [phases.setdefault(ph, len(phases)) for ph in s.phases]
            layer[pos] = layer_col[:, None]
            mb[pos] = mb_col[:, None]
        los = list(map(ops.__getitem__, loose_at))  # gated entries and replaced ops too: their own values
        loose_phases = list(map(_PHASE, los))
        if not all(type(ph) is str for ph in loose_phases):
            return None
        layer_col, mb_col = _int64_column(list(map(_LAYER, los))), _int64_column(list(map(_MB, los)))
        if layer_col is None or mb_col is None:
            return None
        phase[loose_at] = [phases.setdefault(ph, len(phases)) for ph in loose_phases]
        layer[loose_at] = layer_col
        mb[loose_at] = mb_col
        return OpFields(phase, tuple(phases), layer, mb)


NONE = -2**63  # OpFields' None: below every int the columns take
# a built stage of at least this many ops holds them as stamps (StampedOps), a smaller one as records. 0: every
# stage holds stamps. Issue 40 measured the 20,000 it was: the default scenario's run is no slower as stamps
# (benchmarks/run.py --cases default, CPU min 1.006x with all outputs, 0.987x with --outputs none), and a sweep,
# whose schedules are read through their columns, no longer builds and frees ~24k records per configuration it
# never reads (benchmarks/sweep.py --case default-96 --jobs 1: ~15 ms less CPU per configuration). The 405B's
# stages (~0.5M ops) hold 300 MB less as stamps, DeepSeek-V3's skip 320k records it mostly never reads.
STAMPED_MIN_OPS = 0


def _int64_column(values: list) -> np.ndarray | None:
    """`values` as int64 (None as NONE), or None unless every value is None or an int in (NONE, 2**63):
    checked by type (C-level), then the ints' least and greatest against the range."""
    if not set(map(type, values)) <= _INT_OR_NONE:
        return None
    ints = list(filter(partial(is_not, None), values))
    if ints and not (min(ints) > NONE and max(ints) < 2**63):
        return None
    return np.array([NONE if v is None else v for v in values] if len(ints) < len(values) else values, dtype=np.int64)


_INT_OR_NONE = {int, type(None)}


@dataclass(frozen=True, eq=False)
class OpFields:
    """Per op position: its phase's code (`phases[code]` is the phase; equal codes <=> equal phases), its layer
    and its micro-batch as int64 (NONE: None; equal values <=> equal fields)."""

    phase: np.ndarray
    phases: tuple[str, ...]
    layer: np.ndarray
    micro_batch: np.ndarray


_ID, _DEPS, _WORK, _STREAM, _CALLS, _WAIT = (attrgetter(f) for f in ("id", "deps", "work", "stream", "host_calls",
                                                                     "host_wait"))
_PHASE, _LAYER, _MB = attrgetter("phase"), attrgetter("layer"), attrgetter("micro_batch")


def _all_plain(ops: list[Op]) -> bool:
    """Every op plain (tests/results_reference/build_rules.py: the same verdict as its per-op rule, checked
    column by column: types C-level, then ranges)."""
    if not all(map(STREAM_INDEX.__contains__, map(_STREAM, ops))):
        return False
    calls = list(map(_CALLS, ops))
    waits = list(filter(partial(is_not, None), map(_WAIT, ops)))
    deps = list(chain.from_iterable(map(_DEPS, ops)))
    return (_all_fit(calls) and _all_fit(waits) and (not waits or min(waits) >= 0) and _all_fit(deps))


def _all_fit(values: list) -> bool:
    """Every value an int the np.intc columns take (tests/results_reference/build_rules.py fits, per value)."""
    return set(map(type, values)) <= {int} and (not values or min(values) >= -2**31 and max(values) < 2**31)


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
