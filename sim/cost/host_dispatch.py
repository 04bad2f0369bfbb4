"""Host dispatch: the CPU issues every op of an eager PyTorch step one after another, and a GPU op cannot
start before the host has issued it.

    issue_s(op_i) = sum_{j <= i} dispatch_s(op_j)      (schedule order = the order Megatron issues ops)

The engine starts an op at max(stream free, deps done, issue_s(op)) (sim/engine.py), so while GPU kernels
are longer than their dispatch the host runs ahead and costs nothing; when they are shorter (small
models, high TP, sequence-sharded elementwise kernels, fast GPUs) the GPU starves and the step becomes
host bound. These are the static times: the host waits for the GPU only at an op with a `host_wait` (a
device-to-host sync: the MoE token counts, sim/schedule/moe_sync.py), after which the engine issues the
following ops that much later (sim/engine/host.py): right after a sync the GPU queue is empty and every
kernel waits for its own dispatch until a long one lets the host run ahead again.

dispatch_s(op) = hardware.compute.host_dispatch_us (default HOST_DISPATCH_US) x op.host_calls /
CALLS_PER_DISPATCH: one dispatch for an op of the default two calls, more for an op the source shows
issuing more (sim/schedule/moe_sync.py states each count); 0 with `run.cuda_graphs` (the step replays
captured graphs: one launch per graph, and no sync is modeled).

HOST_DISPATCH_US = 20: PyTorch eager costs on the order of 10 us of CPU per operator call (Python, the
dispatcher, the caching allocator and the launch itself; He, "Making Deep Learning Go Brrrr From First
Principles", 2022, and PyTorch's own CPU-overhead profiles), and one schedule op stands for the GEMM or
kernel plus about one more small call around it (views, casts, bias or stream bookkeeping in Megatron's
Python modules). An estimate from those public figures; `meshsim calibrate` can measure it.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from meshsim.sim.schedule.ops import Schedule

HOST_DISPATCH_US = 20.0
CALLS_PER_DISPATCH = 2  # HOST_DISPATCH_US's op: the kernel plus about one more small call (above)


def issue_times_s(schedule: Schedule, dispatch_s: float) -> tuple[float, ...]:
    """issue_s per op id (ids are list positions): the cumulative host time up to and including the op."""
    if dispatch_s <= 0:
        return ()
    per_call_s = dispatch_s / CALLS_PER_DISPATCH
    tiled = schedule.tiled_arrays
    if tiled is None:
        return tuple(accumulate(dispatch_s if op.host_calls == CALLS_PER_DISPATCH else per_call_s * op.host_calls
                                for op in schedule.ops))
    # the same per-op products (double x int), summed in order: np.cumsum adds one element at a time
    calls = tiled.host_calls
    per_op_s = np.where(calls == CALLS_PER_DISPATCH, dispatch_s, per_call_s * calls.astype(np.float64))
    return tuple(np.cumsum(per_op_s).tolist())
