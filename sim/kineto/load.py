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
Names are interned (cut to MAX_NAME_CHARS, all of them together at most MAX_NAMES_CHARS) and shape
tuples shared, so a name or shape repeated a million times is held once; what is kept costs ~150 bytes
per host event and ~200 per GPU event. Every kept field is checked as it is read (`_Collector`): ts and
dur numbers within MAX_TIME_US (dur >= 0), NCCL counts non-negative integers, ranks lists of short
integers, distributedInfo's rank / world_size / pg_size integers; a wrong one is one UserError naming the
event, the field and the value. `args` that is not an object, and odd shapes, are read as absent.

`read_rank` parses a file once; with `hold`, the records beyond it are spilled to a temporary file
(sim/kineto/spill.py) and `rank_trace` builds a RankTrace of any subset (a step window's) later.

A trace without GPU activity is a CPU run when it has host operators (torch.profiler on gloo, e.g.
`meshsim validate --trace` on CPU): its device events are then derived from the host
(sim/kineto/cpu_device.py). One with neither is refused (UserError, exit 2).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import FilePath, UserError
from meshsim.sim.kineto import fast, jsonstream
from meshsim.sim.kineto.cpu_device import cpu_device_events
from meshsim.sim.kineto.jsonstream import FIX, Progress, iter_trace
from meshsim.sim.kineto.members import MAX_COUNT, device_figures, distributed_info, leading_members, rank_of
from meshsim.sim.kineto.records import DeviceEvent, HostOp, RankTrace, Step
from meshsim.sim.kineto.spill import FLUSH_RECORDS, Spill

GPU_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
HOST_CATS = frozenset(("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"))
NCCL_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
             "Process Group Description", "Process Group Ranks", "bytes")
STEP = re.compile(r"^ProfilerStep#(\d{1,9})$")
MAX_NAME_CHARS = 16_384  # an event or thread name is kept to this many characters (C++ kernel names: ~2,000)
MAX_NAMES_CHARS = 1 << 28  # distinct names held, all together (256 Mi characters)
MAX_TIME_US = 1e18  # |ts| and dur (us; Kineto's ts are ~1.7e15 us since the epoch)
MAX_RANKS_CHARS = 1 << 20  # a "Process Group Ranks" string
COUNT_ARGS = ("In msg nelems", "Out msg nelems", "Group size", "bytes")
TEXT_ARGS = ("Collective name", "dtype", "Process Group Name", "Process Group Description")
NCCL_KEYS = frozenset(NCCL_ARGS)
# Every member _Collector reads of an event, and of its args (a non-object args is read as none): the
# compiled scanner (sim/kineto/fast.py) keeps only these. A key read here must be named here.
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")
ARG_KEYS = ("stream", "correlation", "Input Dims", "Input type", "name", *NCCL_ARGS)


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

    def __init__(self, path: Path, hold: int | None = None) -> None:
        self.path, self.spill = path, None
        self.limit = None if hold is None else max(hold, FLUSH_RECORDS)  # records held before a flush
        self.steps: dict[int, Step] = {}
        self.device: list[DeviceEvent] = []
        self.host: list[HostOp] = []
        self.threads: dict[int, str] = {}
        self.members: dict[str, Any] = {}
        self.names: dict[str, str] = {}
        self.shapes: dict[tuple, tuple] = {}  # Input Dims / Input type tuples, each distinct one kept once
        self.checked_ranks: set[str] = set()
        self.count = self.name_chars = self.gpu_events = self.host_ops = 0
        self.first_device: int | None = None

    def refuse(self, field: str, value: object, what: str) -> UserError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return UserError("trace", FilePath(self.path), FIX, problem=f"Event {self.count:,}: {field} is {shown}; {what}")

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

    def times(self, ev: dict) -> tuple[float, float]:
        """(ts, dur) of a kept event, checked (the common case in one test; `time` names a bad one)."""
        ts, dur = ev.get("ts"), ev.get("dur", 0.0)
        if (type(ts) is float or type(ts) is int) and (type(dur) is float or type(dur) is int) \
                and -MAX_TIME_US <= ts <= MAX_TIME_US and 0 <= dur <= MAX_TIME_US:
            return float(ts), float(dur)
        return self.time(ev, "ts"), self.time(ev, "dur", 0.0)

    def comm_args(self, args: dict) -> dict | None:
        if NCCL_KEYS.isdisjoint(args):
            return None
        kept = {k: args[k] for k in NCCL_ARGS if k in args}
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
        if type(ev) is not dict:
            return
        ph = ev.get("ph")
        if ph == "X":
            cat = ev.get("cat")
            if type(cat) is not str:  # a list or object is no category (and not hashable)
                cat = None
            if cat in GPU_CATS:
                self._device(ev, cat)
            elif cat in HOST_CATS and type(ev.get("tid")) is int:
                self._host(ev, cat)
            if self.limit is not None and not self.count & 1023 and len(self.host) + len(self.device) > self.limit:
                self.flush()
        elif ph == "M" and ev.get("name") == "thread_name" and type(ev.get("tid")) is int:
            args = ev.get("args")
            self.threads[ev["tid"]] = self.name(args.get("name", "")) if isinstance(args, dict) else ""

    def _args_and_times(self, ev: dict) -> tuple[dict, float, float]:
        """The event's args (a non-object read as absent) and its checked ts and dur (microseconds)."""
        args = ev.get("args")
        if type(args) is not dict:
            args = {}
        ts, dur = ev.get("ts"), ev.get("dur", 0.0)
        if type(ts) is not float or type(dur) is not float or not (-MAX_TIME_US <= ts <= MAX_TIME_US
                                                                 and 0.0 <= dur <= MAX_TIME_US):
            ts, dur = self.times(ev)  # ints, or a bad value to name
        return args, ts, dur

    def _device(self, ev: dict, cat: str) -> None:
        args, ts, dur = self._args_and_times(ev)
        device, stream = ev.get("pid", 0), args.get("stream", ev.get("tid", 0))
        if type(device) is not int or type(stream) is not int:
            return  # not a GPU's activity (Chrome-trace pids and tids may be names)
        corr = args.get("correlation", -1)
        self.gpu_events += 1
        if self.first_device is None:
            self.first_device = device
        name = ev.get("name", "")
        name = (self.names.get(name) if type(name) is str else None) or self.name(name)
        self.device.append(DeviceEvent(ts, dur, device, stream, name, cat, corr if type(corr) is int else -1,
                                       None if NCCL_KEYS.isdisjoint(args) else self.comm_args(args)))

    def _host(self, ev: dict, cat: str) -> None:
        args, ts, dur = self._args_and_times(ev)
        corr = args.get("correlation", -1)
        dims, types = args.get("Input Dims"), args.get("Input type")
        name = ev.get("name", "")
        name = (self.names.get(name) if type(name) is str else None) or self.name(name)
        self.host.append(HostOp(ts, dur, ev["tid"], name, cat, corr if type(corr) is int else -1,
                                self.shared(_frozen(dims)) if dims else (), self.shared(_frozen(types)) if types else (),
                                None if NCCL_KEYS.isdisjoint(args) else self.comm_args(args)))
        self.host_ops += 1
        if cat == "user_annotation":
            self.step(name, ts, dur)

    def step(self, name: str, ts: float, dur: float) -> None:
        """A user annotation: kept as a step when it is ProfilerStep#N (the first of each N)."""
        if m := STEP.match(name):
            self.steps.setdefault(int(m.group(1)), Step(int(m.group(1)), ts, dur))

    def flush(self) -> None:
        """Move the records held to the spill file (sim/kineto/spill.py)."""
        self.spill = self.spill or Spill()
        self.spill.write(self.host, self.device)
        self.host, self.device, self.shapes = [], [], {}

    def shared(self, value: tuple) -> tuple:
        """One object per distinct tuple: a step repeats its shapes (hundreds of MB on a large trace)."""
        return self.shapes.setdefault(value, value) if value else ()


def _frozen(value: object) -> tuple:
    """A list of lists as nested tuples (hashable, compact); anything else (). The common case, a list
    of flat lists of ints, in one pass."""
    if type(value) is not list:
        return ()
    try:
        out = tuple([tuple(v) if type(v) is list else v for v in value])
        hash(out)
        return out
    except TypeError:  # a TensorList (lists nested deeper), or an object where a size belongs (made None)
        return tuple(_frozen(v) if type(v) is list else None if type(v) is dict else v for v in value)


@dataclass
class RankRecords:
    """One parse of a rank's file: its figures and steps, and its kept records, in memory or spilled to
    disk (`spill`) when more than `hold` were kept."""

    path: Path
    info: dict
    device_name: str
    sm_count: int | None
    threads: dict[int, str]
    steps: tuple[Step, ...]
    events_read: int
    kept: int
    cpu_device: bool  # no GPU activity in the whole file: the CPU is the device (sim/kineto/cpu_device.py)
    host: list[HostOp] = field(default_factory=list)
    device: list[DeviceEvent] = field(default_factory=list)
    spill: Spill | None = None

    @property
    def rank(self) -> int:
        return rank_of(self.info, self.path)

    def all_records(self) -> tuple[list[HostOp], list[DeviceEvent]]:
        if self.spill is None:
            return self.host, self.device
        return self.spill.records_back()


def read_rank(path: str | Path, progress: Progress | None = None, hold: int | None = None) -> RankRecords:
    """Parse one rank's trace (plain or gzip JSON) once; with `hold`, records beyond about that many are
    spilled to a temporary file as they are read, so memory follows `hold`, not the file."""
    path = Path(path)
    col = _Collector(path, hold)
    compiled = (_frozen, DeviceEvent, HostOp, GPU_CATS, HOST_CATS, NCCL_ARGS, MAX_TIME_US)  # fast.py's Adder
    if jsonstream.DEFAULT_BACKEND != "compiled" or \
            not fast.collect(path, col, progress, leading_members, compiled, (EVENT_KEYS, ARG_KEYS)):
        col = _Collector(path, hold)
        for kind, item in iter_trace(path, progress):
            if kind == "event":
                col.add(item)
            else:
                col.members[item[0]] = item[1]
    if col.spill is not None:
        col.flush()
    if not col.gpu_events and not col.host_ops:
        raise _no_device(path, col.count)
    info = distributed_info(col.members.get("distributedInfo"), path)
    name, sms = device_figures(col.members.get("deviceProperties"), col.first_device or 0)
    kept = (col.spill.records if col.spill is not None else 0) + len(col.host) + len(col.device)
    return RankRecords(path, info, name, sms, col.threads, tuple(sorted(col.steps.values(), key=lambda s: s.ts)),
                       col.count, kept, not col.gpu_events, col.host, col.device, col.spill)


def _no_device(path: Path, events: int) -> UserError:
    return UserError("trace", FilePath(path), "profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] so "
                     "GPU kernels are recorded (docs/validate.md, 'Capturing a trace')",
                     problem=f"No GPU events (kernels, copies) in its {events:,} events, and no host operators "
                             "to treat the CPU as the device")


def rank_trace(rec: RankRecords, host: list[HostOp], device: list[DeviceEvent]) -> RankTrace:
    """The RankTrace of `rec` holding the records `host` and `device` (all of them, or a window's)."""
    host = sorted(host, key=lambda op: (op.tid, op.ts, -op.dur))
    cpu = rec.cpu_device
    device = cpu_device_events(host, rec.threads) if cpu else sorted(device, key=lambda ev: (ev.ts, ev.stream))
    if not device and not rec.steps:
        raise _no_device(rec.path, rec.events_read)
    info = rec.info
    return RankTrace(path=str(rec.path), rank=rec.rank, world_size=info.get("world_size"),
                     backend=info.get("backend"), device_name=rec.device_name or ("CPU" if cpu else "GPU"),
                     sm_count=rec.sm_count, cpu_device=cpu, steps=rec.steps, device=tuple(device), host=tuple(host),
                     thread_names=rec.threads, pg_config=info["pg_config"] if info else (),
                     events_read=rec.events_read)


def load_rank(path: str | Path, progress: Progress | None = None) -> RankTrace:
    """Read one rank's trace whole into a RankTrace."""
    rec = read_rank(path, progress)
    return rank_trace(rec, *rec.all_records())
