"""One rank's events' op fields as arrays, read off its schedules' columns: layer spans and MoE all-to-all
times without a Python pass per event.

sim/results/breakdown.py's middle_layer, layer_span_ms and ep_layer_ms read each event's op fields (over an
EventRows: lists built op by op, then masks built element by element). Here the same fields come from the
schedules the rows' ops belong to: Schedule.fields (phase code, layer and micro-batch as int64, NONE for
None: equal codes <=> equal fields, sim/schedule/tiling.py) and Schedule.tiled_arrays.stream (the index in
STREAMS), gathered by each row's op position. Every selection is then the same predicate over the same
values: layer == L, phase in the given phases, stream != dp_comm, micro-batch == 0; max / min of the
selected times are exact in any order. `row_fields` is None (the callers take the long way) unless every
stage the rows touch is one of `schedules` (by identity of its ops) with both columns.
tests/test_row_fields.py compares each function with breakdown.py's on generated schedules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.results import breakdown as bd
from meshsim.sim.results.run_arrays import distinct_ints
from meshsim.sim.schedule.ops import Schedule
from meshsim.sim.schedule.stamped_ops import op_column
from meshsim.sim.schedule.stencil import STREAM_INDEX
from meshsim.sim.schedule.tiling import NONE

_DP = STREAM_INDEX.get("dp_comm", -1)


@dataclass(frozen=True, eq=False)
class RowFields:
    """Per row of one rank's EventRows: its op's layer and micro-batch (int64, NONE: None), phase (a code,
    `phases[code]` the phase) and stream (its index in STREAMS); the rows, and the schedule of each stage."""

    rows: object
    layer: np.ndarray
    micro_batch: np.ndarray
    phase: np.ndarray
    phases: tuple[str, ...]
    stream: np.ndarray
    stage: np.ndarray
    index: np.ndarray
    schedules: dict[int, Schedule]


def row_fields(rows, schedules: Sequence[Schedule]) -> RowFields | None:
    """The rows' op fields from `schedules`' columns, or None when the rows are not an EventRows or a stage
    they touch has no schedule among `schedules` (by its ops' identity) with tiled arrays and fields."""
    if not is_rows(rows):
        return None
    stage = np.asarray(rows.stage_arr, np.int64)
    index = np.asarray(rows.op_index_arr, np.int64)
    n = len(stage)
    layer, mb = np.empty(n, np.int64), np.empty(n, np.int64)
    phase, stream = np.empty(n, np.int64), np.empty(n, np.int64)
    phases: dict[str, int] = {}
    found: dict[int, Schedule] = {}
    for s in distinct_ints(stage):
        sched = next((x for x in schedules if x.ops is rows.ops[s]), None)
        if sched is None or sched.fields is None or sched.tiled_arrays is None:
            return None
        found[s] = sched
        f, at = sched.fields, index[stage == s]
        mask = stage == s
        layer[mask], mb[mask] = f.layer[at], f.micro_batch[at]
        codes = np.array([phases.setdefault(p, len(phases)) for p in f.phases], np.int64)
        phase[mask] = codes[np.asarray(f.phase, np.int64)[at]] if len(codes) else 0
        stream[mask] = np.asarray(sched.tiled_arrays.stream, np.int64)[at]
    return RowFields(rows, layer, mb, phase, tuple(phases), stream, stage, index, found)


def middle_layer(f: RowFields) -> int | None:
    """breakdown.middle_layer: the middle of the sorted distinct layers (None when no op has one)."""
    layers = distinct_ints(f.layer[f.layer != NONE])
    return layers[len(layers) // 2] if layers else None


def layer_span_ms(f: RowFields, layer: int | None, phases: tuple[str, ...]) -> float:
    """breakdown.layer_span_ms: span (ms) of the ops of `layer` in `phases`, not on the DP stream, of
    micro-batch 0 (all of them if none is)."""
    if layer is None or not len(f.layer):
        return 0.0
    codes = [code for code, name in enumerate(f.phases) if name in phases]
    sel = (f.layer == layer) & np.isin(f.phase, codes) & (f.stream != _DP)
    first = sel & (f.micro_batch == 0)
    sel = first if first.any() else sel
    if not sel.any():
        return 0.0
    cols = f.rows.columns
    return (float(cols.end_s[sel].max()) - float(cols.start_s[sel].min())) * 1e3


def ep_op_mask(ops: Sequence) -> np.ndarray:
    """Per op: op.name.split(".", 2)[-1] in EP_OPS, from the names' parts (a StampedOps' name_parts: prefix +
    suffix == name; else "" + name). That text ends the name, so only a name ending in one of EP_OPS passes;
    a suffix at least as long as every one of them ends the name in one exactly when it ends in one itself.
    So only the ops whose suffix ends in one, or is shorter than the longest, are tested, on the whole name;
    each distinct suffix is looked at once."""
    parts = getattr(ops, "name_parts", None)
    prefixes, suffixes = parts() if parts is not None else ([""] * len(ops), op_column(ops, "name"))
    longest = max(map(len, bd.EP_OPS))
    maybe = {x: x.endswith(bd.EP_OPS) or len(x) < longest for x in dict.fromkeys(suffixes)}
    at = np.flatnonzero(np.fromiter(map(maybe.__getitem__, suffixes), bool, len(suffixes)))
    mask = np.zeros(len(suffixes), bool)
    mask[at] = [(prefixes[i] + suffixes[i]).split(".", 2)[-1] in bd.EP_OPS for i in at.tolist()]
    return mask


def ep_layer_ms(f: RowFields) -> dict[str, float]:
    """breakdown.ep_layer_ms: the rows whose op has a layer and whose name's text after its second dot is
    one of EP_OPS (ep_op_mask), then the same computation."""
    keep = np.zeros(len(f.stage), bool)
    for s, sched in f.schedules.items():
        ep_op = ep_op_mask(sched.ops)
        if not ep_op.any():
            continue
        mask = f.stage == s
        keep[mask] = ep_op[f.index[mask]]
    keep &= f.layer != NONE
    if not keep.any():
        return {}
    return bd.ep_layer_of(list(f.rows.take(np.flatnonzero(keep))))
