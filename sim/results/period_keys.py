"""Ops' identities across periods (keys), mu on them, and which ops repeat the op one period before them
(sim/results/period_state.py's StageMap is built from these), over whole schedules at once.

A key is (micro-batch, ordinal among that micro-batch's ops that are not P2P batches), or for a P2P
batch (its micro-batch, ((send, direction, micro-batch, sender's virtual stage) of each transfer)).
`regular_mask` decides, for every op i at once, the per-op test the proof states (period_state.stage_map):
key i is mu of key i - P, and op i has the inputs of op i - P one period later. Keys are compared through
their ids (the last op holding each key, as the key -> id map keeps it), so two keys are equal exactly when
their ids are, and looked up through a KeyIndex (arrays, not a dict over every key); deps and host waits in
CSR arrays; the work objects are compared in Python only where they are not one shared object. Ids, codes
and ordinals are np.intc where they fit (run_arrays.index_array: checked), arithmetic on them in int64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from operator import attrgetter, eq, itemgetter

import numpy as np

from meshsim.sim.schedule.ops import P2P, Op, Schedule, ScheduleArrays
from meshsim.sim.schedule.tiling import NONE, OpFields
from meshsim.sim.schedule.work_table import WorkTable

Key = tuple  # (micro-batch, ordinal) or, for a P2P batch, (micro-batch, its transfers' identities)
_MB, _WORK, _DEPS = attrgetter("micro_batch"), attrgetter("work"), attrgetter("deps")
_STATIC = tuple(attrgetter(a) for a in ("stream", "phase", "layer", "host_calls"))
_WAIT = attrgetter("host_wait")
_ORDINAL = itemgetter(1)
_INTC = np.iinfo(np.intc)


def _relative(mb, transfers) -> tuple:
    """A P2P batch's key (mb, ((send, direction, micro-batch, sender's virtual stage), ...)) as (mb, each
    transfer's micro-batch less mb): one to one for a given mb (ints), and later(key, unit) is (mb + unit,
    the same second part), so the key one period later is looked up without building it. No micro-batch:
    (None, the transfers' identities) as they are (later() leaves such a key alone)."""
    if mb is None:
        return (None, tuple((t.send, t.direction, t.micro_batch, t.sender_vstage) for t in transfers))
    return (mb, tuple((t.send, t.direction, t.micro_batch - mb, t.sender_vstage) for t in transfers))


def _absolute(rel: tuple) -> Key:
    """The key of _relative's (mb, part)."""
    mb, part = rel
    return rel if mb is None else (mb, tuple((send, d, t_mb + mb, q) for send, d, t_mb, q in part))


def op_keys(schedule: Schedule) -> list[Key]:
    """op id -> its identity across periods (module docstring): a batch is labelled by its first
    transfer's micro-batch, so the warm-up's batches would shift the ordinals of later ones."""
    return key_parts(schedule)[0]


def key_parts(schedule: Schedule) -> tuple[list[Key], list, list[int]]:
    """(op_keys, each op's micro-batch, the ids of its P2P batches). Ordinals: each op's rank among the
    earlier non-P2P ops of its micro-batch (a stable sort by micro-batch)."""
    return key_index(schedule).parts


@dataclass(frozen=True, eq=False)
class KeyIndex:
    """A stage's keys (key_parts) and the key -> id lookups mu needs, as arrays instead of a dict over
    every key. Keys of ops that are not P2P batches are all distinct (micro-batch, ordinal) pairs, and
    none equals a P2P batch's (its second part is a tuple): the op of (m, o) is the o-th of micro-batch
    m's group in `order` (ops grouped by micro-batch code, ascending, in id order). P2P batches' keys are
    looked up in `p2p_id` (the last id holding each, as a dict keeps it)."""

    p2p: list[int]  # the ids of the P2P batches
    none: np.ndarray  # per op: it has no micro-batch
    code: np.ndarray  # per op: mb_codes
    ordinal: np.ndarray  # per op: its ordinal (0 for a P2P batch)
    p2p_mask: np.ndarray
    order: np.ndarray  # the non-P2P op ids grouped by code, ascending, in id order within a group
    group_code: np.ndarray  # per group: its code (ascending)
    group_first: np.ndarray  # per group: where it starts in `order`
    group_size: np.ndarray
    none_code: int
    p2p_rel: dict[int, tuple]  # P2P batch id -> its key as _relative gives it
    rel_id: dict[tuple, int]  # _relative key -> the last P2P batch id holding it

    @cached_property
    def p2p_key(self) -> dict[int, Key]:
        """P2P batch id -> its key, built on first use."""
        return {i: _absolute(rel) for i, rel in self.p2p_rel.items()}

    @cached_property
    def mbs(self) -> list:
        """Per op: its micro-batch (None: none), built on first use: `code` is the micro-batch itself
        wherever the op has one (key_index)."""
        mbs = self.code.tolist()
        for i in np.flatnonzero(self.none).tolist():
            mbs[i] = None
        return mbs

    @cached_property
    def no_mb(self) -> memoryview:
        """`none` as bytes (1: the op has no micro-batch), read one op at a time as a Python int."""
        return memoryview(self.none.view(np.uint8))

    def key(self, op_id: int) -> Key:
        """op_keys(schedule)[op_id], without building the list."""
        hit = self.p2p_rel.get(op_id)
        if hit is not None:
            return _absolute(hit)
        return (None if self.no_mb[op_id] else int(self.code[op_id]), int(self.ordinal[op_id]))

    @cached_property
    def parts(self) -> tuple[list[Key], list, list[int]]:
        """key_parts: (op_keys, each op's micro-batch, the ids of the P2P batches), built on first use."""
        keys = list(zip(self.mbs, self.ordinal.tolist(), strict=True))
        for i, key in self.p2p_key.items():
            keys[i] = key
        return keys, self.mbs, self.p2p

    def find(self, mbs: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
        """The id of key (mbs[k], ordinals[k]) for micro-batches (not None), -1 where no op has it."""
        out = np.full(len(mbs), -1, self.order.dtype)
        groups = len(self.group_code)
        if not groups or not len(mbs):
            return out
        g = np.searchsorted(self.group_code, mbs)
        gi = np.minimum(g, groups - 1)
        ok = (g < groups) & (self.group_code[gi] == mbs) & (mbs != self.none_code) & (ordinals >= 0) & \
            (ordinals < self.group_size[gi])
        out[ok] = self.order[self.group_first[gi[ok]] + ordinals[ok]]
        return out

    @cached_property
    def kid(self) -> np.ndarray:
        """Per op: the id its key has (the last op holding that key): itself but for repeated P2P keys."""
        kid = np.arange(len(self.code), dtype=self.order.dtype)
        rel_id = self.rel_id
        for i, rel in self.p2p_rel.items():
            kid[i] = rel_id[rel]
        return kid

    def later_ids(self, unit: int) -> np.ndarray:
        """Per op: the id of later(its key, unit), -1 where no op has it (an op of no micro-batch: its own
        key's id); what looking each later key up in the key -> id map gives."""
        out = np.full(len(self.code), -1, self.order.dtype)
        plain = np.flatnonzero(~self.none & ~self.p2p_mask)
        out[plain] = self.find(self.code[plain].astype(np.int64) + unit, self.ordinal[plain])
        own = np.flatnonzero(self.none)
        out[own] = self.kid[own]
        rel_id = self.rel_id
        for i, (mb, part) in self.p2p_rel.items():  # later(key, unit) <=> (mb + unit, part): _relative
            if mb is not None:
                out[i] = rel_id.get((mb + unit, part), -1)
        return out

    def id_of(self, key: Key) -> int | None:
        """The id of `key` (the key -> id map's get)."""
        mb, tag = key
        if isinstance(tag, tuple):
            return self.rel_id.get(key if mb is None else (mb, tuple((s, d, t_mb - mb, q) for s, d, t_mb, q in tag)))
        if mb is None:
            at = np.flatnonzero(self.group_code == self.none_code) if self.none.any() else []
            if not len(at) or not 0 <= tag < self.group_size[at[0]]:
                return None
            return int(self.order[self.group_first[at[0]] + tag])
        return self._one(mb, tag)

    @cached_property
    def _group_of(self) -> dict[int, tuple[int, int]]:
        """code -> (where its group starts in `order`, its size), for the micro-batch groups."""
        return {c: (f, z) for c, f, z in zip(self.group_code.tolist(), self.group_first.tolist(),
                                             self.group_size.tolist(), strict=True) if c != self.none_code}

    def _one(self, mb: int, tag: int) -> int | None:
        """find() of one key (a micro-batch's), without its arrays: the same id, None where find gives -1."""
        group = self._group_of.get(mb)
        if group is None or not 0 <= tag < group[1]:
            return None
        return int(self.order[group[0] + tag])


def key_index(schedule: Schedule) -> KeyIndex:
    """The stage's KeyIndex (key_parts, then its groups)."""
    ops = schedule.ops
    n = len(ops)
    tiled = schedule.tiled_arrays
    fields = schedule.fields if tiled is not None else None
    if fields is not None:  # the micro-batch column (NONE: None), not a pass over the ops
        mb = fields.micro_batch
        none = mb == NONE
        # mb_codes(mbs) off the int64 column: the same min - 1 code for none (-1 when none has one)
        code = np.where(none, int(mb[~none].min()) - 1 if not none.all() else -1, mb)
    else:
        mbs = list(map(_MB, ops))
        code = mb_codes(mbs)
        none = np.isnan(np.array(mbs, np.float64)) if n else np.zeros(0, bool)
    code = index_array(code)  # np.intc when every micro-batch fits (checked)
    ids = np.intc if n <= np.iinfo(np.intc).max else np.int64  # op ids and ordinals are below n
    if tiled is not None:
        p2p = np.flatnonzero(tiled.kind == 2).tolist()  # ScheduleArrays.kind: 2 for a P2P batch
    else:
        p2p = [i for i, w in enumerate(map(_WORK, ops)) if isinstance(w, P2P)]
    counted = np.ones(n, bool)
    counted[p2p] = False
    rows = np.flatnonzero(counted)
    order = rows[np.argsort(code[rows], kind="stable")].astype(ids)  # each micro-batch's ops together, in id order
    del rows
    grouped = code[order]
    first = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if len(order) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[first, len(order)])
    ordinal = np.zeros(n, ids)
    ordinal[order] = np.arange(len(order)) - np.repeat(first, sizes)
    if fields is not None:  # works[index[i]] is op i's work, fields its micro-batch: no op record built
        works, at, mb_of = schedule.work_table.works, schedule.work_table.index, fields.micro_batch
        p2p_rel = {i: _relative(None if mb == NONE else mb, works[w].transfers)
                   for i, w, mb in zip(p2p, at[p2p].tolist(), mb_of[p2p].tolist(), strict=True)}
    else:
        p2p_rel = {i: _relative(ops[i].micro_batch, ops[i].work.transfers) for i in p2p}
    none_code = int(code[none][0]) if none.any() else int(code.min()) - 1 if n else -1
    return KeyIndex(p2p, none, code, ordinal, ~counted, order, grouped[first], first, sizes, none_code, p2p_rel,
                    {rel: i for i, rel in p2p_rel.items()})


def index_array(values: np.ndarray) -> np.ndarray:
    """`values` (integers) as np.intc when every one fits in it (checked: min and max), else as int64; an
    np.intc array is returned as it is (no copy). Comparisons and indexing with either give the same
    answers; arithmetic on them that could leave the range (an id plus a count) is done in int64."""
    values = np.asarray(values)
    if values.dtype == np.intc:
        return values
    if not len(values) or (int(values.min()) >= _INTC.min and int(values.max()) <= _INTC.max):
        return values.astype(np.intc)
    return values.astype(np.int64)


def mb_codes(mbs: list) -> np.ndarray:
    """Each op's micro-batch as an int64, those of none as one code below every micro-batch (min - 1, -1
    when none has one): read through a float64 array (None -> NaN), exact for micro-batches below 2^53."""
    f = np.array(mbs, np.float64) if mbs else np.zeros(0)
    none = np.isnan(f)
    none_code = int(f[~none].min()) - 1 if not none.all() else -1
    return np.where(none, none_code, f).astype(np.int64)


def later_keys(keys: list[Key], mbs: list, p2p: list[int], unit: int) -> list[Key]:
    """later(key, unit) of every key (key_parts' micro-batches and P2P ids): (mb + unit, ordinal) but for
    P2P batches and ops of no micro-batch."""
    none = np.flatnonzero(np.isnan(np.array(mbs, np.float64))).tolist() if mbs else []
    out = list(zip((mb_codes(mbs) + unit).tolist(), map(_ORDINAL, keys), strict=True))
    for i in none:
        out[i] = keys[i]
    for i in p2p:
        out[i] = later(keys[i], unit)
    return out


def later(key: Key, unit: int) -> Key:
    """mu on keys: micro-batches + unit (an op of no micro-batch is its own image)."""
    mb, tag = key
    if mb is None:
        return key
    if isinstance(tag, tuple):
        tag = tuple((send, d, t_mb + unit, q) for send, d, t_mb, q in tag)
    return (mb + unit, tag)


def _pairs_equal(values: Sequence, p: int) -> np.ndarray:
    """values[i] == values[i - p] for i in [p, n) (Python ==, over C-level maps)."""
    return np.fromiter(map(eq, values[p:], values[:-p]), bool, len(values) - p)


def _same_work(wa, wb, unit: int) -> bool:
    if isinstance(wa, P2P) and isinstance(wb, P2P):
        return len(wa.transfers) == len(wb.transfers) and all(
            (x.send, x.direction, x.micro_batch + unit, x.sender_vstage, x.peer_stage, x.nbytes)
            == (y.send, y.direction, y.micro_batch, y.sender_vstage, y.peer_stage, y.nbytes)
            for x, y in zip(wa.transfers, wb.transfers, strict=True))
    return wa == wb


def dep_csr(ops: Sequence[Op]) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, ids): op i's deps are ids[ptr[i]:ptr[i + 1]]."""
    deps = list(map(_DEPS, ops))
    ptr = np.zeros(len(ops) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, deps), np.int64, len(ops)), out=ptr[1:])
    return ptr, np.fromiter(chain.from_iterable(deps), np.int64, int(ptr[-1]))


def regular_mask(ops: Sequence[Op], index: KeyIndex, p: int, unit: int,
                 deps: tuple[np.ndarray, np.ndarray] | None = None, tiled: ScheduleArrays | None = None,
                 mu: np.ndarray | None = None, fields: OpFields | None = None, table: WorkTable | None = None
                 ) -> np.ndarray:
    """ok[i] for every op id: i >= p, op i - p has a micro-batch, keys[i] == later(keys[i - p]), and op i
    reads what op i - p reads one period later: the same stream, phase, layer, host calls, work (a P2P
    batch: its transfers one period later), and deps and host wait whose keys are the images of i - p's.
    With the schedule's tiled arrays, `fields` (its OpFields) and `table` (its WorkTable) every test reads
    columns (equal codes <=> equal fields, equal work indices <=> one shared work) and no op."""
    n = len(ops)
    ok = np.zeros(n, bool)
    if p <= 0 or p >= n:
        return ok
    # equal keys <=> equal kid (the last id of each key); mu: the id of each op's later key (-1: none)
    kid = index.kid
    mu = index.later_ids(unit) if mu is None else mu
    has_mb = ~index.none
    good = has_mb[:-p] & (kid[p:] == mu[:-p])
    for field, column in zip(_STATIC, ("stream", "phase", "layer", "host_calls"), strict=True):
        held = tiled if column in ("stream", "host_calls") else fields if tiled is not None else None
        if held is not None:  # equal indices <=> equal streams, phases; host calls, layers are ints (or NONE)
            values = getattr(held, column)
            good &= values[p:] == values[:-p]
        else:
            good &= _pairs_equal(list(map(field, ops)), p)
    if tiled is not None:  # ids are positions: the tiled host waits are the ops' (-1: none; np.intc, read only)
        hw = tiled.host_wait
    else:
        waits = list(map(_WAIT, ops))
        hw = np.array([-1 if w is None else w for w in waits], np.int64)
    good &= (hw[p:] < 0) == (hw[:-p] < 0)
    both = (hw[p:] >= 0) & (hw[:-p] >= 0)
    good[both] &= kid[hw[p:][both]] == mu[hw[:-p][both]]
    ptr, flat = deps if deps is not None else (tiled.dep_ptr, tiled.dep_idx) if tiled is not None else dep_csr(ops)
    count = np.diff(ptr)
    good &= count[p:] == count[:-p]
    cand = np.flatnonzero(good & (count[p:] > 0))
    if len(cand):
        c = count[cand + p]
        at = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)  # the dep's position in its list
        row = np.repeat(cand, c)
        bad = kid[flat[ptr[row + p] + at]] != mu[flat[ptr[row] + at]]
        good[row[bad]] = False  # repeated rows: each set False, as once
    if table is not None and tiled is not None:  # equal indices <=> one shared work object
        works, ids = table.works, table.index
        for j in np.flatnonzero(good & (ids[p:] != ids[:-p])).tolist():
            good[j] = _same_work(works[ids[j]], works[ids[j + p]], unit)
    else:
        works = list(map(_WORK, ops))
        ids = np.fromiter(map(id, works), np.int64, n)
        for j in np.flatnonzero(good & (ids[p:] != ids[:-p])).tolist():
            good[j] = _same_work(works[j], works[j + p], unit)
    ok[p:] = good
    return ok
