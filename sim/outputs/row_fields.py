"""Per-row columns of an EventRows' op fields (stream, category, layer, ...), without building an Event.

An EventRows (sim/engine/_rows.pyx) keeps each event's op as (stage, index in that stage's ops); the op's
static fields live once per op. `op_codes(rows, field)` gives every row the code of its op's `field`:
codes index `values`, the field's distinct values in first-seen order over the stages' ops (a dict: values
equal as dict keys share a code, as they compare equal). Cost: one C-level pass over each stage's ops plus
one gather, not one Python step per event.

`row_keys` packs (rank, op id) pairs into one int64 (rank << 32 | op id) for set-membership tests with
numpy; `keys_fit` says whether the columns allow it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import chain
from operator import attrgetter

import numpy as np

from meshsim.sim.results.critical_path import critical_ops
from meshsim.sim.schedule.ops import OP_FIELDS
from meshsim.sim.schedule.stamped_ops import CODED_FIELDS, StampedOps, op_column

try:
    from meshsim.sim.outputs import _trace
except ImportError:  # not built: the same codes from a Python pass
    _trace = None

ID_BITS = 32


def op_codes(rows, field: str) -> tuple[np.ndarray, list]:
    """(codes, values): values[codes[i]] == rows[i].<field> for every row i (module docstring)."""
    index: dict = {}
    if any(isinstance(ops, StampedOps) for ops in rows.ops):  # a field's column per stage, no record built
        tables = [_column_codes(ops, field, index) for ops in rows.ops]
    elif _trace is not None and field in OP_FIELDS:
        tables = _trace.op_codes(list(rows.ops), OP_FIELDS.index(field), field, index)
    else:
        get = attrgetter(field)
        for ops in rows.ops:
            index.update(dict.fromkeys(map(get, ops)))
        index = {v: i for i, v in enumerate(index)}
        tables = [np.fromiter(map(index.__getitem__, map(get, ops)), np.intc, len(ops)) for ops in rows.ops]
    offsets = np.cumsum([0, *map(len, tables)])[:-1]
    flat = np.concatenate(tables) if tables else np.zeros(0, np.intc)
    return flat[offsets[rows.stage_arr] + rows.op_index_arr], list(index)


def used_codes(codes: np.ndarray, count: int) -> np.ndarray:
    """The distinct codes among `codes` (each in [0, count)), ascending."""
    return np.flatnonzero(np.bincount(codes, minlength=count)) if len(codes) else np.zeros(0, np.int64)


def dense_unique(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(key, return_inverse=True) for non-negative int keys, by counting when they are small."""
    if not len(key) or key.min() < 0 or key.max() >= 1 << 24:
        uniq, inverse = np.unique(key, return_inverse=True)
        return uniq, np.asarray(inverse).reshape(-1)
    uniq = np.flatnonzero(np.bincount(key))
    table = np.zeros(int(key.max()) + 1, dtype=np.int64)
    table[uniq] = np.arange(len(uniq))
    return uniq, table[key]


def keys_fit(rank: np.ndarray, op_id: np.ndarray) -> bool:
    """Whether every (rank, op id) packs into row_keys' int64 (both >= 0, rank < 2**31, op id < 2**32)."""
    return not len(rank) or bool(rank.min() >= 0 and rank.max() < 2**31 and op_id.min() >= 0
                                 and op_id.max() < 2**ID_BITS)


def _column_codes(ops: Sequence, field: str, index: dict) -> np.ndarray:
    """One stage's codes of `field` in `index`, extended with len(index) as each new value's code (what
    _trace.op_codes does per stage), read off the field's column (stamped_ops.op_column), or for a field
    StampedOps holds per stamp coded from the stamps (StampedOps.codes)."""
    if isinstance(ops, StampedOps) and field in CODED_FIELDS:
        return ops.codes(field, index)
    values = op_column(ops, field)
    for value in dict.fromkeys(values):
        index.setdefault(value, len(index))
    return np.fromiter(map(index.__getitem__, values), np.intc, len(values))


def row_keys(rank: np.ndarray, op_id: np.ndarray) -> np.ndarray:
    """rank << 32 | op id per row (keys_fit must hold)."""
    return (rank.astype(np.int64) << ID_BITS) | op_id.astype(np.int64)


def pair_key(pair: tuple) -> int:
    """row_keys of one (rank, op id) pair of ints (bools count as the ints they equal); -1 for any other
    pair, which matches no row of an EventRows (its ranks and op ids are such ints, in range)."""
    r, o = pair
    if isinstance(r, int) and isinstance(o, int) and 0 <= r < 2**31 and 0 <= o < 2**ID_BITS:
        return (int(r) << ID_BITS) | int(o)
    return -1


def pair_keys(pairs: Collection[tuple]) -> np.ndarray:
    """pair_key of each pair, in order (int64); a C-level pass when every member is an int in range."""
    flat = chain.from_iterable(pairs)
    if set(map(type, flat)) <= {int}:
        try:
            both = np.fromiter(chain.from_iterable(pairs), np.int64, 2 * len(pairs)).reshape(-1, 2)
        except OverflowError:  # an int beyond 64 bits: no row has it
            both = None
        if both is not None and keys_fit(both[:, 0], both[:, 1]):
            return row_keys(both[:, 0], both[:, 1])
    return np.fromiter(map(pair_key, pairs), np.int64, len(pairs))


def path_op_arrays(critical_path: Sequence) -> tuple[np.ndarray, np.ndarray] | None:
    """(rank, op id) of the path's op segments (op id not None), in path order, read off the columns a
    StepResult's critical_path keeps (path_columns.SegmentTuple: its segments' ranks and op ids are those
    arrays' ints, op id None where the column holds -1); None for any other path."""
    cols = getattr(critical_path, "columns", None)
    if cols is None or len(cols) != len(critical_path):
        return None
    on = cols.op_id >= 0
    return cols.rank[on], cols.op_id[on]


def path_keys(critical_path: Sequence) -> np.ndarray:
    """row_keys of the path's (rank, op id) pairs: as a set, pair_keys(list(critical_ops(critical_path)))
    (what membership tests read: order and repeats aside), from the path's columns where it keeps them
    (path_op_arrays) and they fit, else from the records."""
    arrays = path_op_arrays(critical_path)
    if arrays is not None and keys_fit(*arrays):
        return row_keys(*arrays)
    return pair_keys(list(critical_ops(critical_path)))


def member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Per key: its position in sorted_keys, -1 where absent."""
    if not len(sorted_keys):
        return np.full(len(keys), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == keys, at, -1)


def rows_where(rows, mask: np.ndarray) -> Sequence:
    """The events of the rows where mask holds, in log order (only those are built)."""
    return rows.take(np.flatnonzero(mask))
