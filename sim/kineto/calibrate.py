"""A hardware profile (scenarios/profile.py) learnt from a trace of the scenario's own step: `meshsim
calibrate --from-trace PATH --scenario S`. No torch: the trace is read as data.

Per traced step (mean over steps and ranks), kernel class by kernel class, the measured time is shared
out over the scenario schedule's works of that class (sim/kineto/classify.py work_class), so that the
simulator, costing the same works from the profile, spends the traced time on them:
- GEMMs: a simulated shape that the trace recorded (Input Dims) gets its own measured TFLOP/s
  (FLOPs / mean kernel time); the others share the rest, rate = their FLOPs / the remaining GEMM time.
  One gemm_table row per simulated shape, so the nearest-shape lookup (sim/cost/compute.py) finds each.
- attention: kernel_table flash_attention_fwd / _bwd at the schedule's FLOPs per op, time = measured
  attention time (kernels named *bwd* / *backward* go to the backward) / simulated ops.
- norm: kernel_table rows for layernorm / layernorm_bwd at the schedule's bytes, one bandwidth for both
  (schedule bytes / measured norm time); elementwise_bw_gbps: the same for the other elementwise kernels.
  The optimizer step is costed from elementwise_bw_gbps by the compute model.
- collectives: every measured (op, group, bytes), its mean time as the traced ranks saw it (pass
  summaries with min_over_ranks=False: each rank's own kernel times, waits for a late peer included; the
  simulated ranks are symmetric and would not produce those waits themselves), algbw and busbw.
- launch gaps (compute.launch_overhead_us): the median gap between consecutive kernels of the busiest
  stream while it had work queued (gaps < 1500 us, HTA's kernel-kernel delay). On a CPU trace the time
  with nothing running (neither an operator nor a collective) is the executor's own time; spread over
  the compute operators, it is added to each op's time instead (the CPU is the device), and
  launch_overhead_us is 0.
- host dispatch (compute.host_dispatch_us): the host's own time per step (top-level operators of the
  launching threads, less the blocking CUDA calls inside them) / schedule ops per step; 0 on a CPU trace
  (the host is the device, as `meshsim calibrate` on gloo writes).
When the trace names every compute op of the schedule (`meshsim validate --trace` wraps each op in a
record_function of its name), each work is priced from its own ops' measured times instead
(labelled_points). Every row says how many measured kernels it rests on (`samples`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from meshsim.scenarios.profile import CollectivePoint, GemmPoint, GpuFigures, HardwareProfile, KernelPoint
from meshsim.scenarios.schema import ComputeTuning
from meshsim.sim.cost.collectives import busbw_factor
from meshsim.sim.kineto.classify import NORM_KERNELS, category, family, work_class
from meshsim.sim.kineto.critical_path import BLOCKING_CALLS, KERNEL_KERNEL_DELAY_THRESHOLD_US
from meshsim.sim.kineto.document import collective_table
from meshsim.sim.kineto.ranks import RankData
from meshsim.sim.kineto.step_summary import StepSummary
from meshsim.sim.schedule.ops import Attention, Elementwise, Gemm, Op, OptimizerStep, Schedule

PROFILE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _per_step(steps: Sequence[StepSummary], cls_of) -> dict[str, tuple[float, float]]:
    """group -> (mean seconds per step, mean kernels per step) over `steps`, kernel classes grouped by cls_of."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in steps:
        for cls, t in s.sum_s.items():
            slot = acc[cls_of(cls)]
            slot[0] += t / len(steps)
            slot[1] += s.count.get(cls, 0) / len(steps)
    return {k: (v[0], v[1]) for k, v in acc.items()}


def _gap_per_op_us(steps: Sequence[StepSummary]) -> float:
    """CPU trace: the executor's own time per compute operator: the step's time with nothing running
    (neither an operator nor a collective: waits for collectives are modelled by the simulator itself),
    over the step's compute operators."""
    ops = _mean([sum(n for c, n in s.count.items() if category(c) == "compute") for s in steps])
    return _mean([s.idle_s for s in steps]) * 1e6 / ops if ops else 0.0


def _gemm_points(ops: Sequence[Op], steps: Sequence[StepSummary], gemm_s: float, samples: int,
                 gap_us: float) -> list[GemmPoint]:
    works = [op.work for op in ops if isinstance(op.work, Gemm)]
    measured: dict[tuple, list[float]] = defaultdict(list)
    for s in steps:
        for g in s.gemms:
            measured[tuple(g.shape)].extend([g.mean_us + gap_us] * g.count)
    own = {w: measured[(w.m, w.n, w.k, w.batch)] for w in set(works) if measured.get((w.m, w.n, w.k, w.batch))}
    matched_us = sum(_mean(own[w]) for w in works if w in own)
    rest = [w for w in works if w not in own]
    rest_s = max(gemm_s - matched_us * 1e-6, 1e-12)
    rest_tflops = sum(w.flops for w in rest) / rest_s / 1e12 if rest else 0.0
    out = []
    for w in dict.fromkeys(works):
        if w in own:
            tflops, n = w.flops / (_mean(own[w]) * 1e-6) / 1e12, len(own[w]) // max(1, len(steps))
        else:
            tflops, n = rest_tflops, samples
        if tflops > 0:
            out.append(GemmPoint(m=w.m, n=w.n, k=w.k, batch=w.batch, tflops=tflops, samples=n))
    return out


def _attention_points(ops: Sequence[Op], steps: Sequence[StepSummary], ranks: Sequence[RankData],
                      gap_us: float) -> list[KernelPoint]:
    fwd = [op.work for op in ops if isinstance(op.work, Attention) and not op.work.backward]
    bwd = [op.work for op in ops if isinstance(op.work, Attention) and op.work.backward]
    times = {True: [], False: []}
    step_set = {(s.rank, s.step) for s in steps}
    for d in ranks:
        for k in d.kernels:
            if family(k.cls) == "attention" and k.cls != "attention.unfused":
                back = "bwd" in k.ev.name.lower() or "backward" in k.ev.name.lower()
                times[back].append(k.ev.dur + gap_us)
    n_steps = max(1, len(step_set))
    out = []
    for back, works in ((False, fwd), (True, bwd)):
        if works and times[back]:
            per_op_us = sum(times[back]) / n_steps / len(works)
            out.append(KernelPoint(kernel="flash_attention_bwd" if back else "flash_attention_fwd",
                                   flops=works[0].flops, time_us=per_op_us, samples=len(times[back]) // n_steps))
    return out


def _bandwidth(works: Sequence[Elementwise], seconds: float, count: int, launch_us: float) -> float | None:
    """Schedule bytes / (measured time - the launch overhead the model adds per op), GB/s."""
    nbytes = sum(w.bytes_read + w.bytes_written for w in works)
    net = seconds - len(works) * launch_us * 1e-6
    return nbytes / net / 1e9 if works and count and net > 0 else None


def _collective_points(steps: Sequence[StepSummary]) -> list[CollectivePoint]:
    out = []
    for r in collective_table(steps):
        if r["op"] not in PROFILE_OPS or not r["group"] or r["mean_us"] <= 0 or not r["bytes"]:
            continue
        algbw = r["bytes"] / (r["mean_us"] * 1e-6) / 1e9
        out.append(CollectivePoint(op=r["op"], ranks=r["group"], nbytes=r["bytes"], time_us=r["mean_us"],
                                   algbw_gbps=algbw, busbw_gbps=algbw * busbw_factor(r["op"], r["group"]),
                                   samples=r["count"]))
    return out


def launch_gap_us(ranks: Sequence[RankData], queued_only: bool = True) -> tuple[float, int]:
    """(median gap, gaps) between consecutive kernels of the busiest stream while work was queued (any
    gap under the threshold with `queued_only` False: a CPU trace, where nothing is queued)."""
    gaps = []
    for d in ranks:
        by_stream: dict[int, list] = defaultdict(list)
        for k in d.kernels:
            if category(k.cls) == "compute":
                by_stream[k.ev.stream].append(k)
        if not by_stream:
            continue
        busiest = max(by_stream.values(), key=len)
        for a, b in zip(busiest, busiest[1:], strict=False):
            gap = b.ev.ts - a.ev.end
            queued = 0 <= b.launch.ts <= a.ev.end or not queued_only
            if 0 <= gap < KERNEL_KERNEL_DELAY_THRESHOLD_US and queued:
                gaps.append(gap)
    return (statistics.median(gaps), len(gaps)) if gaps else (0.0, 0)


def host_busy_s(d: RankData, window: tuple[float, float]) -> float:
    """The host's own time in a step: top-level cpu_ops of launching threads, less blocking calls inside."""
    threads = {k.launch.tid for k in d.kernels if k.launch.ts >= 0}
    busy, blocked, top_end = 0.0, 0.0, {}
    for op in d.trace.host:
        if op.tid not in threads or not window[0] <= op.ts < window[1]:
            continue
        if op.name in BLOCKING_CALLS:
            blocked += op.dur
        elif op.cat == "cpu_op" and op.ts >= top_end.get(op.tid, float("-inf")):
            top_end[op.tid] = op.end
            busy += op.dur
    return max(0.0, busy - blocked) * 1e-6


def _label_times_us(steps: Sequence[StepSummary], gap_us: float) -> dict[str, tuple[float, int]]:
    """schedule op name -> (its mean time per step in us, device events per run) over the steps: an op
    name is one op of the step, its time the sum of its device events plus `gap_us` after each."""
    acc: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for s in steps:
        for name, (t, n) in s.labels.items():
            acc[name].append((t * 1e6 + n * gap_us, n))
    return {name: (_mean([t for t, _ in v]), round(_mean([n for _, n in v]))) for name, v in acc.items()}


def labelled_points(ops: Sequence[Op], steps: Sequence[StepSummary], gap_us: float, launch_us: float):
    """(gemm rows, kernel rows, elementwise GB/s) from each schedule op's own measured time, when the trace
    names every compute op of the schedule (`meshsim validate --trace`); None otherwise.
    GEMMs: TFLOP/s per shape (mean over the ops of that shape); attention and elementwise kernels: their
    time at their FLOPs / bytes; elementwise_bw_gbps from the optimizer step (params x bytes per param
    / its time less the launch overhead), the one memory-bound work without a table row."""
    times = _label_times_us(steps, gap_us)
    compute = [op for op in ops if category(work_class(op.work)) == "compute"]
    if not compute or any(op.name not in times for op in compute):
        return None
    by_work: dict[object, list[float]] = defaultdict(list)
    for op in compute:
        by_work[op.work].append(times[op.name][0])
    n = max(1, len(steps))
    gemms = [GemmPoint(m=w.m, n=w.n, k=w.k, batch=w.batch, tflops=w.flops / (_mean(t) * 1e-6) / 1e12,
                       samples=len(t) * n) for w, t in by_work.items() if isinstance(w, Gemm)]
    kernels = []
    for w, t in by_work.items():
        if isinstance(w, Attention):
            kernels.append(KernelPoint(kernel="flash_attention_bwd" if w.backward else "flash_attention_fwd",
                                       flops=w.flops, time_us=_mean(t), samples=len(t) * n))
        elif isinstance(w, Elementwise):
            kernels.append(KernelPoint(kernel=w.kernel, bytes=w.bytes_read + w.bytes_written, time_us=_mean(t),
                                       samples=len(t) * n))
    opt = [(w, _mean(t)) for w, t in by_work.items() if isinstance(w, OptimizerStep)]
    bw = None
    if opt and opt[0][1] > launch_us:
        w, t = opt[0]
        bw = w.params * w.bytes_per_param / ((t - launch_us) * 1e-6) / 1e9
    return gemms, kernels, bw


def profile_from_trace(ranks: Sequence[RankData], steps: Sequence[StepSummary], schedule: Schedule,
                       name: str, scenario: str) -> HardwareProfile:
    """The HardwareProfile of the traced steps for `schedule` (module docstring)."""
    cpu = any(d.trace.cpu_device for d in ranks)
    gap_us = _gap_per_op_us(steps) if cpu else 0.0
    launch_us, n_gaps = (0.0, 0) if cpu else launch_gap_us(ranks)
    ops = [op for op in schedule.ops]
    samples: dict[str, int] = {}
    labelled = labelled_points(ops, steps, gap_us, launch_us)
    if labelled is not None:
        gemms, kernels, elem_bw = labelled
        if elem_bw:
            samples["elementwise_bw_gbps"] = len({s.step for s in steps})
    else:
        gemms, kernels, elem_bw = _class_points(ops, steps, ranks, gap_us, launch_us, samples)
    dispatch = 0.0 if cpu else _dispatch_us(ranks, steps, len(ops))
    samples["compute.host_dispatch_us"] = sum(s.kernels for s in steps) // max(1, len(steps))
    samples["compute.launch_overhead_us"] = n_gaps
    best = max((g.tflops for g in gemms), default=None)
    on = {"source": "trace", "trace": ", ".join(d.trace.path for d in ranks), "device": ranks[0].trace.device_name,
          "backend": str(ranks[0].trace.backend), "steps": str(len({s.step for s in steps})),
          "ranks": str(len(ranks)), "scenario": scenario}
    return HardwareProfile(
        name=name, measured_on=on,
        gpu=GpuFigures(peak_tflops=best, mem_bw_gbps=elem_bw) if cpu else GpuFigures(),
        compute=ComputeTuning(launch_overhead_us=launch_us, host_dispatch_us=dispatch),
        gemm_table=gemms, elementwise_bw_gbps=elem_bw, kernel_table=kernels,
        collective_table=_collective_points(steps), samples=samples)


def _class_points(ops: Sequence[Op], steps: Sequence[StepSummary], ranks: Sequence[RankData], gap_us: float,
                  launch_us: float, samples: dict[str, int]):
    """(gemm rows, kernel rows, elementwise GB/s) from each kernel class's measured time (module docstring)."""
    by_class, fam = _per_step(steps, lambda c: c), _per_step(steps, family)
    classes = defaultdict(list)
    for op in ops:
        if not isinstance(op.work, Gemm | Attention):
            classes[work_class(op.work)].append(op)
    gemm_s, gemm_n = fam.get("gemm", (0.0, 0.0))
    gemm_n_ops = sum(isinstance(op.work, Gemm) for op in ops)
    gemms = _gemm_points(ops, steps, gemm_s + gap_us * 1e-6 * gemm_n_ops, int(gemm_n), gap_us)
    kernels = _attention_points(ops, steps, ranks, gap_us)
    norm = [op.work for op in classes["norm"] if isinstance(op.work, Elementwise)]
    norm_s, norm_n = by_class.get("norm", (0.0, 0.0))
    norm_bw = _bandwidth(norm, norm_s + gap_us * 1e-6 * len(norm), int(norm_n), 0.0)
    if norm_bw:
        kernels += [KernelPoint(kernel=k, bytes=b, time_us=b / (norm_bw * 1e9) * 1e6, samples=int(norm_n))
                    for k, b in {w.kernel: w.bytes_read + w.bytes_written for w in norm
                                 if w.kernel in NORM_KERNELS}.items()]
    elem = [op.work for op in classes["elementwise"] if isinstance(op.work, Elementwise)]
    elem_s, elem_n = by_class.get("elementwise", (0.0, 0.0))
    elem_bw = _bandwidth(elem, elem_s + gap_us * 1e-6 * len(elem), int(elem_n), launch_us)
    if elem_bw:
        samples["elementwise_bw_gbps"] = int(elem_n)
    return gemms, kernels, elem_bw


def _dispatch_us(ranks: Sequence[RankData], steps: Sequence[StepSummary], ops_per_step: int) -> float:
    by_rank = {d.trace.rank: d for d in ranks}
    busy = [host_busy_s(by_rank[s.rank], (s.start_us, s.start_us + s.span_s * 1e6)) for s in steps]
    return _mean(busy) * 1e6 / ops_per_step if ops_per_step else 0.0
