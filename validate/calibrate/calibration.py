"""Calibration: measure this machine on the works a scenario's schedule uses; write a HardwareProfile.

Measured (workers on nproc processes at once, so compute sees the same contention as a real step):
- every distinct compute work of the schedule, with the executor's own kernels (validate/timing/executor.py):
  GEMMs -> gemm_table (TFLOP/s = FLOPs / time), attention -> kernel_table "flash_attention_fwd/_bwd"
  (keyed by FLOPs), elementwise kernels -> kernel_table by schedule kernel name (keyed by bytes);
  sim/cost/compute.py looks each of these up by nearest shape / size, so a calibrated schedule is costed from
  its own measured shapes;
- memory bandwidth: the elementwise kernel over MEM_SIZES; a least-squares line t = t0 + bytes / bw gives
  elementwise_bw_gbps (also gpu.mem_bw_gbps) and compute.launch_overhead_us = t0 (per-op fixed cost); a line
  noise left without a positive slope gives way to the largest size's own rate (memory_line);
- collectives: all-reduce, all-gather, reduce-scatter (and any other op the schedule uses) on groups of
  every size g >= 2 dividing nproc (consecutive blocks of g ranks, all groups at once), at the schedule's
  sizes plus a sweep, each after a barrier on its group.
  algbw = nbytes / t; busbw = algbw x 2(g-1)/g (all-reduce), x (g-1)/g (all-gather, reduce-scatter,
  all-to-all), x 1 (broadcast) -- nccl-tests' conventions (shared/reference/hardware-facts.md);
- compute/communication interference: a representative GEMM alone (g), a representative collective
  alone (c ~ g), both overlapped as the executor overlaps them (t_both); kappa = clamp((t_both -
  max(g, c)) / min(g, c), 0, 1) -> compute.comm_interference, the raw figures in
  measured_on["comm_interference"] (validate/calibrate/interference.py derives and details it).
Each measurement: the mean of REPEATS runs after WARMUP untimed ones, in rounds over all items
(round_robin_samples_s says why rounds; reduce_samples why the mean, and why a collective's time is
the minimum over ranks of each round).
Noise: the means' excess over the best repeats and the load average before the workers started
(validate/calibrate/noise.py) go into measured_on["timing_noise"]; beyond noise.MAX_EXCESS no profile is written
unless the caller accepts the noise.
"""

from __future__ import annotations

import datetime
import platform
import statistics

import torch
import torch.distributed as dist

from meshsim.scenarios.load import resolve
from meshsim.scenarios.profile import (
    CollectivePoint,
    GemmPoint,
    GpuFigures,
    HardwareProfile,
    KernelPoint,
    save_profile,
)
from meshsim.scenarios.schema import ComputeTuning
from meshsim.sim.cost.collectives import busbw_factor
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import Attention, Collective, Elementwise, Gemm, Schedule, Work
from meshsim.validate.calibrate.interference import interference_samples, reduce_interference
from meshsim.validate.calibrate.noise import calibration_noise, load_per_core, refuse_noisy_profile
from meshsim.validate.calibrate.sampling import REPEATS, reduce_samples, round_robin_samples_s
from meshsim.validate.launch.launch import launch
from meshsim.validate.launch.shrink import shrink, timing_rule, without_profile
from meshsim.validate.stack.groups import new_groups
from meshsim.validate.timing.executor import Device, Runners, memory_kernel
from meshsim.validate.timing.worker import schedule_from_payload

MEM_SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24)  # bytes touched (read + write): 256 KiB .. 16 MiB
COLL_SWEEP_CPU = tuple(1 << p for p in range(10, 22, 2))  # 1 KiB .. 1 MiB
COLL_SWEEP_GPU = tuple(1 << p for p in range(10, 31, 2))  # 1 KiB .. 1 GiB
COLL_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def compute_works(schedule: Schedule) -> list[Work]:
    """Distinct non-collective works in first-use order (the parent and workers agree on it)."""
    return list(dict.fromkeys(op.work for op in schedule.ops if not isinstance(op.work, Collective)))


def collective_points(schedule: Schedule, world: int, gpu: bool) -> list[tuple[str, int, int]]:
    """(op, group size, nbytes) to measure: the schedule's own plus the sweep, for every group size."""
    sizes = [g for g in range(2, world + 1) if world % g == 0]
    own = {(op.work.op, op.work.nbytes) for op in schedule.ops if isinstance(op.work, Collective)}
    kinds = sorted(set(COLL_OPS) | {k for k, _ in own})
    sweep = COLL_SWEEP_GPU if gpu else COLL_SWEEP_CPU
    points = {(k, g, b) for k in kinds for g in sizes for b in sweep}
    points |= {(k, g, b) for k, b in own for g in sizes}
    return sorted(points)


def _groups_of(size: int) -> object:
    """Create the consecutive-block groups of `size` (every rank calls this in the same order); they run
    the calibrated backend's own tensors, so they keep the default backend."""
    world = dist.get_world_size()
    return new_groups([list(range(first, first + size)) for first in range(0, world, size)], dist.get_rank())


def calibrate_task(payload: dict) -> dict:
    """Task "calibrate": this rank's samples for compute works, memory sizes and collectives, and the
    backend they were taken on (the parent rebuilds the schedule with it)."""
    schedule = schedule_from_payload(payload)
    backend = dist.get_backend()
    dev = Device.for_backend(backend)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    runners = Runners(dev, {})
    repeats = payload.get("repeats", REPEATS)
    compute = round_robin_samples_s([(runners(w), None) for w in compute_works(schedule)], sync, repeats)
    memory = round_robin_samples_s([(memory_kernel(n // 2, n - n // 2, dev), None) for n in MEM_SIZES], sync,
                                   repeats)
    points = collective_points(schedule, dist.get_world_size(), backend == "nccl")
    groups = {g: _groups_of(g) for g in sorted({g for _, g, _ in points})}
    by_size = {g: Runners(dev, {"tp": group}) for g, group in groups.items()}
    colls = round_robin_samples_s([(by_size[g](Collective(op, "tp", nbytes)),
                                 lambda grp=groups[g]: dist.barrier(group=grp)) for op, g, nbytes in points], sync,
                                 repeats)
    return {"rank": dist.get_rank(), "backend": backend, "compute": compute, "memory": memory, "collectives": colls,
            "interference": interference_samples(schedule, dev, groups, sync),
            "device": torch.cuda.get_device_name() if backend == "nccl" else cpu_name()}


def cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), else platform.processor(), else "cpu"."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x -> (a, b)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def memory_line(sizes: tuple[int, ...], times_s: list[float]) -> tuple[float, float]:
    """(fixed cost s, s per byte) of the memory kernel: the least-squares line t = t0 + bytes / bw over the
    sizes, or, when noise leaves it no positive slope (a larger size measured no slower: seen on a loaded
    CPU), the largest size's own rate with no fixed cost, t = bytes x t_max / bytes_max (the size least
    dominated by the fixed cost)."""
    launch_s, s_per_byte = fit_line([float(n) for n in sizes], times_s)
    if s_per_byte > 0:
        return launch_s, s_per_byte
    return 0.0, times_s[-1] / sizes[-1]


def measured_on(backend: str, nproc: int, device: str, scenario: str) -> dict[str, str]:
    return {"device": device, "backend": backend, "nproc": str(nproc), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "scenario": scenario}


def _kernel_point(work: Work, time_s: float):
    if isinstance(work, Gemm):
        return GemmPoint(m=work.m, n=work.n, k=work.k, batch=work.batch, tflops=work.flops / time_s / 1e12)
    if isinstance(work, Attention):
        kernel = "flash_attention_bwd" if work.backward else "flash_attention_fwd"
        return KernelPoint(kernel=kernel, flops=work.flops, time_us=time_s * 1e6)
    if isinstance(work, Elementwise):
        return KernelPoint(kernel=work.kernel, bytes=work.bytes_read + work.bytes_written, time_us=time_s * 1e6)
    return None  # OptimizerStep: costed from elementwise_bw_gbps + launch overhead (sim/cost/compute.py)


def _device_figures(backend: str, best_tflops: float | None, bw_gbps: float):
    """The profile's `gpu` section. On a GPU (nccl) the datasheet peaks stay: measured throughput is in the
    GEMM and kernel tables, and the model's efficiency defaults (attention 0.50 of peak, ...) and MFU are
    defined against the datasheet peak, so writing the best measured GEMM there would derate twice. On a
    CPU (gloo) the device is not the scenario's GPU preset at all, so the measured figures replace it."""
    if backend == "nccl":
        return GpuFigures()
    return GpuFigures(peak_tflops=best_tflops, mem_bw_gbps=bw_gbps)


def build_profile(schedule: Schedule, per_rank: list[dict], name: str, backend: str, scenario: str,
                  noise: str | None = None):
    """Reduce the workers' samples (reduce_samples) into a HardwareProfile; `noise`: their excess and load."""
    works = compute_works(schedule)
    compute_s = reduce_samples([r["compute"] for r in per_rank], collective=False)
    points = [p for p in (_kernel_point(w, t) for w, t in zip(works, compute_s, strict=True)) if p is not None]
    gemms = [p for p in points if isinstance(p, GemmPoint)]
    memory_s = reduce_samples([r["memory"] for r in per_rank], collective=False)
    launch_s, s_per_byte = memory_line(MEM_SIZES, memory_s)
    bw_gbps = 1.0 / s_per_byte / 1e9
    colls = []
    coll_s = reduce_samples([r["collectives"] for r in per_rank], collective=True)
    for (op, g, nbytes), t in zip(collective_points(schedule, len(per_rank), backend == "nccl"), coll_s, strict=True):
        algbw = nbytes / t / 1e9
        colls.append(CollectivePoint(op=op, ranks=g, nbytes=nbytes, time_us=t * 1e6, algbw_gbps=algbw,
                                     busbw_gbps=algbw * busbw_factor(op, g)))
    on = measured_on(backend, len(per_rank), per_rank[0]["device"], scenario)
    if noise is not None:
        on["timing_noise"] = noise
    interference = reduce_interference([r.get("interference") for r in per_rank])
    kappa = None
    if interference is not None:
        kappa, _, on["comm_interference"] = interference
    best_tflops = max((p.tflops for p in gemms), default=None)
    if best_tflops is not None:
        on["best_gemm_tflops"] = f"{best_tflops:.4g}"
    return HardwareProfile(
        name=name, measured_on=on, gpu=_device_figures(backend, best_tflops, bw_gbps),
        compute=ComputeTuning(launch_overhead_us=max(0.0, launch_s * 1e6), comm_interference=kappa,
                              host_dispatch_us=host_dispatch_us(backend)),
        gemm_table=gemms, elementwise_bw_gbps=bw_gbps,
        kernel_table=[p for p in points if not isinstance(p, GemmPoint)], collective_table=colls)


def host_dispatch_us(backend: str) -> float | None:
    """Per-op host dispatch for the profile (sim/cost/host_dispatch.py). On CPU (gloo) the host is the
    device: every measured op time already includes its own dispatch, so 0. On GPUs it is left to the
    default (not measured yet: it needs a host-side enqueue timing without synchronisation)."""
    return 0.0 if backend == "gloo" else None


def calibration_payload(scenario, source: str, nproc: int, backend: str):
    """(shrunk scenario, payload of task "calibrate"): the scenario shrunk by the backend's timing rule."""
    shrunk = without_profile(shrink(scenario, nproc, timing_rule(backend), source))
    return shrunk, {"scenario": shrunk.model_dump(mode="json"), "source": source}


def checked_profile(schedule: Schedule, per_rank: list[dict], name: str, backend: str, scenario: str,
                    load: tuple[float | None, int], accept_noise: bool = False):
    """build_profile, refused (noise.refuse_noisy_profile: one line, exit 2) when the samples' means sit
    too far above their best repeats and the caller does not accept it; the excess is kept in measured_on."""
    noise = calibration_noise(per_rank, load)
    refuse_noisy_profile(noise, accept_noise)
    note = noise.describe() + (" (beyond the bound, accepted)" if noise.too_noisy() else "")
    return build_profile(schedule, per_rank, name, backend, scenario, note)


def calibrate(scenario, source: str, nproc: int, *, backend: str = "gloo", out=None, timeout_s: float = 300.0,
              accept_noise: bool = False, repeats: int = REPEATS):
    """Measure on nproc local processes the works of `scenario`'s schedule (pass it shrunk for CPU);
    returns the HardwareProfile and writes it to `out` when given (scenarios/profile.py save_profile).
    Too noisy a measurement writes nothing and raises (checked_profile). Fewer `repeats` (timed runs of
    each work) than REPEATS make a rougher profile of the same structure, sooner."""
    scenario = without_profile(scenario)
    schedule = build_schedule(resolve(scenario, source))
    payload = {"scenario": scenario.model_dump(mode="json"), "source": source, "repeats": repeats}
    load = load_per_core()  # before the workers add their own
    per_rank = launch("calibrate", payload, nproc, backend=backend, timeout_s=timeout_s)
    profile = checked_profile(schedule, per_rank, f"{scenario.name}-{backend}-{nproc}proc", backend, scenario.name,
                              load, accept_noise)
    if out is not None:
        save_profile(profile, out)
    return profile
