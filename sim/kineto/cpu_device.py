"""A CPU run's device events: in a trace without GPU activity (torch.profiler on gloo) the CPU is the device.

- compute: the top-level operators (cat cpu_op, not nested in another cpu_op of the same thread) of the
  threads that run the model, one "stream" per thread; the issue of a collective (`c10d::*`) is not
  compute (its work runs on gloo's thread);
- communication: every `gloo:<op>` span (PyTorch's ProcessGroupGloo records one per collective, on the
  thread that runs it, with the tensor's `Input Dims` and `Input type`), one stream per gloo thread;
  group sizes are not recorded by gloo, so they are left to the process-group table
  (sim/kineto/collectives.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from meshsim.sim.kineto.records import DeviceEvent, HostOp

COMM_PREFIX = "gloo:"
ISSUE_PREFIX = "c10d::"


def _elements(dims: tuple) -> int:
    first = dims[0] if dims else ()
    while isinstance(first, tuple) and first and isinstance(first[0], tuple):  # a TensorList: the first tensor
        first = first[0]
    if not isinstance(first, tuple):
        return 0
    n = 1
    for d in first:
        n *= d if type(d) is int and d > 0 else 1
    return n if first and n <= 1 << 53 else 0


def _comm_event(op: HostOp) -> DeviceEvent:
    kind = op.name[len(COMM_PREFIX):]
    dtype = op.types[0] if op.types else "float"
    args = {"Collective name": kind, "In msg nelems": _elements(op.dims), "dtype": dtype}
    return DeviceEvent(op.ts, op.dur, 0, op.tid, op.name, "cpu", -1, args)


def cpu_device_events(host: Iterable[HostOp], thread_names: Mapping[int, str]) -> list[DeviceEvent]:
    """Device events of a CPU trace (module docstring), sorted by start; [] without host operators."""
    out: list[DeviceEvent] = []
    top_end: dict[int, float] = {}
    for op in host:  # sorted by (tid, ts, -dur)
        if op.name.startswith(COMM_PREFIX):
            out.append(_comm_event(op))
            continue
        if op.cat != "cpu_op" or "gloo" in thread_names.get(op.tid, ""):
            continue
        if op.ts < top_end.get(op.tid, float("-inf")):
            continue  # nested in the thread's current top-level operator
        top_end[op.tid] = op.end
        if not op.name.startswith(ISSUE_PREFIX):
            out.append(DeviceEvent(op.ts, op.dur, 0, op.tid, op.name, "cpu", -1, None))
    return sorted(out, key=lambda ev: (ev.ts, ev.stream))
