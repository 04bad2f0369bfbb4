"""Where one rank's step time goes, from its event log (interval arithmetic on its three streams).

- compute, tp_comm, dp_comm: busy time of that stream (union of its slices; a comm slice includes its
  rendezvous wait, during which the NCCL kernel occupies the stream).
- exposed_comm: time when some comm stream is busy and the compute stream is idle
  = |tp U dp U compute| - |compute|.
- idle: step time minus the union of all busy time.
With pipeline parallelism (`pipeline_breakdown`) two keys join them:
- pp_comm: union of the rank's P2P transfers (from when both ends had posted; counted in exposed_comm
  when compute is idle);
- pipeline_bubble: time the rank is wholly idle while its stage waits for a neighbour: while one of
  its P2P batches waits for the peer to post, and the tail from the rank's last op to the end of the
  step (set by the slowest stage); idle is what remains.
Layer spans (layer_fwd_ms / layer_bwd_ms): first start to last end of one transformer layer's ops of
micro-batch 0 (compute and comm), for the middle layer of the model.
"""

from __future__ import annotations

from collections.abc import Iterable

from meshsim.sim.engine.events import Event

Interval = tuple[float, float]
# the keys of StepResult.breakdown_s: busy time per stream (they overlap), then exposed comm and idle
BREAKDOWN_KEYS = ("compute", "tp_comm", "dp_comm", "exposed_comm", "idle")


def union_s(intervals: Iterable[Interval]) -> float:
    """Measure of the union of [start, end) intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def breakdown(events: Iterable[Event], step_time_s: float) -> dict[str, float]:
    """{compute, tp_comm, dp_comm, exposed_comm, idle} in seconds for the events of one rank."""
    by_stream: dict[str, list[Interval]] = {"compute": [], "tp_comm": [], "dp_comm": []}
    for ev in events:
        if ev.end_s > ev.start_s:
            by_stream.setdefault(ev.stream, []).append((ev.start_s, ev.end_s))
    busy = {s: union_s(iv) for s, iv in by_stream.items()}
    comm = by_stream["tp_comm"] + by_stream["dp_comm"]
    all_busy_s = union_s(comm + by_stream["compute"])
    return {
        "compute": busy["compute"],
        "tp_comm": busy["tp_comm"],
        "dp_comm": busy["dp_comm"],
        "exposed_comm": all_busy_s - busy["compute"],
        "idle": max(0.0, step_time_s - all_busy_s),
    }


def _neighbour_waits(events: list[Event], step_time_s: float) -> list[Interval]:
    """While a P2P batch waits for its peer to post, plus the tail from the rank's last op to the step end."""
    waits = [(ev.start_s, ev.start_s + ev.wait_s) for ev in events if ev.stream == "pp_comm" and ev.wait_s > 0]
    last_s = max((ev.end_s for ev in events), default=0.0)
    if step_time_s > last_s:
        waits.append((last_s, step_time_s))
    return waits


def pipeline_breakdown(events: Iterable[Event], step_time_s: float) -> dict[str, float]:
    """breakdown() plus pp_comm and pipeline_bubble for one rank of a pipeline stage (module docstring)."""
    events = list(events)
    by_stream: dict[str, list[Interval]] = {"compute": [], "tp_comm": [], "dp_comm": [], "pp_comm": []}
    for ev in events:
        start_s = ev.start_s + ev.wait_s if ev.stream == "pp_comm" else ev.start_s
        if ev.end_s > start_s:
            by_stream[ev.stream].append((start_s, ev.end_s))
    busy = {s: union_s(iv) for s, iv in by_stream.items()}
    all_iv = [iv for ivs in by_stream.values() for iv in ivs]
    all_busy_s = union_s(all_iv)
    with_gaps_s = union_s(all_iv + _neighbour_waits(events, step_time_s))
    return {
        "compute": busy["compute"], "tp_comm": busy["tp_comm"], "dp_comm": busy["dp_comm"],
        "pp_comm": busy["pp_comm"], "exposed_comm": all_busy_s - busy["compute"],
        "pipeline_bubble": with_gaps_s - all_busy_s, "idle": max(0.0, step_time_s - with_gaps_s),
    }


def middle_layer(events: Iterable[Event]) -> int | None:
    layers = sorted({ev.layer for ev in events if ev.layer is not None})
    return layers[len(layers) // 2] if layers else None


def layer_span_ms(events: Iterable[Event], layer: int | None, phases: tuple[str, ...]) -> float:
    """Span (ms) of the ops of `layer` in `phases`, micro-batch 0 (all of them if none is numbered)."""
    sel = [ev for ev in events if ev.layer == layer and ev.phase in phases]
    sel = [ev for ev in sel if ev.micro_batch == 0] or sel
    if layer is None or not sel:
        return 0.0
    return (max(ev.end_s for ev in sel) - min(ev.start_s for ev in sel)) * 1e3
