"""Parent side of timing: launch the workers, reduce their raw times, and express the run in the
simulator's own terms (Event log, critical path) so it can be written and compared like a simulation.

Reductions (documented in docs/validate.md):
- pipelines: every rank runs its stage's schedule (rank r is on stage r // (tp dp)); op times are reduced
  over the ranks of a stage, per stage, and a P2P batch counts as a collective below;
- op time: in each timed step, the mean over ranks for a compute op, the min over ranks for a
  collective (the last rank out of the barrier waits for nobody: its interval is the collective's own,
  which is what the simulator's collective time means; the others include their wait); then the median
  (op_s) and the mean (op_mean_s) over steps. Sums over ops (category totals, the replay) use the mean:
  a sum of many heavy-tailed op times tracks the sum of their means, not of their medians;
- step time: for each as-scheduled step the max over ranks (with pp > 1: the slowest stage's), then the
  median over steps;
- the measured trace: every rank's timed step whose total is its median, as sim Events (pid = rank);
- the measured critical path: the schedule replayed by the simulator's engine with the measured mean op
  times (sim/engine/events.py + sim/results/critical_path.py), so "which ops set the step time" is defined the same
  way for both runs. With pp > 1 the replay runs one rank per stage with free P2P transfers (a batch
  ends when its peer posts), so the measured compute and collectives set its bubbles.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from meshsim.scenarios.load import resolve
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.engine.events import Event, EventLog, run, work_bytes
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import P2P, Collective, Schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.validate.launch.launch import launch


@dataclass(frozen=True)
class Measured:
    schedules: tuple[Schedule, ...]  # one per pipeline stage (one without PP)
    op_s: tuple[dict[int, float], ...]  # per stage: op id -> median seconds (reduced over the stage's ranks)
    op_mean_s: tuple[dict[int, float], ...]  # per stage: op id -> mean seconds
    step_s: float  # as-scheduled step time (median over steps of the max over ranks)
    timed_step_s: float  # the timed (serial, barriered) step: median over steps of the max over ranks
    events: tuple[Event, ...]  # every rank's median timed step
    numerics: list | None  # per-rank numerics rows when requested
    steps_s: tuple[float, ...] = ()  # every as-scheduled step (max over ranks), in order: their spread is the noise

    @property
    def stage_size(self) -> int:
        return self.schedules[0].tp * self.schedules[0].dp

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_size

    def replay(self) -> EventLog:
        """The schedules on the simulator's engine with the measured op times (one rank per stage)."""
        def compute_s(op, rank):
            return self.op_mean_s[self.stage_of(rank)][op.id]

        def collective(op, group):
            return self.op_mean_s[self.stage_of(group[0])][op.id], 0.0, {}

        if len(self.schedules) == 1:  # groups: engine.run's symmetric default
            return run(self.schedules[0], (0,), compute_s, collective)
        s0 = self.schedules[0]
        ranks = tuple(stage * self.stage_size for stage in range(len(self.schedules)))
        return run(self.schedules, ranks, compute_s, collective,
                   lambda kind, rank: mesh_group(kind, rank, s0.tp, s0.dp, s0.kv_replicas, len(self.schedules)),
                   stage_of=self.stage_of, p2p=lambda src, dst, nbytes: (0.0, 0.0, {}))


def reduce_op_times(schedule: Schedule, per_rank: list[dict], stat) -> dict[int, float]:
    """op id -> per step, min over ranks (collectives, P2P batches) or mean (compute); then stat (median or
    fmean) over steps. per_rank: the ranks that run `schedule`."""
    out = {}
    for i, op in enumerate(schedule.ops):
        reduce = min if isinstance(op.work, Collective | P2P) else statistics.fmean
        per_step = [reduce([r["timed"][k][i][1] for r in per_rank]) for k in range(len(per_rank[0]["timed"]))]
        out[op.id] = stat(per_step)
    return out


def _median_step(steps: list[list[list[float]]]) -> list[list[float]]:
    totals = [s[-1][0] + s[-1][1] for s in steps]
    order = sorted(range(len(steps)), key=totals.__getitem__)
    return steps[order[len(order) // 2]]


def measured_events(schedules: Sequence[Schedule], per_rank: list[dict]) -> tuple[Event, ...]:
    events = []
    stage_size = schedules[0].tp * schedules[0].dp
    for r in per_rank:
        schedule = schedules[r["rank"] // stage_size]
        for op, (start_s, dur_s) in zip(schedule.ops, _median_step(r["timed"]), strict=True):
            events.append(Event(r["rank"], op.id, op.name, op.stream, op.category, op.phase, op.layer,
                                op.micro_batch, start_s, start_s + dur_s, 0.0, work_bytes(op), op.flops))
    return tuple(events)


def reduce_run(schedules: Schedule | Sequence[Schedule], per_rank: list[dict]) -> Measured:
    """Measured from every rank's raw results; schedules: one per pipeline stage (or the one schedule)."""
    schedules = (schedules,) if isinstance(schedules, Schedule) else tuple(schedules)
    size = schedules[0].tp * schedules[0].dp
    stage_ranks = [[r for r in per_rank if r["rank"] // size == stage] for stage in range(len(schedules))]
    steps = [max(vals) for vals in zip(*(r["step_s"] for r in per_rank), strict=True)]
    timed = [max(vals) for vals in zip(*([s[-1][0] + s[-1][1] for s in r["timed"]] for r in per_rank),
                                       strict=True)]
    stats = [tuple(reduce_op_times(s, rs, stat) for s, rs in zip(schedules, stage_ranks, strict=True))
             for stat in (statistics.median, statistics.fmean)]
    return Measured(schedules, *stats, statistics.median(steps), statistics.median(timed),
                    measured_events(schedules, per_rank),
                    [r["numerics"] for r in per_rank] if per_rank[0].get("numerics") is not None else None,
                    tuple(steps))


def schedule_of(scenario: Scenario, source: str) -> Schedule:
    """The whole model's schedule (calibration's works)."""
    return build_schedule(resolve(scenario, source))


def stage_schedules_of(scenario: Scenario, source: str) -> tuple[Schedule, ...]:
    """One schedule per pipeline stage, as the timing workers run them."""
    return build_stage_schedules(resolve(scenario, source))


def measure(scenario: Scenario, source: str, nproc: int, *, backend: str = "gloo", warmup: int = 2,
            repeats: int = 5, numerics: dict | None = None, timeout_s: float = 300.0) -> Measured:
    """Run the scenario's schedule for real on nproc local processes (validate/launch/launch.py)."""
    payload = {"scenario": scenario.model_dump(mode="json"), "source": source, "warmup": warmup,
               "repeats": repeats, "numerics": numerics}
    per_rank = launch("timing", payload, nproc, backend=backend, timeout_s=timeout_s)
    return reduce_run(stage_schedules_of(scenario, source), per_rank)
