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
whole step would put them. write_trace streams the document to disk in batches.

Reusable: `trace_events(..., pid_offset=, process_prefix=, flow_id_base=)` lets validate/ put a
measured run and a simulated one side by side in one trace (`trace_document(a + b)`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from meshsim.sim.core.fmt import rank_label
from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.results.critical_path import critical_ops

TID = {stream: i + 1 for i, stream in enumerate(STREAMS)}
STEADY_TID = len(STREAMS) + 1  # the thread summarising extrapolated steady-state periods
BATCH = 4096  # trace events encoded per write


def _ns(t_s: float) -> int:
    """Seconds -> whole nanoseconds (times are >= 0; int(x + 0.5) is round() at a third of the cost)."""
    return int(t_s * 1e9 + 0.5)


def _metadata(pid: int, rank: int, process_prefix: str, streams: Iterable[str], config: Mapping | None = None
              ) -> list[dict]:
    name = rank_label(rank, config) if config else f"rank {rank}"
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": f"{process_prefix} {name}".strip()}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for stream in streams:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": TID[stream], "args": {"name": stream}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": TID[stream],
                    "args": {"sort_index": TID[stream]}})
    return out


def collective_args(row: Mapping[str, Any], ranks: Sequence[int] | None) -> dict[str, Any]:
    """PyTorch-profiler-style args of one collective (row: a result's collective row)."""
    return {"Collective name": row.get("op"), "Process Group Name": row.get("group"),
            "Process Group Ranks": list(ranks) if ranks is not None else None, "Group size": row.get("ranks"),
            "algorithm": row.get("algo"), "protocol": row.get("protocol"),
            "busbw (GB/s)": round(float(row.get("busbw_gbps", 0.0)), 3)}


def _slices(ev: Event, pid: int, critical: bool, info: Mapping[str, Any] | None = None, device: int = 0) -> list[dict]:
    start_ns, end_ns = _ns(ev.start_s), _ns(ev.end_s)
    tid = TID[ev.stream]
    args: dict[str, Any] = {"op": ev.op_id, "category": ev.category, "phase": ev.phase, "critical": critical,
                            "stream": tid, "correlation": ev.op_id, "device": device}
    args["layer"], args["micro_batch"] = ev.layer, ev.micro_batch
    for key, value in (("bytes", ev.bytes), ("flops", ev.flops)):
        if value:
            args[key] = value
    name = ev.name
    if ev.category != "compute":
        name = f"nccl:{(info or {}).get('Collective name') or 'collective'} {ev.name}"
        args.update(info or {})
    op = {"name": name, "cat": "kernel", "ph": "X", "ts": start_ns / 1e3, "dur": (end_ns - start_ns) / 1e3,
          "pid": pid, "tid": tid, "args": args}
    if ev.wait_s <= 0:
        return [op]
    op["args"]["wait_us"] = ev.wait_s * 1e6
    wait_ns = min(_ns(ev.start_s + ev.wait_s), end_ns) - start_ns
    kind = "pipeline_bubble" if ev.stream == "pp_comm" else "waiting"  # a P2P waiting for its neighbour
    wait = {"name": "pipeline bubble" if kind == "pipeline_bubble" else "wait", "cat": "wait", "ph": "X",
            "ts": start_ns / 1e3, "dur": wait_ns / 1e3, "pid": pid, "tid": tid,
            "args": {"op": ev.op_id, "category": kind, "peer": ev.peer}}
    return [op, wait]


def _flows(path: Sequence[Mapping], by_key: Mapping[tuple[int, int], Event], pid_offset: int,
           flow_id_base: int) -> list[dict]:
    """Arrows between consecutive critical-path op slices where the path changes lane (rank or stream);
    along one lane the `critical` arg says it and an arrow would add nothing but bytes."""
    chain = [by_key[(s["rank"], s["op_id"])] for s in path
             if s.get("op_id") is not None and (s["rank"], s["op_id"]) in by_key]
    hops = [(a, b) for a, b in zip(chain, chain[1:], strict=False) if (a.rank, a.stream) != (b.rank, b.stream)]
    out = []
    for i, (a, b) in enumerate(hops):
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


def _result_parts(result: Any) -> tuple[Mapping[int, Mapping], Mapping, Mapping | None]:
    """((rank, op id) -> collective row, (group kind, rank) -> ranks, config echo) of a StepResult, if given."""
    if result is None:
        return {}, {}, None
    return getattr(result, "op_collectives", {}), getattr(result, "rank_groups", {}), getattr(result, "config", None)


def iter_trace_events(events: Sequence[Event], critical_path: Sequence[Mapping] = (), *, pid_offset: int = 0,
                      process_prefix: str = "sim", flow_id_base: int = 0,
                      steady_state: Mapping | None = None, result: Any = None) -> Iterator[dict]:
    """The trace events one at a time (metadata, slices, steady-state summary, critical-path flows).
    `result` (the run's StepResult) adds collective args and mesh positions."""
    crit = critical_ops(critical_path)
    by_op, groups, config = _result_parts(result)
    if steady_state is None:
        steady_state = getattr(result, "steady_state", None)
    per_node = int(config.get("gpus_per_node", 0) or 0) if config else 0
    streams: dict[int, set[str]] = {}
    for ev in events:
        streams.setdefault(ev.rank, set()).add(ev.stream)
    for rank in sorted(streams):
        yield from _metadata(pid_offset + rank, rank, process_prefix, sorted(streams[rank], key=TID.get), config)
    infos: dict[tuple[int, int], dict] = {}  # (id of the collective row, rank) -> its args, shared
    for ev in events:
        row, info = by_op.get((ev.rank, ev.op_id)), None
        if row is not None:
            info = infos.get((id(row), ev.rank))
            if info is None:
                info = infos[(id(row), ev.rank)] = collective_args(row, groups.get((row.get("group"), ev.rank)))
        yield from _slices(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in crit, info,
                           ev.rank % per_node if per_node else ev.rank)
    yield from _steady_state_slices(sorted(streams), steady_state, pid_offset)
    by_key = {(ev.rank, ev.op_id): ev for ev in events}
    yield from _flows(critical_path, by_key, pid_offset, flow_id_base)


def trace_events(events: Iterable[Event], critical_path: Sequence[Mapping] = (), **kw) -> list[dict]:
    """Trace events of one run: pids are pid_offset + rank, processes named '<prefix> rank N (tp .., dp ..)'
    (kw: pid_offset, process_prefix, flow_id_base, steady_state, result)."""
    return list(iter_trace_events(list(events), critical_path, **kw))


def trace_document(trace_events_: list[dict], distributed: Mapping[str, Any] | None = None) -> dict:
    doc: dict[str, Any] = {"traceEvents": trace_events_, "displayTimeUnit": "ms"}
    if distributed:
        doc["distributedInfo"] = dict(distributed)
    return doc


def distributed_info(result: Any, rank: int = 0) -> dict[str, Any] | None:
    """HTA's `distributedInfo`: backend, the trace's (representative) rank and the world size."""
    config = getattr(result, "config", None)
    if not config:
        return None
    return {"backend": "nccl", "rank": rank, "world_size": config.get("gpus"), "simulated": True}


def write_trace(path: str | Path, events: Iterable[Event], critical_path: Sequence[Mapping] = (),
                **kw) -> Path:
    """Write the trace JSON of one run, streamed: events are encoded and written BATCH at a time, never
    held as one document (kw: pid_offset, process_prefix, flow_id_base, steady_state, result)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encode = json.JSONEncoder(separators=(",", ":")).encode
    with open(path, "w") as fh:
        fh.write('{"traceEvents":[')
        sep = ""
        for batch in _batches(iter_trace_events(list(events), critical_path, **kw)):
            fh.write(sep + encode(batch)[1:-1])
            sep = ","
        fh.write('],"displayTimeUnit":"ms"')
        info = distributed_info(kw.get("result"))
        fh.write(f',"distributedInfo":{json.dumps(info)}}}' if info else "}")
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
