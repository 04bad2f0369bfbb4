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
from itertools import islice
from json.encoder import encode_basestring_ascii as _ascii
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import CommandFailed
from meshsim.sim.core.outfiles import open_own_for_writing
from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.results.critical_path import Segment, critical_ops
from meshsim.sim.results.records import CollectiveRow, ConfigEcho
from meshsim.sim.results.steady_state import SteadyState
from meshsim.sim.results.step_result import StepResult

TID = {stream: i + 1 for i, stream in enumerate(STREAMS)}
STEADY_TID = len(STREAMS) + 1  # the thread summarising extrapolated steady-state periods
BATCH = 4096  # trace events encoded per write
# compact, as written; allow_nan=False: a non-finite number is refused, never written as Infinity / NaN
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False, allow_nan=False).encode


def _ns(t_s: float) -> int:
    """Seconds -> whole nanoseconds (times are >= 0; int(x + 0.5) is round() at a third of the cost)."""
    return int(t_s * 1e9 + 0.5)


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


def collective_args(row: CollectiveRow, ranks: Sequence[int] | None) -> dict[str, Any]:
    """PyTorch-profiler-style args of one collective (row: a result's collective row)."""
    return {"Collective name": row.op, "Process Group Name": row.group,
            "Process Group Ranks": list(ranks) if ranks is not None else None, "Group size": row.ranks,
            "algorithm": row.algo, "protocol": row.protocol, "busbw (GB/s)": round(float(row.busbw_gbps), 3)}


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


def _js(value: Any) -> str:
    """One scalar as json.dumps writes it (ints, finite floats and strings directly; the rest via json)."""
    cls = type(value)
    if cls is int:
        return int.__repr__(value)
    if cls is float and value - value == 0.0:  # finite
        return float.__repr__(value)
    if cls is str:
        return _ascii(value)
    return _ENCODE(value)


def _slices_json(ev: Event, pid: int, critical: bool, info: Mapping[str, Any] | None, info_json: str,
                 device: int) -> str:
    """The JSON text of `_slices(ev, pid, critical, info, device)` (comma-joined, same keys in the same
    order, same numbers), written from the event; `info_json` is info's members as JSON (",..." or "").
    ts and dur are finite floats (_ns fails on anything else), so repr is their JSON; the int and str
    fields take the same shortcut when they have exactly that type."""
    start_ns, end_ns = _ns(ev.start_s), _ns(ev.end_s)
    tid = TID[ev.stream]
    op_id, cat, phase, layer, mb = ev.op_id, ev.category, ev.phase, ev.layer, ev.micro_batch
    op_id = op_id if type(op_id) is int else _js(op_id)
    args = (f'"op":{op_id},"category":{_ascii(cat) if type(cat) is str else _js(cat)},'
            f'"phase":{_ascii(phase) if type(phase) is str else _js(phase)},'
            f'"critical":{"true" if critical else "false"},"stream":{tid},"correlation":{op_id},'
            f'"device":{device if type(device) is int else _js(device)},'
            f'"layer":{layer if type(layer) is int else _js(layer)},'
            f'"micro_batch":{mb if type(mb) is int else _js(mb)}')
    if ev.bytes:
        args += f',"bytes":{_js(ev.bytes)}'
    if ev.flops:
        args += f',"flops":{_js(ev.flops)}'
    name = ev.name
    if cat != "compute":
        name = f"nccl:{(info or {}).get('Collective name') or 'collective'} {ev.name}"
        args += info_json
    ts, where = repr(start_ns / 1e3), f'"pid":{pid if type(pid) is int else _js(pid)},"tid":{tid}'
    op = f'{{"name":{_js(name)},"cat":"kernel","ph":"X","ts":{ts},"dur":{(end_ns - start_ns) / 1e3!r},{where},'
    if ev.wait_s <= 0:
        return op + f'"args":{{{args}}}}}'
    args += f',"wait_us":{_js(ev.wait_s * 1e6)}'
    wait_ns = min(_ns(ev.start_s + ev.wait_s), end_ns) - start_ns
    bubble = ev.stream == "pp_comm"  # a P2P waiting for its neighbour
    wait = (f'{{"name":"{"pipeline bubble" if bubble else "wait"}","cat":"wait","ph":"X","ts":{ts},'
            f'"dur":{wait_ns / 1e3!r},{where},"args":{{"op":{op_id},'
            f'"category":"{"pipeline_bubble" if bubble else "waiting"}","peer":{_js(ev.peer)}}}}}')
    return op + f'"args":{{{args}}}}},' + wait


def _hops(path: Sequence[Segment], by_key: Mapping[tuple[int, int], Event]) -> list[tuple[Event, Event]]:
    """Consecutive critical-path ops (a, b) where the path changes lane (rank or stream): one arrow each;
    along one lane the `critical` arg says it and an arrow would add nothing but bytes."""
    chain = [by_key[(s.rank, s.op_id)] for s in path if s.op_id is not None and (s.rank, s.op_id) in by_key]
    return [(a, b) for a, b in zip(chain, chain[1:], strict=False) if (a.rank, a.stream) != (b.rank, b.stream)]


def _flows(path: Sequence[Segment], by_key: Mapping[tuple[int, int], Event], pid_offset: int,
           flow_id_base: int) -> list[dict]:
    """Arrows (ph "s" -> "f") between the ops of each hop of the critical path (_hops)."""
    out = []
    for i, (a, b) in enumerate(_hops(path, by_key)):
        fid = flow_id_base + i + 1
        common = {"name": "critical path", "cat": "critical", "id": fid}
        out.append({**common, "ph": "s", "ts": _ns(a.start_s) / 1e3, "pid": pid_offset + a.rank, "tid": TID[a.stream]})
        out.append({**common, "ph": "f", "bp": "e", "ts": _ns(b.start_s) / 1e3, "pid": pid_offset + b.rank,
                    "tid": TID[b.stream]})
    return out


def _flows_json(path: Sequence[Segment], by_key: Mapping[tuple[int, int], Event], pid_offset: int,
                flow_id_base: int) -> Iterator[str]:
    """The JSON texts of `_flows`, written from the hops."""
    for i, (a, b) in enumerate(_hops(path, by_key)):
        common = f'{{"name":"critical path","cat":"critical","id":{_js(flow_id_base + i + 1)},'
        yield (common + f'"ph":"s","ts":{_js(_ns(a.start_s) / 1e3)},"pid":{_js(pid_offset + a.rank)},'
               f'"tid":{TID[a.stream]}}}')
        yield (common + f'"ph":"f","bp":"e","ts":{_js(_ns(b.start_s) / 1e3)},"pid":{_js(pid_offset + b.rank)},'
               f'"tid":{TID[b.stream]}}}')


def _steady_state_slices(ranks: Iterable[int], steady_state: SteadyState | None, pid_offset: int) -> list[dict]:
    """One slice per rank on its own thread covering the periods that were extrapolated, not simulated."""
    if steady_state is None or not steady_state.periods:
        return []
    ss = steady_state
    start_ns = _ns(ss.gap_start_s)
    dur_ns = _ns(ss.gap_start_s + ss.periods * ss.period_s) - start_ns
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
            found = self._infos[key] = (info, ("," + _ENCODE(info)[1:-1]) if info else "")
        return found

    def device(self, ev: Event) -> int:
        return ev.rank % self.per_node if self.per_node else ev.rank

    def head(self, pid_offset: int, process_prefix: str) -> Iterator[dict]:
        for rank in sorted(self.streams):
            yield from _metadata(pid_offset + rank, rank, process_prefix, sorted(self.streams[rank], key=TID.get),
                                 self.config)


def _by_key(events: Iterable[Event]) -> dict[tuple[int, int], Event]:
    return {(ev.rank, ev.op_id): ev for ev in events}


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
        yield from _slices(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in ctx.crit, ctx.info(ev)[0],
                           ctx.device(ev))
    yield from _steady_state_slices(sorted(ctx.streams), steady_state, pid_offset)
    yield from _flows(critical_path, _by_key(events), pid_offset, flow_id_base)


def iter_trace_json(events: Sequence[Event], critical_path: Sequence[Segment] = (), *, pid_offset: int = 0,
                    process_prefix: str = "sim", flow_id_base: int = 0,
                    steady_state: SteadyState | None = None, result: StepResult | None = None) -> Iterator[str]:
    """iter_trace_events as compact JSON texts, the same bytes json writes for each dict; op slices are
    written straight from the event (_slices_json) without building their dicts (3x cheaper)."""
    if steady_state is None and result is not None:
        steady_state = result.steady_state
    ctx = _Context(events, critical_path, result)
    yield from map(_ENCODE, ctx.head(pid_offset, process_prefix))
    crit = ctx.crit
    for ev in events:
        info, info_json = ctx.info(ev)
        yield _slices_json(ev, pid_offset + ev.rank, (ev.rank, ev.op_id) in crit, info, info_json, ctx.device(ev))
    yield from map(_ENCODE, _steady_state_slices(sorted(ctx.streams), steady_state, pid_offset))
    yield from _flows_json(critical_path, _by_key(events), pid_offset, flow_id_base)


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


def write_trace(path: str | Path, events: Iterable[Event], critical_path: Sequence[Segment] = (),
                **kw) -> Path:
    """Write the trace JSON of one run, streamed: events are encoded and written BATCH at a time, never
    held as one document (kw: pid_offset, process_prefix, flow_id_base, steady_state, result)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = iter_trace_json(list(events), critical_path, **kw)
    try:
        with open_own_for_writing(path) as fh:  # never through a link made after the checks
            fh.write('{"traceEvents":[')
            batch = list(islice(texts, BATCH))
            while batch:
                fh.write(",".join(batch))
                batch = list(islice(texts, BATCH))
                if batch:
                    fh.write(",")
            fh.write('],"displayTimeUnit":"ms"')
            info = distributed_info(kw.get("result"))
            fh.write(f',"distributedInfo":{_ENCODE(info)}}}' if info else "}")
    except ValueError:  # _ENCODE met a non-finite number: no half-written trace is left behind
        path.unlink(missing_ok=True)
        raise CommandFailed(f"internal error: a non-finite number in the trace events; {path} was not "
                            "written (please report it)") from None
    return path
