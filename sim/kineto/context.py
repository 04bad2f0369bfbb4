"""What launched each device event: the host operators around its launch.

A GPU kernel is linked to the cuda_runtime call that launched it by their shared correlation id (what
Kineto's `ac2g` flow arrows also draw). The host operators open on that call's thread at that moment,
innermost first, say what the kernel is for:
- the innermost operator that recorded `Input Dims` (aten::mm, aten::addmm, ...): a GEMM's shape;
- the innermost `nccl:*` / `gloo:*` annotation or `record_param_comms` with collective args: which
  collective, when the kernel itself carries no NCCL args (older PyTorch);
- the innermost user annotation named like a meshsim op ("L0.mb0.fwd.qkv", sim/schedule/op_keys.py):
  the schedule op it runs (`meshsim validate --trace` records them; a Megatron trace has none).
In a CPU trace the device event is itself a host operator, so the same query runs at its own start.

One sweep per thread over its events sorted by start (longest first on ties) with a stack of the open
ones: O(n log n) for the sort, O(depth) per launch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from meshsim.sim.kineto.records import DeviceEvent, HostOp
from meshsim.sim.schedule.op_keys import EMBED_BLOCK, HEAD_BLOCK, OPT_BLOCK, PP_BLOCK

RUNTIME_CATS = frozenset(("cuda_runtime", "cuda_driver"))
OP_LABEL = re.compile(rf"^(L\d+|{EMBED_BLOCK}|{HEAD_BLOCK}|{OPT_BLOCK}|{PP_BLOCK}|dp)\.[\w.+-]+$")
COMM_ANNOTATION = re.compile(r"^(nccl|gloo):")


class Launch(NamedTuple):
    """The host side of one device event (any part may be missing)."""

    ts: float  # the launch call's start (us); the event's own start in a CPU trace
    tid: int
    shape_op: HostOp | None
    comm_op: HostOp | None
    label: str | None


NO_LAUNCH = Launch(-1.0, -1, None, None, None)


def _launch_of(stack: Sequence[HostOp], ts: float, tid: int, own: HostOp | None = None) -> Launch:
    shape = own if own is not None and own.dims else None
    comm = label = None
    for op in reversed(stack):
        if shape is None and op.cat == "cpu_op" and op.dims:
            shape = op
        if comm is None and (COMM_ANNOTATION.match(op.name) or (op.args and "Collective name" in op.args)):
            comm = op
        if label is None and op.cat == "user_annotation" and OP_LABEL.match(op.name):
            label = op.name
    return Launch(ts, tid, shape, comm, label)


def _sweep(ops: Iterable[HostOp], wanted=None, corrs: set[int] | None = None) -> dict[int, Launch]:
    """key -> Launch for every op `wanted(op)` returns a key for (ops of one thread, sorted by start); with
    `corrs` instead, the runtime calls whose correlation is in it, by correlation. `ends` holds each open
    op's end (its ts + dur, the `end` the stack's top is compared with)."""
    found: dict[int, Launch] = {}
    stack: list[HostOp] = []
    ends: list[float] = []
    for op in ops:
        ts, cat = op.ts, op.cat
        while ends and ends[-1] <= ts:
            stack.pop()
            ends.pop()
        if corrs is not None:
            key = op.corr if cat in RUNTIME_CATS and op.corr in corrs else None
        else:
            key = wanted(op)
        if key is not None:
            found[key] = _launch_of(stack, ts, op.tid, op if cat == "cpu_op" else None)
        if cat not in RUNTIME_CATS:
            stack.append(op)
            ends.append(ts + op.dur)
    return found


def sweep_runtime(ops: list[HostOp], corrs: set[int]) -> dict[int, Launch]:
    """correlation -> Launch of each runtime call of `ops` (one thread's, sorted by start) whose correlation
    is in `corrs`: the reference of the compiled _collect.sweep_runtime."""
    return _sweep(ops, corrs=corrs)


def _compiled_sweep(ops: list[HostOp], corrs: set[int]) -> dict[int, Launch]:
    return _collect.sweep_runtime(ops, corrs, RUNTIME_CATS, Launch, COMM_ANNOTATION.match, OP_LABEL.match)


try:  # the compiled sweep (setup.py builds it where a C compiler is present); tests compare the two
    from meshsim.sim.kineto import _collect
    SWEEP_RUNTIME = _compiled_sweep
except ImportError:
    SWEEP_RUNTIME = sweep_runtime


def _by_thread(host: Sequence[HostOp]) -> list[list[HostOp]]:
    threads: dict[int, list[HostOp]] = {}
    for op in host:  # already sorted by (tid, ts, -dur)
        threads.setdefault(op.tid, []).append(op)
    return list(threads.values())


def gpu_launches(host: Sequence[HostOp], device: Sequence[DeviceEvent]) -> list[Launch]:
    """The Launch of each GPU event (NO_LAUNCH when its correlation matches no runtime call)."""
    wanted = {ev.corr for ev in device if ev.corr >= 0}
    found: dict[int, Launch] = {}
    for ops in _by_thread(host):
        found.update(SWEEP_RUNTIME(ops, wanted))
    return [found.get(ev.corr, NO_LAUNCH) if ev.corr >= 0 else NO_LAUNCH for ev in device]


def cpu_launches(host: Sequence[HostOp], device: Sequence[DeviceEvent]) -> list[Launch]:
    """A CPU trace: each device event's own operator and the annotations around it. A gloo span runs on
    gloo's thread, away from the op that issued it: the k-th span (by start) takes the label of the k-th
    `c10d::*` issue of the model's threads when both counts agree (gloo runs a group's collectives in
    issue order)."""
    index = {(ev.stream, ev.ts, ev.name): i for i, ev in enumerate(device)}
    issues: dict[int, Launch] = {}
    found: dict[int, Launch] = {}
    for ops in _by_thread(host):
        found.update(_sweep(ops, lambda op: index.get((op.tid, op.ts, op.name))))
        issues.update(_sweep(ops, lambda op: id(op) if op.cat == "cpu_op" and op.name.startswith("c10d::")
                             and not op.name.startswith("c10d::barrier") else None))
    out = [found.get(i, Launch(ev.ts, ev.stream, None, None, None)) for i, ev in enumerate(device)]
    spans = [i for i, ev in enumerate(device) if COMM_ANNOTATION.match(ev.name) and "barrier" not in ev.name]
    issued = sorted(issues.values(), key=lambda launch: launch.ts)
    if len(spans) == len(issued):
        for i, launch in zip(spans, issued, strict=True):
            out[i] = out[i]._replace(label=launch.label)
    return out
