"""Parent side of timing: launch the workers, reduce their raw times, and express the run in the
simulator's own terms (Event log, critical path) so it can be written and compared like a simulation.

Reductions (documented in docs/validate.md):
- op time: in each timed step, the mean over ranks for a compute op, the min over ranks for a
  collective (the last rank out of the barrier waits for nobody: its interval is the collective's own,
  which is what the simulator's collective time means; the others include their wait); then the median
  (op_s) and the mean (op_mean_s) over steps. Sums over ops (category totals, the replay) use the mean:
  a sum of many heavy-tailed op times tracks the sum of their means, not of their medians;
- step time: for each as-scheduled step the max over ranks, then the median over steps;
- the measured trace: every rank's timed step whose total is its median, as sim Events (pid = rank);
- the measured critical path: the schedule replayed by the simulator's engine with the measured mean op
  times (sim/engine/events.py + sim/results/critical_path.py), so "which ops set the step time" is defined the same
  way for both runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from meshsim.scenarios.load import resolve
from meshsim.scenarios.schema import Scenario
from meshsim.sim.engine.events import Event, EventLog, run, work_bytes
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import Collective, Schedule
from meshsim.validate.launch.launch import launch


@dataclass(frozen=True)
class Measured:
    schedule: Schedule
    op_s: dict[int, float]  # op id -> median seconds (reduced over ranks)
    op_mean_s: dict[int, float]  # op id -> mean seconds (reduced over ranks)
    step_s: float  # as-scheduled step time (median over steps of the max over ranks)
    timed_step_s: float  # the timed (serial, barriered) step: median over steps of the max over ranks
    events: tuple[Event, ...]  # every rank's median timed step
    numerics: list | None  # per-rank numerics rows when requested

    def replay(self) -> EventLog:
        """The schedule on the simulator's engine with the measured op times (one symmetric rank)."""
        def compute_s(op, rank):
            return self.op_mean_s[op.id]

        def collective(op, group):
            return self.op_mean_s[op.id], 0.0, {}

        return run(self.schedule, (0,), compute_s, collective)  # groups: engine.run's symmetric default


def reduce_op_times(schedule: Schedule, per_rank: list[dict], stat) -> dict[int, float]:
    """op id -> per step, min over ranks (collectives) or mean (compute); then stat (median or fmean)
    over steps."""
    out = {}
    for i, op in enumerate(schedule.ops):
        reduce = min if isinstance(op.work, Collective) else statistics.fmean
        per_step = [reduce([r["timed"][k][i][1] for r in per_rank]) for k in range(len(per_rank[0]["timed"]))]
        out[op.id] = stat(per_step)
    return out


def _median_step(steps: list[list[list[float]]]) -> list[list[float]]:
    totals = [s[-1][0] + s[-1][1] for s in steps]
    order = sorted(range(len(steps)), key=totals.__getitem__)
    return steps[order[len(order) // 2]]


def measured_events(schedule: Schedule, per_rank: list[dict]) -> tuple[Event, ...]:
    events = []
    for r in per_rank:
        for op, (start_s, dur_s) in zip(schedule.ops, _median_step(r["timed"]), strict=True):
            events.append(Event(r["rank"], op.id, op.name, op.stream, op.category, op.phase, op.layer,
                                op.micro_batch, start_s, start_s + dur_s, 0.0, work_bytes(op), op.flops))
    return tuple(events)


def reduce_run(schedule: Schedule, per_rank: list[dict]) -> Measured:
    steps = [max(vals) for vals in zip(*(r["step_s"] for r in per_rank), strict=True)]
    timed = [max(vals) for vals in zip(*([s[-1][0] + s[-1][1] for s in r["timed"]] for r in per_rank),
                                       strict=True)]
    return Measured(schedule, reduce_op_times(schedule, per_rank, statistics.median),
                    reduce_op_times(schedule, per_rank, statistics.fmean), statistics.median(steps),
                    statistics.median(timed), measured_events(schedule, per_rank),
                    [r["numerics"] for r in per_rank] if per_rank[0].get("numerics") is not None else None)


def schedule_of(scenario: Scenario, source: str) -> Schedule:
    return build_schedule(resolve(scenario, source))


def measure(scenario: Scenario, source: str, nproc: int, *, backend: str = "gloo", warmup: int = 2,
            repeats: int = 5, numerics: dict | None = None, timeout_s: float = 300.0) -> Measured:
    """Run the scenario's schedule for real on nproc local processes (validate/launch/launch.py)."""
    payload = {"scenario": scenario.model_dump(mode="json"), "source": source, "warmup": warmup,
               "repeats": repeats, "numerics": numerics}
    per_rank = launch("timing", payload, nproc, backend=backend, timeout_s=timeout_s)
    return reduce_run(schedule_of(scenario, source), per_rank)
