"""Chrome / Perfetto trace JSON of an event log (open in https://ui.perfetto.dev or chrome://tracing).

Format (Trace Event Format): {"traceEvents": [...], "displayTimeUnit": "ms"}; complete events
(ph "X") with `ts` / `dur` in microseconds; one process (pid) per rank, one thread (tid) per stream,
named by metadata events (ph "M"). A collective's rendezvous wait is a child slice "wait" nested at its
start. The critical path is marked with a `critical` arg and with flow arrows (ph "s" -> "f", shared id,
bp "e") chaining consecutive critical-path slices.

Times are rounded to whole nanoseconds before conversion, so back-to-back slices on one stream share
their boundary exactly and slices on a thread nest or are disjoint, never partially overlap.

Reusable: `trace_events(..., pid_offset=, process_prefix=, flow_id_base=)` lets validate/ put a
measured run and a simulated one side by side in one trace (`trace_document(a + b)`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.results.critical_path import critical_ops

TID = {stream: i + 1 for i, stream in enumerate(STREAMS)}


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
    wait = {"name": "wait", "cat": "waiting", "ph": "X", "ts": start_ns / 1e3, "dur": wait_ns / 1e3,
            "pid": pid, "tid": tid, "args": {"op": ev.op_id, "category": "waiting", "peer": ev.peer}}
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


def trace_events(events: Iterable[Event], critical_path: Sequence[Mapping] = (), *, pid_offset: int = 0,
                 process_prefix: str = "sim", flow_id_base: int = 0) -> list[dict]:
    """Trace events of one run: pids are pid_offset + rank, processes named '<prefix> rank N'."""
    events = list(events)
    crit = critical_ops(critical_path)
    out: list[dict] = []
    streams: dict[int, set[str]] = {}
    for ev in events:
        streams.setdefault(ev.rank, set()).add(ev.stream)
    for rank in sorted(streams):
        out += _metadata(pid_offset + rank, rank, process_prefix, sorted(streams[rank], key=TID.get))
    for ev in events:
        out += _slices(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in crit)
    by_key = {(ev.rank, ev.op_id): ev for ev in events}
    out += _flows(critical_path, by_key, pid_offset, flow_id_base)
    return out


def trace_document(trace_events_: list[dict]) -> dict:
    return {"traceEvents": trace_events_, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, events: Iterable[Event], critical_path: Sequence[Mapping] = (),
                **kw) -> Path:
    """Write the trace JSON of one run (kw: pid_offset, process_prefix, flow_id_base)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = trace_document(trace_events(events, critical_path, **kw))
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path
