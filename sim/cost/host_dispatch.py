"""Host dispatch: the CPU issues every op of an eager PyTorch step one after another, and a GPU op cannot
start before the host has issued it.

    issue_s(op_i) = sum_{j <= i} dispatch_s(op_j)      (schedule order = the order Megatron issues ops)

The engine starts an op at max(stream free, deps done, issue_s(op)) (sim/engine.py), so while GPU kernels
are longer than their dispatch the host runs ahead and costs nothing; when they are shorter (small
models, high TP, sequence-sharded elementwise kernels, fast GPUs) the GPU starves and the step becomes
host bound. The host never waits for the GPU here (no .item() or other synchronisation inside a step).

dispatch_s = hardware.compute.host_dispatch_us (default HOST_DISPATCH_US) per schedule op; 0 with
`run.cuda_graphs` (the step replays captured graphs: one launch per graph).

HOST_DISPATCH_US = 20: PyTorch eager costs on the order of 10 us of CPU per operator call (Python, the
dispatcher, the caching allocator and the launch itself; He, "Making Deep Learning Go Brrrr From First
Principles", 2022, and PyTorch's own CPU-overhead profiles), and one schedule op stands for the GEMM or
kernel plus about one more small call around it (views, casts, bias or stream bookkeeping in Megatron's
Python modules). An estimate from those public figures; `meshsim calibrate` can measure it.
"""

from __future__ import annotations

from itertools import accumulate

from meshsim.sim.schedule.ops import Schedule

HOST_DISPATCH_US = 20.0


def issue_times_s(schedule: Schedule, dispatch_s: float) -> tuple[float, ...]:
    """issue_s per op id (ids are list positions): the cumulative host time up to and including the op."""
    if dispatch_s <= 0:
        return ()
    return tuple(accumulate(dispatch_s for _ in schedule.ops))
