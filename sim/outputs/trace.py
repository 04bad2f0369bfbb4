"""Chrome / Perfetto trace JSON of an event log (open in https://ui.perfetto.dev or chrome://tracing).

Format (Trace Event Format): {"traceEvents": [...], "displayTimeUnit": "ms"}; complete events
(ph "X") with `ts` / `dur` in microseconds; one process (pid) per rank, one thread (tid) per stream,
named by metadata events (ph "M"). A collective's rendezvous wait is a child slice "wait" nested at its
start. The critical path is marked with a `critical` arg and with flow arrows (ph "s" -> "f", shared id,
bp "e") chaining consecutive critical-path slices.

Times are rounded to whole nanoseconds before conversion, so back-to-back slices on one stream share
their boundary exactly and slices on a thread nest or are disjoint, never partially overlap.

An extrapolated step (sim/results/steady_state.py) holds the simulated micro-batches only: a slice per rank on
a "steady state" thread covers the periods that were extrapolated, and the ops after them sit where the
whole step would put them. write_trace streams the document to disk in batches.

Reusable: `trace_events(..., pid_offset=, process_prefix=, flow_id_base=)` lets validate/ put a
measured run and a simulated one side by side in one trace (`trace_document(a + b)`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.results.critical_path import critical_ops

TID = {stream: i + 1 for i, stream in enumerate(STREAMS)}
STEADY_TID = len(STREAMS) + 1  # the thread summarising extrapolated steady-state periods
BATCH = 4096  # trace events encoded per write


def _ns(t_s: float) -> int:
    """Seconds -> whole nanoseconds (times are >= 0; int(x + 0.5) is round() at a third of the cost)."""
    return int(t_s * 1e9 + 0.5)


def _metadata(pid: int, rank: int, process_prefix: str, streams: Iterable[str]) -> list[dict]:
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": f"{process_prefix} rank {rank}".strip()}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for stream in streams:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": TID[stream], "args": {"name": stream}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": TID[stream],
                    "args": {"sort_index": TID[stream]}})
    return out


def _slices(ev: Event, pid: int, critical: bool) -> list[dict]:
    start_ns, end_ns = _ns(ev.start_s), _ns(ev.end_s)
    tid = TID[ev.stream]
    op = {"name": ev.name, "cat": ev.category, "ph": "X", "ts": start_ns / 1e3, "dur": (end_ns - start_ns) / 1e3,
          "pid": pid, "tid": tid,
          "args": {"op": ev.op_id, "category": ev.category, "phase": ev.phase, "layer": ev.layer,
                   "micro_batch": ev.micro_batch, "bytes": ev.bytes, "flops": ev.flops, "critical": critical}}
    if ev.wait_s <= 0:
        return [op]
    op["args"]["wait_us"] = ev.wait_s * 1e6
    wait_ns = min(_ns(ev.start_s + ev.wait_s), end_ns) - start_ns
    kind = "pipeline_bubble" if ev.stream == "pp_comm" else "waiting"  # a P2P waiting for its neighbour
    wait = {"name": "pipeline bubble" if kind == "pipeline_bubble" else "wait", "cat": kind, "ph": "X",
            "ts": start_ns / 1e3, "dur": wait_ns / 1e3, "pid": pid, "tid": tid,
            "args": {"op": ev.op_id, "category": kind, "peer": ev.peer}}
    return [op, wait]


def _flows(path: Sequence[Mapping], by_key: Mapping[tuple[int, int], Event], pid_offset: int,
           flow_id_base: int) -> list[dict]:
    """Arrows between consecutive critical-path op slices (waiting segments have no slice)."""
    chain = [by_key[(s["rank"], s["op_id"])] for s in path
             if s.get("op_id") is not None and (s["rank"], s["op_id"]) in by_key]
    out = []
    for i, (a, b) in enumerate(zip(chain, chain[1:], strict=False)):
        fid = flow_id_base + i + 1
        common = {"name": "critical path", "cat": "critical", "id": fid}
        out.append({**common, "ph": "s", "ts": _ns(a.start_s) / 1e3, "pid": pid_offset + a.rank, "tid": TID[a.stream]})
        out.append({**common, "ph": "f", "bp": "e", "ts": _ns(b.start_s) / 1e3, "pid": pid_offset + b.rank,
                    "tid": TID[b.stream]})
    return out


def _steady_state_slices(ranks: Iterable[int], steady_state: Mapping | None, pid_offset: int) -> list[dict]:
    """One slice per rank on its own thread covering the periods that were extrapolated, not simulated."""
    if not steady_state or not steady_state.get("periods"):
        return []
    start_ns = _ns(steady_state["gap_start_s"])
    dur_ns = _ns(steady_state["gap_start_s"] + steady_state["periods"] * steady_state["period_s"]) - start_ns
    label = (f"{steady_state['periods']} x {steady_state['period_s'] * 1e3:.4g} ms periods "
             f"({steady_state['periods'] * steady_state['unit']} micro-batches) extrapolated")
    out = []
    for rank in ranks:
        pid = pid_offset + rank
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": STEADY_TID, "args": {"name": "steady state"}})
        out.append({"name": label, "cat": "extrapolated", "ph": "X", "ts": start_ns / 1e3, "dur": dur_ns / 1e3,
                    "pid": pid, "tid": STEADY_TID, "args": dict(steady_state)})
    return out


def iter_trace_events(events: Sequence[Event], critical_path: Sequence[Mapping] = (), *, pid_offset: int = 0,
                      process_prefix: str = "sim", flow_id_base: int = 0,
                      steady_state: Mapping | None = None) -> Iterator[dict]:
    """The trace events one at a time (metadata, slices, steady-state summary, critical-path flows)."""
    crit = critical_ops(critical_path)
    streams: dict[int, set[str]] = {}
    for ev in events:
        streams.setdefault(ev.rank, set()).add(ev.stream)
    for rank in sorted(streams):
        yield from _metadata(pid_offset + rank, rank, process_prefix, sorted(streams[rank], key=TID.get))
    for ev in events:
        yield from _slices(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in crit)
    yield from _steady_state_slices(sorted(streams), steady_state, pid_offset)
    by_key = {(ev.rank, ev.op_id): ev for ev in events}
    yield from _flows(critical_path, by_key, pid_offset, flow_id_base)


def trace_events(events: Iterable[Event], critical_path: Sequence[Mapping] = (), **kw) -> list[dict]:
    """Trace events of one run: pids are pid_offset + rank, processes named '<prefix> rank N'
    (kw: pid_offset, process_prefix, flow_id_base, steady_state)."""
    return list(iter_trace_events(list(events), critical_path, **kw))


def trace_document(trace_events_: list[dict]) -> dict:
    return {"traceEvents": trace_events_, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, events: Iterable[Event], critical_path: Sequence[Mapping] = (),
                **kw) -> Path:
    """Write the trace JSON of one run, streamed: events are encoded and written BATCH at a time, never
    held as one document (kw: pid_offset, process_prefix, flow_id_base, steady_state)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encode = json.JSONEncoder(separators=(",", ":")).encode
    with open(path, "w") as fh:
        fh.write('{"traceEvents":[')
        sep = ""
        for batch in _batches(iter_trace_events(list(events), critical_path, **kw)):
            fh.write(sep + encode(batch)[1:-1])
            sep = ","
        fh.write('],"displayTimeUnit":"ms"}')
    return path


def _batches(items: Iterator[dict]) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
