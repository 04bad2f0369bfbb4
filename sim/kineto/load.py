"""One rank's Kineto trace file -> RankTrace (sim/kineto/records.py), streamed (sim/kineto/jsonstream.py).

Kept per event (everything else is dropped as it is read):
- GPU activity (ph "X", cat kernel / gpu_memcpy / gpu_memset): start, duration, device (pid), stream
  (args.stream, else tid), name, correlation, and the NCCL arguments PyTorch records on a collective's
  kernel (NCCL_ARGS) or a copy's bytes;
- host events (cat cpu_op / user_annotation / cuda_runtime / cuda_driver) on integer threads: start,
  duration, thread, name, correlation, `Input Dims` / `Input type`, and the collective args of
  `record_param_comms`;
- thread names (ph "M"), ProfilerStep#N spans (user_annotation), distributedInfo (rank, world size,
  backend, process groups) and deviceProperties (name, SM count).
Names are interned and shape tuples shared, so a name or shape repeated a million times is held once;
what is kept costs ~150 bytes per host event and ~200 per GPU event (benchmarks/trace_read.py).

A trace without GPU activity is a CPU run when it has host operators (torch.profiler on gloo, e.g.
`meshsim validate --trace` on CPU): its device events are then derived from the host
(sim/kineto/cpu_device.py). One with neither is refused (UserError, exit 2).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import UserError
from meshsim.sim.kineto.cpu_device import cpu_device_events
from meshsim.sim.kineto.jsonstream import FIX, Progress, iter_trace
from meshsim.sim.kineto.records import DeviceEvent, HostOp, RankTrace, Step

GPU_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
HOST_CATS = frozenset(("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"))
NCCL_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
             "Process Group Description", "Process Group Ranks", "bytes")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)


Window = tuple[float, float]  # [from, to] in the trace's us: events starting outside it are dropped


class _Collector:
    def __init__(self, window: Window | None = None) -> None:
        self.window = window
        self.device: list[DeviceEvent] = []
        self.host: list[HostOp] = []
        self.threads: dict[int, str] = {}
        self.members: dict[str, Any] = {}
        self.names: dict[str, str] = {}
        self.shapes: dict[tuple, tuple] = {}  # Input Dims / Input type tuples, each distinct one kept once
        self.count = 0

    def name(self, text: object) -> str:
        text = str(text)
        found = self.names.get(text)
        if found is None:
            found = self.names[text] = sys.intern(text)
        return found

    def add(self, ev: object) -> None:
        self.count += 1
        if not isinstance(ev, dict):
            return
        ph, cat = ev.get("ph"), ev.get("cat")
        if self.window is not None and ph == "X" and not self._inside(ev):
            return
        if ph == "X" and cat in GPU_CATS:
            self._device(ev, cat)
        elif ph == "X" and cat in HOST_CATS and type(ev.get("tid")) is int:
            self._host(ev, cat)
        elif ph == "M" and ev.get("name") == "thread_name" and type(ev.get("tid")) is int:
            self.threads[ev["tid"]] = str((ev.get("args") or {}).get("name", ""))

    def _inside(self, ev: dict) -> bool:
        ts = ev.get("ts")
        if not isinstance(ts, int | float):
            return False
        return self.window[0] <= ts <= self.window[1] or str(ev.get("name", "")).startswith("ProfilerStep#")

    def _device(self, ev: dict, cat: str) -> None:
        args = ev.get("args") or {}
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
            device, stream = int(ev.get("pid", 0)), int(args.get("stream", ev.get("tid", 0)))
        except (KeyError, TypeError, ValueError):
            return
        kept = {k: args[k] for k in NCCL_ARGS if k in args} or None
        corr = args.get("correlation", -1)
        self.device.append(DeviceEvent(ts, dur, device, stream, self.name(ev.get("name", "")), cat,
                                       corr if type(corr) is int else -1, kept))

    def _host(self, ev: dict, cat: str) -> None:
        args = ev.get("args") or {}
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        corr = args.get("correlation", -1)
        dims, types = args.get("Input Dims"), args.get("Input type")
        comm = {k: args[k] for k in NCCL_ARGS if k in args} or None
        self.host.append(HostOp(ts, dur, ev["tid"], self.name(ev.get("name", "")), cat,
                                corr if type(corr) is int else -1, self.shared(_frozen(dims)),
                                self.shared(_frozen(types)), comm))

    def shared(self, value: tuple) -> tuple:
        """One object per distinct tuple: a step repeats its shapes (hundreds of MB on a large trace)."""
        return self.shapes.setdefault(value, value) if value else ()


def _frozen(value: object) -> tuple:
    """A list of lists as nested tuples (hashable, compact); anything else (). The common case, a list
    of flat lists of ints, in one pass."""
    if type(value) is not list:
        return ()
    try:
        out = tuple(tuple(v) if type(v) is list else v for v in value)
        hash(out)
        return out
    except TypeError:  # a TensorList: lists nested deeper
        return tuple(_frozen(v) if type(v) is list else v for v in value)


def _steps(host: list[HostOp]) -> tuple[Step, ...]:
    found = {}
    for op in host:
        if op.cat == "user_annotation" and (m := STEP.match(op.name)):
            found.setdefault(int(m.group(1)), Step(int(m.group(1)), op.ts, op.dur))
    return tuple(sorted(found.values(), key=lambda s: s.ts))


def _rank(info: dict, path: Path) -> int:
    rank = info.get("rank")
    if type(rank) is int and rank >= 0:
        return rank
    m = RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else 0


def _device_figures(props: object, device: int) -> tuple[str, int | None]:
    rows = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    row = next((p for p in rows if p.get("id") == device), rows[0] if rows else {})
    sms = row.get("numSms")
    return str(row.get("name", "")), sms if type(sms) is int else None


def scan_steps(path: str | Path, progress: Progress | None = None) -> tuple[tuple[Step, ...], int]:
    """A first pass that keeps nothing but the ProfilerStep spans: (steps, events in the file)."""
    found, count = {}, 0
    for kind, ev in iter_trace(path, progress):
        if kind != "event":
            continue
        count += 1
        if isinstance(ev, dict) and ev.get("cat") == "user_annotation" and (m := STEP.match(str(ev.get("name")))):
            found.setdefault(int(m.group(1)), Step(int(m.group(1)), float(ev.get("ts", 0)), float(ev.get("dur", 0))))
    return tuple(sorted(found.values(), key=lambda st: st.ts)), count


def load_rank(path: str | Path, progress: Progress | None = None, window: Window | None = None) -> RankTrace:
    """Read one rank's trace (plain or gzip JSON) into a RankTrace; with `window`, only the events that
    start inside it (and every ProfilerStep span), so memory follows the window, not the file."""
    path = Path(path)
    col = _Collector(window)
    for kind, item in iter_trace(path, progress):
        if kind == "event":
            col.add(item)
        else:
            col.members[item[0]] = item[1]
    info = col.members.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    if "traceEvents" not in col.members and col.count == 0:
        raise UserError("trace", str(path), FIX, problem="No traceEvents in it (not a PyTorch profiler trace?)")
    host = sorted(col.host, key=lambda op: (op.tid, op.ts, -op.dur))
    device = sorted(col.device, key=lambda ev: (ev.ts, ev.stream))
    cpu = not device
    if cpu:
        device = cpu_device_events(host, col.threads)
    if not device:
        raise UserError("trace", str(path), "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] "
                        "so GPU kernels are recorded (docs/validate.md, 'Capturing a trace')",
                        problem=f"No GPU events (kernels, copies) in its {col.count:,} events, and no host "
                                "operators to treat the CPU as the device")
    name, sms = _device_figures(col.members.get("deviceProperties"), device[0].device if not cpu else 0)
    pgs = info.get("pg_config")
    return RankTrace(path=str(path), rank=_rank(info, path), world_size=info.get("world_size"),
                     backend=info.get("backend"), device_name=name or ("CPU" if cpu else "GPU"), sm_count=sms,
                     cpu_device=cpu, steps=_steps(host), device=tuple(device), host=tuple(host),
                     thread_names=col.threads, pg_config=tuple(p for p in pgs if isinstance(p, dict))
                     if isinstance(pgs, list) else (), events_read=col.count)
