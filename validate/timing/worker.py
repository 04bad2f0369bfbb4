"""Worker side of timing: run the schedule's ops for real, step after step, and time them.

Two kinds of step, interleaved after `warmup` untimed ones:
- timed (per op): ops one after another in schedule order; before each collective a barrier on its
  group, so the measured interval is the collective itself, not the wait for a late peer. Each op is
  bracketed by clock marks: time.perf_counter on CPU (gloo calls are synchronous), CUDA events on GPU
  (resolved after one synchronize per step).
- as scheduled (step time): ops issued in schedule order, collectives asynchronously (async_op=True);
  an op first waits for the collectives it depends on. On CUDA each schedule stream is a CUDA stream and
  dependencies are CUDA events, so communication overlaps computation as the simulator assumes. The step
  time is from a barrier to this rank's last completion.

Pipelines (pp > 1): each rank runs its own stage's schedule (sim/schedule/pipeline_builder.py's
build_stage_schedules, the ones the simulator runs) and P2P batches go to the peer stages' ranks
(validate/timing/executor.py). A P2P batch gets no barrier in the timed step: its interval includes the
wait for the peer to post (the pipeline bubble the simulator reports apart). On CPU (gloo) the
as-scheduled step waits each P2P batch where it is posted, as validate/stack/pipeline.py does (deferred
waits hung gloo there); on CUDA a batch runs on its own pp_comm stream and its dependants wait for it.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from meshsim.scenarios.load import resolve
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.mesh import INSTANCE_KINDS, mesh_group
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import P2P, Collective, Schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.validate.numerics.worker import run_variants
from meshsim.validate.stack.groups import build_mesh, new_groups
from meshsim.validate.timing.executor import Device, Pipeline, Runners
from meshsim.validate.timing.profiled import profiled_steps


class CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def seconds(self, a: float, b: float) -> float:
        return b - a


class CudaClock:
    def mark(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def sync(self) -> None:
        torch.cuda.synchronize()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3


def timed_step(schedule: Schedule, runners: Runners, clock, groups: dict) -> list[tuple[float, float]]:
    """(start_s from the step start, duration_s) per op, in schedule order."""
    clock.sync()
    dist.barrier()
    step = clock.mark()
    marks = []
    for op in schedule.ops:
        run = runners(op.work)
        group = groups.get(op.work.group) if isinstance(op.work, Collective) else None
        if group is not None:
            clock.sync()
            dist.barrier(group=group)
        begin = clock.mark()
        run(False)
        marks.append((begin, clock.mark()))
    clock.sync()
    return [(clock.seconds(step, a), clock.seconds(a, b)) for a, b in marks]


def _no_label(op) -> contextlib.nullcontext:
    return contextlib.nullcontext()


def scheduled_step_cpu(schedule: Schedule, runners: Runners, around=_no_label) -> float:
    """Seconds for one step issued as scheduled (collectives async, waited by their dependants);
    `around(op)` is a context each op runs in (validate/timing/profiled.py labels ops for the profiler)."""
    dist.barrier()
    start = time.perf_counter()
    pending: dict[int, object] = {}
    for op in schedule.ops:
        for dep in op.deps:
            handle = pending.pop(dep, None)
            if handle is not None:
                handle.wait()
        is_comm = isinstance(op.work, Collective)
        with around(op):
            handle = runners(op.work)(is_comm)  # a P2P batch: waited here (module docstring)
        if is_comm and handle is not None:
            pending[op.id] = handle
    for handle in pending.values():
        handle.wait()
    return time.perf_counter() - start


def scheduled_step_cuda(schedule: Schedule, runners: Runners, around=_no_label) -> float:
    """As scheduled on CUDA: one stream per schedule stream, dependencies as events, NCCL on its stream."""
    streams = {"compute": torch.cuda.current_stream(), "tp_comm": torch.cuda.Stream(),
               "dp_comm": torch.cuda.Stream(), "pp_comm": torch.cuda.Stream(), "ep_comm": torch.cuda.Stream()}
    done: dict[int, torch.cuda.Event] = {}
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for op in schedule.ops:
        stream = streams[op.stream]
        for dep in op.deps:
            stream.wait_event(done[dep])
        with torch.cuda.stream(stream), around(op):
            is_comm = isinstance(op.work, Collective | P2P)
            handle = runners(op.work)(is_comm)
            if is_comm and handle is not None:
                handle.wait()
            done[op.id] = torch.cuda.Event()
            done[op.id].record(stream)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def schedule_from_payload(payload: dict) -> Schedule:
    """The whole model's schedule (calibration samples its works)."""
    return build_schedule(resolve(Scenario.model_validate(payload["scenario"]), payload["source"]))


def stage_setup(payload: dict) -> tuple[Schedule, dict, Pipeline]:
    """This rank's stage schedule, its groups by schedule name, and its pipeline peers."""
    rs = resolve(Scenario.model_validate(payload["scenario"]), payload["source"])
    schedule = build_stage_schedules(rs)[rs.stage_of(dist.get_rank())]
    rep = schedule.kv_replicas
    experts = (rs.ep, rs.etp) if rs.scenario.model.moe is not None else None
    mesh, _ = build_mesh(schedule.tp, schedule.dp, [list(range(b, b + rep)) for b in range(0, schedule.tp, rep)],
                         pp=rs.pp, experts=experts)
    groups = {"tp": mesh.tp_group, "dp": mesh.dp_group, "kv": mesh.kv_group, "embed": mesh.embed_group}
    if mesh.experts is not None:  # MoE: the dispatcher's and the experts' groups (sim/core/mesh.py)
        e = mesh.experts
        groups.update(ep=e.ep_group, etp=e.etp_group, etp_ep=e.etp_ep_group, edp=e.edp_group)
    run = rs.scenario.run
    if run.fp8 == "delayed" and not run.tp_only_amax_reduction:  # the same on every rank: groups created alike
        # FP8 delayed scaling's amax all-reduce over the whole stage (sim/core/mesh.py "stage")
        blocks = [list(range(s * rs.stage_size, (s + 1) * rs.stage_size)) for s in range(rs.pp)]
        groups["stage"] = new_groups(blocks, dist.get_rank()) if rs.stage_size > 1 else None
    if rs.instances > 1:  # distributed-optimizer instances: the DP pieces and the groups across them
        for kind in INSTANCE_KINDS:  # every rank makes every group, in the same order (new_groups)
            blocks = [list(g) for g in dict.fromkeys(rs.group(kind, r) for r in range(rs.gpus))]
            groups[kind] = new_groups(blocks, dist.get_rank()) if len(blocks[0]) > 1 else None
    pipe = Pipeline(mesh_group("pp", dist.get_rank(), rs.tp, rs.dp, pp=rs.pp), rs.pp * rs.vp)
    return schedule, groups, pipe


def timing_task(payload: dict) -> dict:
    """Task "timing": optional numerics variants first (payload["numerics"], on gloo groups: CPU tensors),
    then warm-up and `repeats` pairs of (timed, as-scheduled) steps on groups of the default backend.
    Each rank runs its pipeline stage's schedule. Returns this rank's raw measurements and the backend they were taken on."""
    numerics = None
    if payload.get("numerics"):
        numerics = run_variants(payload["numerics"])
    schedule, groups, pipe = stage_setup(payload)
    cuda = dist.get_backend() == "nccl"
    runners = Runners(Device.for_backend(dist.get_backend()), groups, pipe)
    clock = CudaClock() if cuda else CpuClock()
    scheduled = scheduled_step_cuda if cuda else scheduled_step_cpu
    for _ in range(payload.get("warmup", 2)):
        scheduled(schedule, runners)
    timed, steps = [], []
    for _ in range(payload.get("repeats", 5)):
        timed.append(timed_step(schedule, runners, clock, groups))
        steps.append(scheduled(schedule, runners))
    if payload.get("trace_dir"):
        profiled_steps(schedule, runners, scheduled, payload["trace_dir"], payload.get("trace_steps", 3), cuda)
    return {"rank": dist.get_rank(), "backend": dist.get_backend(), "timed": timed, "step_s": steps,
            "numerics": numerics}
