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
STEP = re.compile(r"^ProfilerStep#(\d{1,9})$")
RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)


Window = tuple[float, float]  # [from, to] in the trace's us: events starting outside it are dropped


MAX_NAME_CHARS = 16_384  # an event or thread name is kept to this many characters (C++ kernel names: ~2,000)
MAX_NAMES_CHARS = 1 << 28  # distinct names held, all together (256 Mi characters)
MAX_TIME_US = 1e18  # |ts| and dur (us; Kineto's ts are ~1.7e15 us since the epoch)
MAX_COUNT = 1 << 53  # an NCCL element / byte count or group size
MAX_RANKS_CHARS = 1 << 20  # a "Process Group Ranks" string
COUNT_ARGS = ("In msg nelems", "Out msg nelems", "Group size", "bytes")
TEXT_ARGS = ("Collective name", "dtype", "Process Group Name", "Process Group Description")


def _ranks_ok(value: object) -> bool:
    """A "Process Group Ranks" value PyTorch writes: a list of ints or its text ("[0, 1, 2]")."""
    if isinstance(value, list):
        return all(type(v) is int for v in value)
    return isinstance(value, str) and len(value) <= MAX_RANKS_CHARS and \
        all(len(d) <= 9 for d in re.findall(r"\d+", value))


class _Collector:
    """Keeps what the summary reads of each event (module docstring); every field it keeps is checked
    (a number where a number belongs, finite and in range; names cut to MAX_NAME_CHARS), and a bad one
    is one UserError naming the event, the field and the value."""

    def __init__(self, path: Path, window: Window | None = None) -> None:
        self.path, self.window = path, window
        self.device: list[DeviceEvent] = []
        self.host: list[HostOp] = []
        self.threads: dict[int, str] = {}
        self.members: dict[str, Any] = {}
        self.names: dict[str, str] = {}
        self.shapes: dict[tuple, tuple] = {}  # Input Dims / Input type tuples, each distinct one kept once
        self.checked_ranks: set[str] = set()
        self.count = self.name_chars = 0

    def refuse(self, field: str, value: object, what: str) -> UserError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return UserError("trace", str(self.path), FIX, problem=f"Event {self.count:,}: {field} is {shown}; {what}")

    def name(self, text: object) -> str:
        text = text if type(text) is str else str(text)
        found = self.names.get(text)
        if found is None:
            clean = text[:MAX_NAME_CHARS].encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> ?
            self.name_chars += len(clean)
            if self.name_chars > MAX_NAMES_CHARS:
                raise self.refuse("name", clean, f"the trace's distinct names exceed {MAX_NAMES_CHARS >> 20} Mi "
                                  "characters (README, Limits)")
            found = self.names[text if len(text) <= MAX_NAME_CHARS else clean] = sys.intern(clean)
        return found

    def time(self, ev: dict, key: str, default: float | None = None) -> float:
        value = ev.get(key, default)
        if type(value) not in (float, int) or not -MAX_TIME_US <= value <= MAX_TIME_US:
            raise self.refuse(key, value, f"Kineto writes a number of microseconds (at most {MAX_TIME_US:.0e})")
        if key == "dur" and value < 0:
            raise self.refuse(key, value, "a duration is not negative")
        return float(value)

    def comm_args(self, args: dict) -> dict | None:
        kept = {k: args[k] for k in NCCL_ARGS if k in args}
        if not kept:
            return None
        for k in COUNT_ARGS:
            v = kept.get(k)
            if v is not None and (type(v) is not int or not 0 <= v <= MAX_COUNT):
                raise self.refuse(f"args.{k!r}", v, f"PyTorch records a non-negative integer (at most {MAX_COUNT:,})")
        for k in TEXT_ARGS:
            if k in kept:
                kept[k] = self.name(kept[k])
        ranks = kept.get("Process Group Ranks")
        if ranks is not None and not (type(ranks) is str and ranks in self.checked_ranks):
            if not _ranks_ok(ranks):
                raise self.refuse("args.'Process Group Ranks'", ranks, "PyTorch records a list of ranks, e.g. "
                                  "[0, 1, 2, 3] (ranks of at most 9 digits)")
            if type(ranks) is str:
                self.checked_ranks.add(ranks)
        return kept

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
            args = ev.get("args")
            self.threads[ev["tid"]] = self.name(args.get("name", "")) if isinstance(args, dict) else ""

    def _inside(self, ev: dict) -> bool:
        ts = ev.get("ts")
        if type(ts) not in (float, int):
            return True  # kept, so that the check refuses it
        return self.window[0] <= ts <= self.window[1] or str(ev.get("name", "")).startswith("ProfilerStep#")

    def _device(self, ev: dict, cat: str) -> None:
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        ts, dur = self.time(ev, "ts"), self.time(ev, "dur", 0.0)
        device, stream = ev.get("pid", 0), args.get("stream", ev.get("tid", 0))
        if type(device) is not int or type(stream) is not int:
            return  # not a GPU's activity (Chrome-trace pids and tids may be names)
        kept = self.comm_args(args)
        corr = args.get("correlation", -1)
        self.device.append(DeviceEvent(ts, dur, device, stream, self.name(ev.get("name", "")), cat,
                                       corr if type(corr) is int else -1, kept))

    def _host(self, ev: dict, cat: str) -> None:
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        ts, dur = self.time(ev, "ts"), self.time(ev, "dur", 0.0)
        corr = args.get("correlation", -1)
        dims, types = args.get("Input Dims"), args.get("Input type")
        comm = self.comm_args(args)
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


def _distributed(info: object, path: Path) -> dict:
    """distributedInfo with its fields checked: rank and world_size integers, pg_config a list of dicts
    with integer pg_size; a wrong type is one UserError naming the field."""
    if not isinstance(info, dict):
        return {}
    for key, low in (("rank", 0), ("world_size", 1)):
        v = info.get(key)
        if v is not None and (type(v) is not int or not low <= v <= MAX_COUNT):
            raise UserError("trace", str(path), FIX, problem=f"distributedInfo.{key} is {str(v)[:60]!r}; "
                            f"PyTorch records an integer >= {low}")
    pgs = info.get("pg_config")
    rows = [p for p in pgs if isinstance(p, dict)] if isinstance(pgs, list) else []
    for p in rows:
        size = p.get("pg_size", 0)
        if type(size) is not int or not 0 <= size <= MAX_COUNT:
            raise UserError("trace", str(path), FIX, problem=f"distributedInfo.pg_config pg_size is "
                            f"{str(size)[:60]!r}; PyTorch records an integer")
    backend = info.get("backend")
    return {"rank": info.get("rank"), "world_size": info.get("world_size"), "pg_config": tuple(rows),
            "backend": str(backend)[:64] if backend is not None else None}


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
    return str(row.get("name", ""))[:200], sms if type(sms) is int and 0 < sms <= MAX_COUNT else None


def scan_steps(path: str | Path, progress: Progress | None = None) -> tuple[tuple[Step, ...], int]:
    """A first pass that keeps nothing but the ProfilerStep spans: (steps, events in the file)."""
    found, col = {}, _Collector(Path(path))
    for kind, ev in iter_trace(path, progress):
        if kind != "event":
            continue
        col.count += 1
        if isinstance(ev, dict) and ev.get("cat") == "user_annotation" and (m := STEP.match(str(ev.get("name")))):
            found.setdefault(int(m.group(1)), Step(int(m.group(1)), col.time(ev, "ts"), col.time(ev, "dur", 0.0)))
    return tuple(sorted(found.values(), key=lambda st: st.ts)), col.count


def load_rank(path: str | Path, progress: Progress | None = None, window: Window | None = None) -> RankTrace:
    """Read one rank's trace (plain or gzip JSON) into a RankTrace; with `window`, only the events that
    start inside it (and every ProfilerStep span), so memory follows the window, not the file."""
    path = Path(path)
    col = _Collector(path, window)
    for kind, item in iter_trace(path, progress):
        if kind == "event":
            col.add(item)
        else:
            col.members[item[0]] = item[1]
    info = _distributed(col.members.get("distributedInfo"), path)
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
    return RankTrace(path=str(path), rank=_rank(info, path), world_size=info.get("world_size"),
                     backend=info.get("backend"), device_name=name or ("CPU" if cpu else "GPU"), sm_count=sms,
                     cpu_device=cpu, steps=_steps(host), device=tuple(device), host=tuple(host),
                     thread_names=col.threads, pg_config=info["pg_config"] if info else (), events_read=col.count)
