"""SweepRecord: one configuration of a sweep and what became of it, typed from the run to the report.

A record is `ok` (its StepResult, without the op-by-op critical path and the event log: a sweep reads the
headline numbers, the breakdown and the critical-path shares) or `skipped` (the validation message that
refused the configuration). Dicts exist only at the JSON-lines boundary (`to_json` / `from_json`), which
carries RECORD_VERSION so a future layout can tell old lines apart.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from meshsim.scenarios.load import resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.userio import FileSnapshot, pinned_files
from meshsim.sim.results.simulate import gc_frozen, simulate
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.sweep.axes import SweepPoint, skip_reason

RECORD_VERSION = 1


@dataclass(frozen=True)
class SweepRecord:
    key: str  # SweepPoint.key, the resume key
    point: SweepPoint
    scenario_digest: str
    status: Literal["ok", "skipped"]
    result: StepResult | None = None  # when ok
    reason: str = ""  # when skipped
    elapsed_s: float = field(default=0.0, compare=False)  # wall time of its simulation, in its worker

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def fits(self) -> bool:
        return self.ok and self.result.memory_gb.fits

    @classmethod
    def ran(cls, point: SweepPoint, digest: str, result: StepResult) -> SweepRecord:
        lean = dataclasses.replace(result, critical_path=(), events=())
        # path_op_types is no init field (replace drops it): carried over, so critical_path_top is the run's
        object.__setattr__(lean, "path_op_types", tuple(result.top_op_types(sys.maxsize)))
        return cls(point.key, point, digest, "ok", lean)

    @classmethod
    def skipped(cls, point: SweepPoint, digest: str, reason: str) -> SweepRecord:
        return cls(point.key, point, digest, "skipped", reason=reason)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": RECORD_VERSION, "key": self.key, "config": asdict(self.point),
                               "scenario_digest": self.scenario_digest, "status": self.status,
                               "elapsed_s": self.elapsed_s}
        if self.ok:
            result = self.result.to_dict()
            del result["critical_path"]
            out["result"] = result
        else:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepRecord:
        """Inverse of to_json; ValueError (KeyError, TypeError) on a line that is not a record."""
        point = SweepPoint(**data["config"])
        if point.key != data["key"] or data["status"] not in ("ok", "skipped"):
            raise ValueError(f"not a sweep record: key {data['key']!r}, status {data['status']!r}")
        elapsed_s = float(data.get("elapsed_s", 0.0))
        if data["status"] == "skipped":
            return cls(point.key, point, data["scenario_digest"], "skipped", reason=str(data["reason"]),
                       elapsed_s=elapsed_s)
        return cls(point.key, point, data["scenario_digest"], "ok", StepResult.from_dict(data["result"]),
                   elapsed_s=elapsed_s)


def run_point(scenario, source: str, point: SweepPoint, digest: str = "",
              files: FileSnapshot | None = None) -> SweepRecord:
    """Resolve and simulate one configuration -> its record (never raises a UserError). `files` is the
    sweep's snapshot of the referenced files (axes.referenced_snapshot): the configuration reads them from
    it, not from the disk, so `digest` (computed from the same bytes) describes what it was computed from.

    The record keeps the StepResult without the op-by-op critical path (tens of thousands of segments,
    ~99% of a record's bytes); its `critical_path_share` is what sweeps explain and plot, and `meshsim run`
    on the configuration writes the full path. Results only: no trace, no timeline, the steady state
    extrapolated (sim/results/steady_state.py), the garbage collector off while it simulates; the result
    simulated lean (simulate's `lean`: the op-by-op path, events and op -> collective map never built)."""
    start_s = time.perf_counter()
    try:
        with pinned_files(files):
            rs = resolve(with_overrides(scenario, point.overrides(), source), source)
        with gc_frozen():
            record = SweepRecord.ran(point, digest, simulate(rs, lean=True))
    except UserError as err:
        record = SweepRecord.skipped(point, digest, skip_reason(err, source))
    return dataclasses.replace(record, elapsed_s=time.perf_counter() - start_s)
