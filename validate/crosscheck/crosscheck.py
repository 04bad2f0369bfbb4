"""Cross-check: simulate the shrunk scenario with a calibrated profile, run it for real, compare.

Reported (and written with --json):
- step time: simulated vs measured (as-scheduled step, validate/timing/measured.py), error_pct = 100 (sim -
  measured) / measured. With pp > 1 both are the slowest stage's: the simulator runs the shrunk scenario's
  pipeline (one rank per stage) and the measured step is the max over every rank. Also
  simulated_serial_s, the simulated representative rank's busy time summed as if nothing overlapped
  (compute + communication; with pp > 1 the largest over the stages' representatives), and its error: on a CPU, gloo's copies and reductions run on the
  same cores as the compute, so communication the simulator overlaps (GPU-style: NCCL on its own SMs /
  copy engines) is not free there, and the measured step falls between the two figures;
- per category (compute, tp_comm, dp_comm, pp_comm): busy time of the simulated representative rank (sum of
  op durations, rendezvous waits excluded; with pp > 1 summed over one rank per stage) vs the sum of the
  measured per-op means (summed over the stages' schedules), and their error. A measured P2P batch includes
  the wait for its peer (validate/timing/worker.py);
- critical-path agreement: the share of the step each category holds on the simulated path
  (sim/results/critical_path.py) and on the measured one (the same walk over the schedule replayed with measured
  op times), side by side; and the ops on both paths: Jaccard |A & B| / |A | B| of the op-name sets.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from meshsim.scenarios.library import source_dir
from meshsim.scenarios.load import resolve
from meshsim.scenarios.schema import Scenario
from meshsim.sim.results.critical_path import Segment, critical_path, shares
from meshsim.sim.results.simulate import simulate
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.schedule.ops import STREAMS
from meshsim.validate.calibrate.calibration import calibrate
from meshsim.validate.calibrate.noise import load_per_core, step_noise
from meshsim.validate.calibrate.sampling import REPEATS
from meshsim.validate.launch.launch import launch
from meshsim.validate.launch.shrink import shrink, timing_rule, with_profile, without_profile
from meshsim.validate.numerics.check import merge, numerics_payload
from meshsim.validate.timing.measured import Measured, reduce_run, stage_schedules_of
from meshsim.validate.timing.trace_merge import write_measured_trace, write_merged_trace


def error_pct(simulated: float, measured: float) -> float | None:
    return 100.0 * (simulated - measured) / measured if measured > 0 else None


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def path_names(path: Iterable[Segment]) -> set[str]:
    return {seg.name for seg in path if seg.op_id is not None}


def busy_by_stage(sim_events, measured: Measured) -> dict[int, dict[str, float]]:
    """stage -> category -> busy seconds of the stage's lowest simulated rank (waits excluded)."""
    reps: dict[int, int] = {}
    for ev in sim_events:
        stage = measured.stage_of(ev.rank)
        reps[stage] = min(reps.get(stage, ev.rank), ev.rank)
    busy: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for ev in sim_events:
        if ev.rank == reps[measured.stage_of(ev.rank)]:
            busy[measured.stage_of(ev.rank)][ev.category] += ev.end_s - ev.start_s - ev.wait_s
    return busy


def category_times(sim_events, measured: Measured) -> dict[str, dict]:
    sim = defaultdict(float)
    for stage_busy in busy_by_stage(sim_events, measured).values():
        for c, t in stage_busy.items():
            sim[c] += t
    real = defaultdict(float)
    for schedule, mean_s in zip(measured.schedules, measured.op_mean_s, strict=True):
        for op in schedule.ops:
            real[op.category] += mean_s[op.id]
    return {c: {"simulated_s": sim[c], "measured_s": real[c], "error_pct": error_pct(sim[c], real[c])}
            for c in STREAMS if sim[c] or real[c]}


@dataclass(frozen=True)
class CrossCheck:
    report: dict  # the --json document
    sim_path: tuple[Segment, ...]
    measured_path: tuple[Segment, ...]


def compare(result: StepResult, measured: Measured, numerics_ok: bool | None,
            load: tuple[float | None, int] = (None, 0)) -> CrossCheck:
    """result: the StepResult of simulating the same shrunk scenario with the calibrated profile; load: the
    load average per core before the timed run (validate/calibrate/noise.py), reported with its steps' excess."""
    replay = measured.replay()
    pipeline = len(measured.schedules) > 1
    m_crit = critical_path(measured.schedules, replay)
    m_path = tuple(m_crit)
    m_share = shares(m_crit, replay.step_time_s, pipeline)
    s_path = result.critical_path
    a, b = path_names(s_path), path_names(m_path)
    share = {c: {"simulated": result.critical_path_share.get(c, 0.0), "measured": m_share.get(c, 0.0)}
             for c in (*STREAMS, *(("pipeline_bubble",) if pipeline else ()), "waiting")}
    categories = category_times(result.events, measured)
    serial_s = max(sum(busy.values()) for busy in busy_by_stage(result.events, measured).values())
    report = {
        "scenario": result.scenario, "numerics_ok": numerics_ok, "pp": len(measured.schedules),
        "simulated_step_s": result.step_time_s, "measured_step_s": measured.step_s,
        "error_pct": error_pct(result.step_time_s, measured.step_s),
        "simulated_serial_s": serial_s, "error_serial_pct": error_pct(serial_s, measured.step_s),
        "replayed_step_s": replay.step_time_s, "timed_step_s": measured.timed_step_s,
        "categories": categories, "noise": step_noise(measured.steps_s, load).as_record(),
        "critical_path_agreement": {"share": share, "jaccard": jaccard(a, b), "on_both": len(a & b),
                                    "only_simulated": sorted(a - b), "only_measured": sorted(b - a)},
    }
    return CrossCheck(report, s_path, m_path)


def timing_payload(scenario: Scenario, source: str, nproc: int, backend: str, *, repeats: int = 5,
                   numerics: bool = True) -> tuple[Scenario, list, dict]:
    """(shrunk scenario, numerics variants, worker payload of task "timing") for nproc processes."""
    shrunk = without_profile(shrink(scenario, nproc, timing_rule(backend), source))
    variants, checks = numerics_payload(scenario, source, nproc, [""]) if numerics else ([], None)
    payload = {"scenario": shrunk.model_dump(mode="json"), "source": source, "warmup": 2, "repeats": repeats,
               "numerics": checks}
    return shrunk, variants, payload


def finish(shrunk: Scenario, source: str, profile: str, variants: list, measured: Measured,
           out: Path | None, load: tuple[float | None, int] = (None, 0)) -> CrossCheck:
    """Simulate the shrunk scenario with the profile, compare with the measured run, write the traces."""
    result = simulate(resolve(with_profile(shrunk, profile), source), full=True)  # compared op by op
    numerics_ok = None
    if measured.numerics is not None:
        numerics_ok = all(r.ok for r in merge(variants, measured.numerics, source, compare_ops=False))
    check = compare(result, measured, numerics_ok, load)
    if out is not None:
        write_measured_trace(out / "trace_measured.json", measured.events, check.measured_path)
        write_merged_trace(out / "trace_merged.json", result.events, check.sim_path, measured.events,
                           check.measured_path)
    return check


def write_traced_scenario(shrunk: Scenario, source: str, trace_dir: Path) -> Path:
    """trace_dir/scenario.yaml: the shrunk scenario the traced steps ran (a topology file made absolute)."""
    data = shrunk.model_dump(mode="json", exclude_none=True)
    if shrunk.topology.file is not None:
        data["topology"]["file"] = str((source_dir(source) / shrunk.topology.file).resolve())
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / "scenario.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_crosscheck(scenario: Scenario, source: str, nproc: int, *, profile: str | None = None,
                   out_dir: str | Path | None = None, backend: str = "gloo", repeats: int = 5,
                   numerics: bool = True, trace_dir: str | Path | None = None,
                   accept_noise: bool = False, calibration_repeats: int = REPEATS) -> CrossCheck:
    """Shrink -> calibrate (unless `profile`) -> run for real (with the numerics check of the scenario's
    own variant in the same processes) -> simulate with the profile -> compare. Writes profile.yaml (when
    calibrated), trace_measured.json and trace_merged.json into out_dir; with trace_dir, Kineto traces of
    extra as-scheduled steps (validate/timing/profiled.py) and the shrunk scenario they ran there.
    calibration_repeats: timed runs of each work in the calibration (fewer: rougher, sooner).
    A calibration too noisy to trust raises before anything is written, unless accept_noise
    (validate/calibrate/noise.py); the timed run's own excess and load are in the report ("noise")."""
    out = Path(out_dir) if out_dir is not None else None
    shrunk, variants, payload = timing_payload(scenario, source, nproc, backend, repeats=repeats,
                                               numerics=numerics)
    if trace_dir is not None:
        payload["trace_dir"] = str(Path(trace_dir).resolve())
        write_traced_scenario(shrunk, source, Path(trace_dir))
    if profile is None:
        if out is None:
            raise ValueError("run_crosscheck needs out_dir to write the calibrated profile into")
        profile = str(out / "profile.yaml")
        calibrate(shrunk, source, nproc, backend=backend, out=profile, accept_noise=accept_noise,
                  repeats=calibration_repeats)
    load = load_per_core()
    per_rank = launch("timing", payload, nproc, backend=backend, timeout_s=300.0)
    measured = reduce_run(stage_schedules_of(shrunk, source), per_rank)
    return finish(shrunk, source, profile, variants, measured, out, load)
