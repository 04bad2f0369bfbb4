"""`meshsim validate --trace DIR`: a Kineto trace of the run's own as-scheduled steps, one file per rank.

After the measured steps, one unlabelled step (it takes the profiler's start-up cost; readers ignore what
precedes the first ProfilerStep) and TRACE_STEPS more as-scheduled steps run under torch.profiler (CPU activity,
plus CUDA on NCCL; record_shapes=True, so GEMM shapes are in `Input Dims`): each step inside a
`ProfilerStep#N` annotation (what torch.profiler's own step() writes), each schedule op inside a
record_function named by the op ("L0.mb0.fwd.qkv"). `meshsim trace summary DIR`, `meshsim compare
DIR/scenario.yaml --trace DIR` and `meshsim calibrate --from-trace DIR --scenario DIR/scenario.yaml` read
them (sim/kineto/). The profiled steps are not the measured ones: the profiler's own cost (a few us per
operator) stays out of validate's figures.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

TRACE_STEPS = 3


def _labelled(op):
    return record_function(op.name)


def profiled_steps(schedule, runners, scheduled, trace_dir: str, steps: int = TRACE_STEPS, cuda: bool = False) -> Path:
    """Run `steps` as-scheduled steps under the profiler; write trace_dir/rank<R>.json."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        scheduled(schedule, runners, _labelled)  # before the first ProfilerStep: the profiler's start-up cost
        for i in range(steps):
            with record_function(f"ProfilerStep#{i}"):
                scheduled(schedule, runners, _labelled)
            if cuda:
                torch.cuda.synchronize()
    path = Path(trace_dir) / f"rank{dist.get_rank()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path
