"""Perfetto traces of a measured run, alone and side by side with its simulation (sim/outputs/trace.py format).

The merged trace holds the simulated ranks as pids 0.. ("sim rank N") and the measured ranks as pids
MEASURED_PID_OFFSET.. ("measured rank N"), each with its own critical-path flow arrows (flow ids offset so
they never collide). Open it in https://ui.perfetto.dev.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.engine.events import Event
from meshsim.sim.outputs.trace import trace_document, trace_events, write_trace
from meshsim.sim.results.critical_path import Segment

MEASURED_PID_OFFSET = 1000
MEASURED_FLOW_BASE = 1_000_000


def write_measured_trace(path: str | Path, events: Iterable[Event], critical_path: Sequence[Segment] = ()) -> Path:
    return write_trace(path, events, critical_path, process_prefix="measured")


def write_merged_trace(path: str | Path, sim_events: Iterable[Event], sim_path: Sequence[Segment],
                       measured: Iterable[Event], measured_path: Sequence[Segment]) -> Path:
    """One trace: simulated (pids 0..) above measured (pids MEASURED_PID_OFFSET..)."""
    events = trace_events(sim_events, sim_path, process_prefix="sim")
    events += trace_events(measured, measured_path, pid_offset=MEASURED_PID_OFFSET, process_prefix="measured",
                           flow_id_base=MEASURED_FLOW_BASE)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_finite(trace_document(events), separators=(",", ":")))
    return path
