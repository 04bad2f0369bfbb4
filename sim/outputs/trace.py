"""Chrome / Perfetto trace JSON of an event log (open in https://ui.perfetto.dev or chrome://tracing).

Format (Trace Event Format): {"traceEvents": [...], "displayTimeUnit": "ms", "distributedInfo": {...}};
complete events (ph "X") with `ts` / `dur` in microseconds; one process (pid) per rank, named with its
tp/dp/pp/node position, one thread (tid) per stream, named by metadata events (ph "M").

Fields as PyTorch profiler traces carry them, so that Holistic Trace Analysis and Perfetto queries work:
every op is `cat: "kernel"` with `args.stream` (= its tid), `args.device` (GPU index in its node) and
`args.correlation` (op id); a collective's name starts with "nccl:" and says which collective
("nccl:all_gather L0.mb0.fwd.attn_in"; HTA tells communication kernels by "nccl" in the name), and its
args carry "Collective name", "Process Group Name", "Process Group Ranks", "Group size", bytes,
algorithm, protocol and busbw (GB/s). `distributedInfo` gives backend, rank and world_size. Zero bytes
and FLOPs are left out. A collective's rendezvous wait is a child slice "wait" (`cat: "wait"`, not a
kernel) nested at its start. The critical path is marked with a `critical` arg and with flow arrows
(ph "s" -> "f", shared id, bp "e") where it moves from one lane (rank, stream) to another.

Times are rounded to whole nanoseconds before conversion, so back-to-back slices on one stream share
their boundary exactly and slices on a thread nest or are disjoint, never partially overlap.

An extrapolated step (sim/results/steady_state.py) holds the simulated micro-batches only: a slice per rank on
a "steady state" thread covers the periods that were extrapolated, and the ops after them sit where the
whole step would put them. write_trace streams the document to disk in batches; the compiled core's
EventRows is written from its arrays (sim/outputs/trace_rows.py, the C slice writer sim/outputs/_trace.pyx),
byte for byte the file the per-event Python writer here (the reference, and the fallback) writes.

One op's slices and the critical path's arrows, as dicts and as JSON text: sim/outputs/trace_slices.py.

Reusable: `trace_events(..., pid_offset=, process_prefix=, flow_id_base=)` lets validate/ put a
measured run and a simulated one side by side in one trace (`trace_document(a + b)`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import CommandFailed
from meshsim.sim.core.outfiles import open_own_for_writing
from meshsim.sim.engine.events import Event
from meshsim.sim.outputs import trace_rows
from meshsim.sim.outputs.trace_slices import (
    STEADY_TID,
    TID,
    collective_args,
    encode_json,
    flows,
    flows_json,
    hops_json,
    ns,
    op_slices,
    op_slices_json,
)
from meshsim.sim.results.critical_path import Segment, critical_ops
from meshsim.sim.results.records import CollectiveRow, ConfigEcho
from meshsim.sim.results.steady_state import SteadyState
from meshsim.sim.results.step_result import StepResult

BATCH = 4096  # trace events encoded per write


def _metadata(pid: int, rank: int, process_prefix: str, streams: Iterable[str], config: ConfigEcho | None = None
              ) -> list[dict]:
    name = config.rank_label(rank) if config is not None else f"rank {rank}"
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": f"{process_prefix} {name}".strip()}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for stream in streams:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": TID[stream], "args": {"name": stream}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": TID[stream],
                    "args": {"sort_index": TID[stream]}})
    return out


def _steady_state_slices(ranks: Iterable[int], steady_state: SteadyState | None, pid_offset: int) -> list[dict]:
    """One slice per rank on its own thread covering the periods that were extrapolated, not simulated."""
    if steady_state is None or not steady_state.periods:
        return []
    ss = steady_state
    start_ns = ns(ss.gap_start_s)
    dur_ns = ns(ss.gap_start_s + ss.periods * ss.period_s) - start_ns
    label = f"{ss.periods} x {ss.period_s * 1e3:.4g} ms periods ({ss.periods * ss.unit} micro-batches) extrapolated"
    out = []
    for rank in ranks:
        pid = pid_offset + rank
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": STEADY_TID, "args": {"name": "steady state"}})
        out.append({"name": label, "cat": "extrapolated", "ph": "X", "ts": start_ns / 1e3, "dur": dur_ns / 1e3,
                    "pid": pid, "tid": STEADY_TID, "args": ss.to_json()})
    return out


def _result_parts(result: StepResult | None) -> tuple[Mapping[tuple[int, int], CollectiveRow],
                                                     Mapping[tuple[str, int], tuple[int, ...]], ConfigEcho | None]:
    """((rank, op id) -> collective row, (group kind, rank) -> ranks, config echo) of a StepResult, if given."""
    if result is None:
        return {}, {}, None
    return result.op_collectives, result.rank_groups, result.config


class _Context:
    """What every slice of one run needs: the critical ops, collective rows, mesh positions and the
    collective args per (row, rank), built once and shared by the dict and the text encodings."""

    def __init__(self, events: Sequence[Event], critical_path: Sequence[Segment], result: StepResult | None) -> None:
        self.crit = critical_ops(critical_path)
        self.by_op, self.groups, self.config = _result_parts(result)
        self.per_node = (self.config.gpus_per_node or 0) if self.config is not None else 0
        self.streams: dict[int, set[str]] = {}
        for ev in events:
            self.streams.setdefault(ev.rank, set()).add(ev.stream)
        self._infos: dict[tuple[int, int], tuple[dict, str]] = {}  # (id of the row, rank) -> args, their JSON

    def info(self, ev: Event) -> tuple[dict | None, str]:
        """The collective args of `ev` (None for an op without a collective row) and their JSON members."""
        row = self.by_op.get((ev.rank, ev.op_id))
        if row is None:
            return None, ""
        key = (id(row), ev.rank)
        found = self._infos.get(key)
        if found is None:
            info = collective_args(row, self.groups.get((row.group, ev.rank)))
            found = self._infos[key] = (info, ("," + encode_json(info)[1:-1]) if info else "")
        return found

    def device(self, ev: Event) -> int:
        return ev.rank % self.per_node if self.per_node else ev.rank

    def head(self, pid_offset: int, process_prefix: str) -> Iterator[dict]:
        return _head(self.streams, self.config, pid_offset, process_prefix)


def _head(streams: Mapping[int, set[str]], config: ConfigEcho | None, pid_offset: int, process_prefix: str
          ) -> Iterator[dict]:
    """The metadata events of every rank (its process, its streams' threads), ranks in order."""
    for rank in sorted(streams):
        yield from _metadata(pid_offset + rank, rank, process_prefix, sorted(streams[rank], key=TID.get), config)


def _by_key(events: Iterable[Event], keys: set[tuple[int, int]]) -> dict[tuple[int, int], Event]:
    """(rank, op id) -> event for the critical path's ops only (`keys`: all the arrows look up), not a dict
    of every event of the step."""
    return {key: ev for ev in events if (key := (ev.rank, ev.op_id)) in keys}


def iter_trace_events(events: Sequence[Event], critical_path: Sequence[Segment] = (), *, pid_offset: int = 0,
                      process_prefix: str = "sim", flow_id_base: int = 0,
                      steady_state: SteadyState | None = None, result: StepResult | None = None) -> Iterator[dict]:
    """The trace events one at a time (metadata, slices, steady-state summary, critical-path flows).
    `result` (the run's StepResult) adds collective args and mesh positions."""
    if steady_state is None and result is not None:
        steady_state = result.steady_state
    ctx = _Context(events, critical_path, result)
    yield from ctx.head(pid_offset, process_prefix)
    for ev in events:
        yield from op_slices(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in ctx.crit, ctx.info(ev)[0],
                           ctx.device(ev))
    yield from _steady_state_slices(sorted(ctx.streams), steady_state, pid_offset)
    yield from flows(critical_path, _by_key(events, ctx.crit), pid_offset, flow_id_base)


def iter_trace_json(events: Sequence[Event], critical_path: Sequence[Segment] = (), *, pid_offset: int = 0,
                    process_prefix: str = "sim", flow_id_base: int = 0,
                    steady_state: SteadyState | None = None, result: StepResult | None = None) -> Iterator[str]:
    """iter_trace_events as compact JSON texts, the same bytes json writes for each dict; op slices are
    written straight from the event (op_slices_json) without building their dicts (3x cheaper)."""
    if steady_state is None and result is not None:
        steady_state = result.steady_state
    ctx = _Context(events, critical_path, result)
    yield from map(encode_json, ctx.head(pid_offset, process_prefix))
    crit = ctx.crit
    for ev in events:
        info, info_json = ctx.info(ev)
        yield op_slices_json(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in crit, info, info_json, ctx.device(ev))
    yield from map(encode_json, _steady_state_slices(sorted(ctx.streams), steady_state, pid_offset))
    yield from flows_json(critical_path, _by_key(events, ctx.crit), pid_offset, flow_id_base)


def trace_events(events: Iterable[Event], critical_path: Sequence[Segment] = (), **kw) -> list[dict]:
    """Trace events of one run: pids are pid_offset + rank, processes named '<prefix> rank N (tp .., dp ..)'
    (kw: pid_offset, process_prefix, flow_id_base, steady_state, result)."""
    return list(iter_trace_events(list(events), critical_path, **kw))


def trace_document(trace_events_: list[dict], distributed: Mapping[str, Any] | None = None) -> dict:
    doc: dict[str, Any] = {"traceEvents": trace_events_, "displayTimeUnit": "ms"}
    if distributed:
        doc["distributedInfo"] = dict(distributed)
    return doc


def distributed_info(result: StepResult | None, rank: int = 0) -> dict[str, Any] | None:
    """HTA's `distributedInfo`: backend, the trace's (representative) rank and the world size."""
    if result is None:
        return None
    return {"backend": "nccl", "rank": rank, "world_size": result.config.gpus, "simulated": True}


def _write_texts(fh, texts: Iterator[str], lead: bool = False) -> bool:
    """Write the texts comma-separated (after a "," when `lead`), BATCH at a time; whether any was written."""
    batch, wrote = list(islice(texts, BATCH)), False
    while batch:
        fh.write((("," if lead or wrote else "") + ",".join(batch)).encode("utf-8"))
        wrote = True
        batch = list(islice(texts, BATCH))
    return wrote


def _write_python(fh, events: Sequence[Event], critical_path: Sequence[Segment], kw: Mapping) -> None:
    """The trace's events the Python way (iter_trace_json): the reference."""
    _write_texts(fh, iter_trace_json(events, critical_path, **kw))


def _write_rows(fh, events, critical_path: Sequence[Segment], *, pid_offset: int = 0, process_prefix: str = "sim",
                flow_id_base: int = 0, steady_state: SteadyState | None = None,
                result: StepResult | None = None) -> None:
    """The trace's events from an EventRows' arrays (sim/outputs/trace_rows.py), the same bytes as
    _write_python: metadata, op slices (compiled), steady-state slices, flows."""
    if steady_state is None and result is not None:
        steady_state = result.steady_state
    ctx = trace_rows.RowsContext(events, critical_path, result)
    head = _write_texts(fh, map(encode_json, _head(ctx.streams, ctx.config, pid_offset, process_prefix)))
    lead = trace_rows.write_slices(fh, events, ctx, pid_offset, head) > 0 or head
    lead = _write_texts(fh, map(encode_json, _steady_state_slices(sorted(ctx.streams), steady_state, pid_offset)),
                        lead) or lead
    _write_texts(fh, hops_json(ctx.hops(events, critical_path), pid_offset, flow_id_base), lead)


def write_trace(path: str | Path, events: Iterable[Event], critical_path: Sequence[Segment] = (),
                **kw) -> Path:
    """Write the trace JSON of one run, streamed: events are encoded and written BATCH at a time, never
    held as one document (kw: pid_offset, process_prefix, flow_id_base, steady_state, result). An
    EventRows is written from its arrays by the compiled writer where it applies (trace_rows.applies),
    else, and wherever it meets a field it has no exact rule for, the Python way: the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    events = events if isinstance(events, Sequence) else list(events)
    try:
        with open_own_for_writing(path, "wb") as fh:  # never through a link made after the checks
            fh.write(b'{"traceEvents":[')
            try:
                if not trace_rows.applies(events, kw.get("pid_offset", 0)):
                    raise trace_rows.Fallback
                _write_rows(fh, events, critical_path, **kw)
            except trace_rows.Fallback:
                fh.seek(0)
                fh.truncate()
                fh.write(b'{"traceEvents":[')
                _write_python(fh, events, critical_path, kw)
            fh.write(b'],"displayTimeUnit":"ms"')
            info = distributed_info(kw.get("result"))
            fh.write(f',"distributedInfo":{encode_json(info)}}}'.encode() if info else b"}")
    except ValueError:  # encode_json met a non-finite number: no half-written trace is left behind
        path.unlink(missing_ok=True)
        raise CommandFailed(f"internal error: a non-finite number in the trace events; {path} was not "
                            "written (please report it)") from None
    return path
