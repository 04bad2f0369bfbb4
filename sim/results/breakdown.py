"""Where one rank's step time goes, from its event log (interval arithmetic on its streams).

Busy time per stream (the streams run concurrently, so these overlap and do not add up to the step):
- compute_busy, tp_comm_busy, dp_comm_busy (and pp_comm_busy with pipeline parallelism): union of that
  stream's slices (a collective's slice includes its rendezvous wait, during which the NCCL kernel
  occupies the stream; a P2P transfer counts from when both ends had posted).
What the compute stream does not do (these add up to compute_waiting = step - compute_busy, the time the
compute stream has nothing it may run):
- exposed_tp_comm = |tp U compute| - |compute|: TP communication runs while compute waits;
- exposed_dp_comm_only = |dp U tp U compute| - |tp U compute|: only DP communication runs (e.g. the
  distributed optimizer's parameter all-gathers, the gradient reduce-scatters);
- exposed_ep_comm (MoE layers): |ep U tp U compute| - |tp U compute|: the expert-parallel dispatch /
  combine (and expert-TP collectives) run while compute waits and no TP collective does; the DP term is
  then measured past them (|dp U ep U tp U compute| - |ep U tp U compute|);
- exposed_cp_comm (cp > 1): |cp U ep U tp U compute| - |ep U tp U compute|: context parallelism's KV ring,
  all-to-alls or KV all-gathers run while compute waits and no TP or EP collective does; the DP term is
  then measured past them too;
- exposed_pp_comm_only (pp > 1): only P2P transfers run;
- pipeline_bubble (pp > 1): nothing runs while the stage waits for a neighbour: while one of its P2P
  batches waits for the peer to post, and the tail from the rank's last op to the step's end;
- nothing_running: no stream busy otherwise.
exposed_comm = the sum of the exposed_* terms = |all comm U compute| - |compute|; compute_waiting_at_start is
the part of compute_waiting before the first compute op.
The partition of the step a report leads with is the critical path's (sim/results/critical_path.py):
its categories (compute, TP, DP, P2P communication, pipeline bubble, waiting) add up to the step.
Layer spans (layer_fwd_ms / layer_bwd_ms): first start to last end of one transformer layer's ops of
micro-batch 0 (compute and comm), for the middle layer of the model; DP traffic is not part of it (FSDP's
weight gathers, issued one block ahead, and gradient reduce-scatters: sim/schedule/fsdp_ops.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import eq, itemgetter, ne

import numpy as np

from meshsim.sim.engine.event_rows import is_rows
from meshsim.sim.engine.events import Event
from meshsim.sim.results.run_arrays import distinct_ints
from meshsim.sim.schedule.ops import STREAMS, Schedule
from meshsim.sim.schedule.stamped_ops import op_column

Interval = tuple[float, float]
# the keys of StepResult.breakdown_s: busy time per stream (they overlap), then the compute stream's waiting
BREAKDOWN_KEYS = ("compute_busy", "tp_comm_busy", "dp_comm_busy", "compute_waiting", "compute_waiting_at_start",
                  "exposed_comm", "exposed_tp_comm", "exposed_dp_comm_only", "nothing_running")
PIPELINE_BREAKDOWN_KEYS = BREAKDOWN_KEYS + ("pp_comm_busy", "exposed_pp_comm_only", "pipeline_bubble")
EP_BREAKDOWN_KEYS = ("ep_comm_busy", "exposed_ep_comm")  # present when the step has MoE layers
CP_BREAKDOWN_KEYS = ("cp_comm_busy", "exposed_cp_comm")  # present when cp > 1
# results written before these names: old key -> new key (read by compare and sweeps for old files)
LEGACY_KEYS = {"compute": "compute_busy", "tp_comm": "tp_comm_busy", "dp_comm": "dp_comm_busy",
               "pp_comm": "pp_comm_busy", "idle": "nothing_running"}


def upgrade_breakdown(old: Mapping[str, float], step_time_s: float) -> dict[str, float]:
    """A breakdown_s written with the old keys (compute, tp_comm, dp_comm, exposed_comm, idle, ...) -> the
    current keys; compute_waiting = step - compute busy; the part before the first op is unknown (0)."""
    if "compute_busy" in old:
        return dict(old)
    new = {LEGACY_KEYS.get(k, k): v for k, v in old.items()}
    new.setdefault("compute_waiting", max(0.0, step_time_s - new.get("compute_busy", 0.0)))
    new.setdefault("compute_waiting_at_start", 0.0)
    return new


def union_s(intervals: Iterable[Interval]) -> float:
    """Measure of the union of [start, end) intervals (union_of is the same over arrays)."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def union_of(starts: np.ndarray, ends: np.ndarray) -> float:
    """union_s of the intervals [starts[i], ends[i]): sorted by (start, end) as tuples sort, merged while a
    start is not past the running end (its running max), the merged lengths added left to right (the
    sequential float sum union_s always took: np.cumsum is sequential, unlike np.sum). A start is past
    the running end of all before it exactly when it is past its own merged run's (starts are sorted), so
    the running max over all of them marks the same runs."""
    if len(starts) == 0:
        return 0.0
    order = np.lexsort((ends, starts))
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)  # the running end after each interval
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    np.greater(s[1:], reach[:-1], out=new[1:])
    first = np.flatnonzero(new)
    return float(np.cumsum(np.maximum.reduceat(e, first) - s[first])[-1])


_STREAM, _START, _END, _WAIT = (itemgetter(i) for i in (3, 8, 9, 10))


def _row_codes(rows, names: dict[str, int], schedules: Sequence[Schedule] = ()) -> np.ndarray:
    """Each row's stream code, read off the ops of the stages its rows hold (an EventRows: no Event is
    built); new streams are added to `names`. A stage whose schedule is among `schedules` (by its ops'
    identity) with tiled arrays: its stream column (the index in STREAMS) mapped to `names`' codes."""
    stage = np.asarray(rows.stage_arr, np.int64)
    index = np.asarray(rows.op_index_arr, np.int64)
    code = np.empty(len(stage), np.int64)
    for s in distinct_ints(stage):
        sched = next((x for x in schedules if x.ops is rows.ops[s] and x.tiled_arrays is not None), None)
        if sched is not None:
            table = np.array([names.setdefault(stream, len(names)) for stream in STREAMS], np.int64)
            mask = stage == s
            code[mask] = table[np.asarray(sched.tiled_arrays.stream, np.int64)[index[mask]]]
            continue
        streams = op_column(rows.ops[s], "stream")
        for stream in dict.fromkeys(streams):  # new streams numbered in order of first appearance
            names.setdefault(stream, len(names))
        table = np.fromiter(map(names.__getitem__, streams), np.int64, len(streams))
        mask = stage == s
        code[mask] = table[index[mask]]
    return code


class _Slices:
    """A rank's events as arrays: each stream's busy slices (start, end) with end > start (a P2P batch
    from when both ends had posted), and the P2P batches' waits for their peer. Over an EventRows (the
    compiled core's log) the arrays are its columns and its ops' streams, the same values the Event
    tuples would carry; the stream codes' numbering differs, which no result depends on (codes are
    only looked up by name)."""

    def __init__(self, events: Iterable[Event], schedules: Sequence[Schedule] = ()):
        names = {"compute": 0, "tp_comm": 1, "dp_comm": 2, "pp_comm": 3}
        if is_rows(events):
            cols = events.columns
            start, self.end, self.wait = cols.start_s, cols.end_s, cols.wait_s
            self.code = _row_codes(events, names, schedules)
        else:
            events = list(events)
            n = len(events)
            streams = list(map(_STREAM, events))
            start = np.fromiter(map(_START, events), np.float64, n)
            self.end = np.fromiter(map(_END, events), np.float64, n)
            self.wait = np.fromiter(map(_WAIT, events), np.float64, n)
            for s in streams:
                names.setdefault(s, len(names))
            self.code = np.fromiter(map(names.__getitem__, streams), np.int64, n)
        self.names = names
        self.p2p = self.code == names["pp_comm"]
        self.start = start
        self.busy_start = np.where(self.p2p, start + self.wait, start)
        self.busy = self.end > self.busy_start

    def of(self, *streams: str) -> np.ndarray:
        """Mask of the busy slices of these streams."""
        want = [self.names[s] for s in streams if s in self.names]
        return self.busy & np.isin(self.code, want)

    def union(self, mask: np.ndarray, extra: tuple[np.ndarray, np.ndarray] | None = None) -> float:
        starts, ends = self.busy_start[mask], self.end[mask]
        if extra is not None:
            starts, ends = np.concatenate((starts, extra[0])), np.concatenate((ends, extra[1]))
        return union_of(starts, ends)

    def has(self, stream: str) -> bool:
        """Whether the stream has a busy slice (the dict of lists breakdown kept had it non-empty)."""
        return stream in self.names and bool(self.of(stream).any())


def _neighbour_waits(sl: _Slices, step_time_s: float) -> tuple[np.ndarray, np.ndarray]:
    """While a P2P batch waits for its peer to post, plus the tail from the rank's last op to the step end."""
    waiting = sl.p2p & (sl.wait > 0)
    starts, ends = sl.start[waiting], sl.start[waiting] + sl.wait[waiting]
    last_s = float(sl.end.max()) if len(sl.end) else 0.0
    if step_time_s > last_s:
        starts, ends = np.append(starts, last_s), np.append(ends, step_time_s)
    return starts, ends


def breakdown(events: Iterable[Event], step_time_s: float, *, pipeline: bool = False,
              schedules: Sequence[Schedule] = ()) -> dict[str, float]:
    """BREAKDOWN_KEYS (PIPELINE_BREAKDOWN_KEYS with `pipeline`) in seconds for the events of one rank
    (`schedules`: those its ops belong to, whose stream columns it then reads: the same streams)."""
    sl = _Slices(events, schedules)
    compute = sl.of("compute")
    ep, cp = sl.has("ep_comm"), sl.has("cp_comm")
    comm = ("tp_comm",) + (("ep_comm",) if ep else ()) + (("cp_comm",) if cp else ())
    busy_compute = sl.union(compute)
    with_tp = sl.union(sl.of("compute", "tp_comm"))
    with_ep = sl.union(sl.of("compute", "tp_comm", "ep_comm")) if ep else with_tp
    with_cp = sl.union(sl.of("compute", *comm)) if cp else with_ep
    with_dp = sl.union(sl.of("compute", "dp_comm", *comm))
    all_busy = sl.union(sl.busy)
    first_compute_s = float(sl.busy_start[compute].min()) if compute.any() else step_time_s
    out = {"compute_busy": busy_compute, "tp_comm_busy": sl.union(sl.of("tp_comm")),
           "dp_comm_busy": sl.union(sl.of("dp_comm")),
           "compute_waiting": max(0.0, step_time_s - busy_compute), "compute_waiting_at_start": first_compute_s,
           "exposed_comm": all_busy - busy_compute, "exposed_tp_comm": with_tp - busy_compute,
           "exposed_dp_comm_only": with_dp - with_cp}
    if ep:
        out.update(ep_comm_busy=sl.union(sl.of("ep_comm")), exposed_ep_comm=with_ep - with_tp)
    if cp:
        out.update(cp_comm_busy=sl.union(sl.of("cp_comm")), exposed_cp_comm=with_cp - with_ep)
    if not pipeline:
        return {**out, "nothing_running": max(0.0, step_time_s - all_busy)}
    with_gaps = sl.union(sl.busy, _neighbour_waits(sl, step_time_s))
    return {**out, "pp_comm_busy": sl.union(sl.of("pp_comm")), "exposed_pp_comm_only": all_busy - with_dp,
            "pipeline_bubble": with_gaps - all_busy, "nothing_running": max(0.0, step_time_s - with_gaps)}


def op_fields(rows, name: str) -> list:
    """Each row's op field `name` (an EventRows: read off the ops of its stages, no Event built)."""
    stage, index = rows.stage_arr, rows.op_index_arr
    stages = distinct_ints(stage)
    if len(stages) == 1:
        return list(map(op_column(rows.ops[stages[0]], name).__getitem__, index.tolist()))
    out = np.empty(len(stage), object)
    for s in stages:
        table = np.empty(len(rows.ops[s]), object)
        table[:] = op_column(rows.ops[s], name)
        mask = stage == s
        out[mask] = table[index[mask]]
    return out.tolist()


def middle_layer(events: Iterable[Event]) -> int | None:
    if is_rows(events):  # the same set of layers, read off the ops
        layers = sorted(set(op_fields(events, "layer")) - {None})
    else:
        layers = sorted({ev.layer for ev in events if ev.layer is not None})
    return layers[len(layers) // 2] if layers else None


def layer_span_ms(events: Iterable[Event], layer: int | None, phases: tuple[str, ...]) -> float:
    """Span (ms) of the ops of `layer` in `phases`, micro-batch 0 (all of them if none is numbered)."""
    if is_rows(events):
        return _layer_span_rows_ms(events, layer, phases)
    sel = [ev for ev in events if ev.layer == layer and ev.phase in phases and ev.stream != "dp_comm"]
    sel = [ev for ev in sel if ev.micro_batch == 0] or sel
    if layer is None or not sel:
        return 0.0
    return (max(ev.end_s for ev in sel) - min(ev.start_s for ev in sel)) * 1e3


def _layer_span_rows_ms(rows, layer: int | None, phases: tuple[str, ...]) -> float:
    """layer_span_ms over an EventRows: the same selection as boolean masks over its op fields; max and min
    of the selected times are exact in any order."""
    if layer is None or not len(rows):
        return 0.0
    layers, mbs = op_fields(rows, "layer"), op_fields(rows, "micro_batch")
    sel = np.fromiter(map(eq, layers, repeat(layer)), bool, len(layers))
    sel &= np.fromiter(map(phases.__contains__, op_fields(rows, "phase")), bool, len(layers))
    sel &= np.fromiter(map(ne, op_fields(rows, "stream"), repeat("dp_comm")), bool, len(layers))
    first = sel & np.fromiter(map(eq, mbs, repeat(0)), bool, len(mbs))
    sel = first if first.any() else sel
    if not sel.any():
        return 0.0
    cols = rows.columns
    return (float(cols.end_s[sel].max()) - float(cols.start_s[sel].min())) * 1e3


EP_OPS = ("fwd.dispatch", "fwd.combine", "bwd.dispatch", "bwd.combine")  # op types (sim/schedule/op_keys.py)


def ep_layer_ms(events: Iterable[Event]) -> dict[str, float]:
    """One MoE layer's token all-to-alls (ms, rendezvous wait excluded): the middle layer that has them,
    micro-batch 0, per op type of EP_OPS ({} for a model without them)."""
    if is_rows(events):  # the same rows, selected off the ops' columns: only theirs are built as Events
        keep = [i for i, (name, layer) in enumerate(zip(op_fields(events, "name"), op_fields(events, "layer"),
                                                         strict=True))
                if layer is not None and name.split(".", 2)[-1] in EP_OPS]
        ep = list(events.take(keep)) if keep else []
    else:
        ep = [ev for ev in events if ev.layer is not None and ev.name.split(".", 2)[-1] in EP_OPS]
    return ep_layer_of(ep)


def ep_layer_of(ep: list[Event]) -> dict[str, float]:
    """ep_layer_ms of the events it selected (those of an op of EP_OPS with a layer)."""
    layer = middle_layer(ep)
    sel = [ev for ev in ep if ev.layer == layer]
    sel = [ev for ev in sel if ev.micro_batch == 0] or sel
    out: dict[str, float] = {}
    for ev in sel:
        key = ev.name.split(".", 2)[-1]
        out[key] = out.get(key, 0.0) + (ev.dur_s - ev.wait_s) * 1e3
    return {k: out[k] for k in EP_OPS if k in out}
