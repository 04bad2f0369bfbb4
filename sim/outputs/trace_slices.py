"""One op of an event log as Chrome / Perfetto trace events: its slice (and rendezvous-wait child slice),
the arrows of the critical path, and the collective args (the format is in sim/outputs/trace.py).

Each comes twice, as dicts (`op_slices`, `flows`: trace_events, validate's merged traces) and as the
compact JSON text of the same dicts written straight from the event (`op_slices_json`, `flows_json`:
write_trace's stream, 3x cheaper than encoding the dicts); tests/test_outputs.py checks the two agree.
Times are rounded to whole nanoseconds (`ns`) before conversion to microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _ascii
from typing import Any

from meshsim.sim.engine.events import STREAMS, Event
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.results.records import CollectiveRow

TID = {stream: i + 1 for i, stream in enumerate(STREAMS)}
STEADY_TID = len(STREAMS) + 1  # the thread summarising extrapolated steady-state periods
# compact, as written; allow_nan=False: a non-finite number is refused, never written as Infinity / NaN
encode_json = json.JSONEncoder(separators=(",", ":"), check_circular=False, allow_nan=False).encode


def ns(t_s: float) -> int:
    """Seconds -> whole nanoseconds (times are >= 0; int(x + 0.5) is round() at a third of the cost)."""
    return int(t_s * 1e9 + 0.5)


def collective_args(row: CollectiveRow, ranks: Sequence[int] | None) -> dict[str, Any]:
    """PyTorch-profiler-style args of one collective (row: a result's collective row)."""
    return {"Collective name": row.op, "Process Group Name": row.group,
            "Process Group Ranks": list(ranks) if ranks is not None else None, "Group size": row.ranks,
            "algorithm": row.algo, "protocol": row.protocol, "busbw (GB/s)": round(float(row.busbw_gbps), 3)}


def op_slices(ev: Event, pid: int, critical: bool, info: Mapping[str, Any] | None = None, device: int = 0) -> list[dict]:
    start_ns, end_ns = ns(ev.start_s), ns(ev.end_s)
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
    wait_ns = min(ns(ev.start_s + ev.wait_s), end_ns) - start_ns
    kind = "pipeline_bubble" if ev.stream == "pp_comm" else "waiting"  # a P2P waiting for its neighbour
    wait = {"name": "pipeline bubble" if kind == "pipeline_bubble" else "wait", "cat": "wait", "ph": "X",
            "ts": start_ns / 1e3, "dur": wait_ns / 1e3, "pid": pid, "tid": tid,
            "args": {"op": ev.op_id, "category": kind, "peer": ev.peer}}
    return [op, wait]


def js(value: Any) -> str:
    """One scalar as json.dumps writes it (ints, finite floats and strings directly; the rest via json)."""
    cls = type(value)
    if cls is int:
        return int.__repr__(value)
    if cls is float and value - value == 0.0:  # finite
        return float.__repr__(value)
    if cls is str:
        return _ascii(value)
    return encode_json(value)


def op_slices_json(ev: Event, pid: int, critical: bool, info: Mapping[str, Any] | None, info_json: str,
                 device: int) -> str:
    """The JSON text of `op_slices(ev, pid, critical, info, device)` (comma-joined, same keys in the same
    order, same numbers), written from the event; `info_json` is info's members as JSON (",..." or "").
    ts and dur are finite floats (_ns fails on anything else), so repr is their JSON; the int and str
    fields take the same shortcut when they have exactly that type."""
    start_ns, end_ns = ns(ev.start_s), ns(ev.end_s)
    tid = TID[ev.stream]
    op_id, cat, phase, layer, mb = ev.op_id, ev.category, ev.phase, ev.layer, ev.micro_batch
    op_id = op_id if type(op_id) is int else js(op_id)
    args = (f'"op":{op_id},"category":{_ascii(cat) if type(cat) is str else js(cat)},'
            f'"phase":{_ascii(phase) if type(phase) is str else js(phase)},'
            f'"critical":{"true" if critical else "false"},"stream":{tid},"correlation":{op_id},'
            f'"device":{device if type(device) is int else js(device)},'
            f'"layer":{layer if type(layer) is int else js(layer)},'
            f'"micro_batch":{mb if type(mb) is int else js(mb)}')
    if ev.bytes:
        args += f',"bytes":{js(ev.bytes)}'
    if ev.flops:
        args += f',"flops":{js(ev.flops)}'
    name = ev.name
    if cat != "compute":
        name = f"nccl:{(info or {}).get('Collective name') or 'collective'} {ev.name}"
        args += info_json
    ts, where = repr(start_ns / 1e3), f'"pid":{pid if type(pid) is int else js(pid)},"tid":{tid}'
    op = f'{{"name":{js(name)},"cat":"kernel","ph":"X","ts":{ts},"dur":{(end_ns - start_ns) / 1e3!r},{where},'
    if ev.wait_s <= 0:
        return op + f'"args":{{{args}}}}}'
    args += f',"wait_us":{js(ev.wait_s * 1e6)}'
    wait_ns = min(ns(ev.start_s + ev.wait_s), end_ns) - start_ns
    bubble = ev.stream == "pp_comm"  # a P2P waiting for its neighbour
    wait = (f'{{"name":"{"pipeline bubble" if bubble else "wait"}","cat":"wait","ph":"X","ts":{ts},'
            f'"dur":{wait_ns / 1e3!r},{where},"args":{{"op":{op_id},'
            f'"category":"{"pipeline_bubble" if bubble else "waiting"}","peer":{js(ev.peer)}}}}}')
    return op + f'"args":{{{args}}}}},' + wait


def hops(path: Sequence[Segment], by_key: Mapping[tuple[int, int], Event]) -> list[tuple[Event, Event]]:
    """Consecutive critical-path ops (a, b) where the path changes lane (rank or stream): one arrow each;
    along one lane the `critical` arg says it and an arrow would add nothing but bytes."""
    chain = [by_key[(s.rank, s.op_id)] for s in path if s.op_id is not None and (s.rank, s.op_id) in by_key]
    return [(a, b) for a, b in zip(chain, chain[1:], strict=False) if (a.rank, a.stream) != (b.rank, b.stream)]


def flows(path: Sequence[Segment], by_key: Mapping[tuple[int, int], Event], pid_offset: int,
           flow_id_base: int) -> list[dict]:
    """Arrows (ph "s" -> "f") between the ops of each hop of the critical path (hops)."""
    out = []
    for i, (a, b) in enumerate(hops(path, by_key)):
        fid = flow_id_base + i + 1
        common = {"name": "critical path", "cat": "critical", "id": fid}
        out.append({**common, "ph": "s", "ts": ns(a.start_s) / 1e3, "pid": pid_offset + a.rank, "tid": TID[a.stream]})
        out.append({**common, "ph": "f", "bp": "e", "ts": ns(b.start_s) / 1e3, "pid": pid_offset + b.rank,
                    "tid": TID[b.stream]})
    return out


def flows_json(path: Sequence[Segment], by_key: Mapping[tuple[int, int], Event], pid_offset: int,
                flow_id_base: int) -> Iterator[str]:
    """The JSON texts of `flows`, written from the hops."""
    return hops_json(hops(path, by_key), pid_offset, flow_id_base)


def hops_json(pairs: Sequence[tuple[Event, Event]], pid_offset: int, flow_id_base: int) -> Iterator[str]:
    """The JSON texts of the arrows of these hops (flows_json's, from hops already found)."""
    for i, (a, b) in enumerate(pairs):
        common = f'{{"name":"critical path","cat":"critical","id":{js(flow_id_base + i + 1)},'
        yield (common + f'"ph":"s","ts":{js(ns(a.start_s) / 1e3)},"pid":{js(pid_offset + a.rank)},'
               f'"tid":{TID[a.stream]}}}')
        yield (common + f'"ph":"f","bp":"e","ts":{js(ns(b.start_s) / 1e3)},"pid":{js(pid_offset + b.rank)},'
               f'"tid":{TID[b.stream]}}}')
