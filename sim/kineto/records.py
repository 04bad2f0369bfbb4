"""The typed records of one rank's Kineto trace, as meshsim keeps them (times in microseconds, as Kineto
writes them; converted to seconds where the summary is built).

Bulk events are NamedTuples (immutable, typed, ~half the memory of a slotted dataclass: a 500 MB trace
holds millions); the per-rank and per-step records are frozen dataclasses.

- DeviceEvent: a GPU activity (`cat` kernel, gpu_memcpy, gpu_memset) on (device, stream), or, in a CPU
  trace (gloo, no GPU), a top-level operator of a main thread or a `gloo:*` span of a gloo thread
  (sim/kineto/cpu_device.py). `corr` links it to its launch (the cuda_runtime event with the same
  `correlation`); `args` keeps only the NCCL / memcpy arguments the summary reads.
- HostOp: a CPU event (cpu_op, user_annotation, cuda_runtime, cuda_driver) on one thread; `dims` /
  `types` are the recorded `Input Dims` / `Input type` (record_shapes=True), else ().
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class DeviceEvent(NamedTuple):
    ts: float  # us
    dur: float  # us
    device: int  # GPU index (the pid Kineto gives the GPU), or the host pid in a CPU trace
    stream: int  # CUDA stream (Kineto's tid), or the thread in a CPU trace
    name: str
    cat: str  # kernel, gpu_memcpy, gpu_memset, cpu (a CPU trace's operator)
    corr: int  # correlation id (-1: none)
    args: dict[str, Any] | None  # NCCL args ("Collective name", "In msg nelems", ...), memcpy "bytes"

    @property
    def end(self) -> float:
        return self.ts + self.dur


class HostOp(NamedTuple):
    ts: float  # us
    dur: float  # us
    tid: int
    name: str
    cat: str  # cpu_op, user_annotation, cuda_runtime, cuda_driver, cuda_sync
    corr: int  # correlation id of a runtime call (-1 for operators)
    dims: tuple = ()
    types: tuple = ()
    args: dict[str, Any] | None = None  # collective args of record_param_comms; sync args of cuda_sync

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True)
class Step:
    """A ProfilerStep#N span on the host (us); the whole trace when it has none (number None)."""

    number: int | None
    ts: float
    dur: float

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def label(self) -> str:
        return "whole trace" if self.number is None else f"ProfilerStep#{self.number}"


@dataclass(frozen=True)
class RankTrace:
    """What one rank's trace file holds, as read (sim/kineto/load.py)."""

    path: str
    rank: int
    world_size: int | None
    backend: str | None
    device_name: str
    sm_count: int | None
    cpu_device: bool  # no GPU activity: the CPU is the device (a gloo run)
    steps: tuple[Step, ...]
    device: tuple[DeviceEvent, ...]  # sorted by start
    host: tuple[HostOp, ...]  # sorted by (tid, start)
    thread_names: dict[int, str] = field(default_factory=dict)
    pg_config: tuple[dict, ...] = ()
    events_read: int = 0
