"""Where one rank's step time goes, from its event log (interval arithmetic on its streams).

Busy time per stream (the streams run concurrently, so these overlap and do not add up to the step):
- compute_busy, tp_comm_busy, dp_comm_busy (and pp_comm_busy with pipeline parallelism): union of that
  stream's slices (a collective's slice includes its rendezvous wait, during which the NCCL kernel
  occupies the stream; a P2P transfer counts from when both ends had posted).
What the compute stream does not do (these add up to compute_waiting = step - compute_busy, the time the
compute stream has nothing it may run):
- exposed_tp_comm = |tp U compute| - |compute|: TP communication runs while compute waits;
- exposed_dp_comm_only = |dp U tp U compute| - |tp U compute|: only DP communication runs (e.g. the
  distributed optimizer's parameter all-gathers, the gradient reduce-scatters);
- exposed_ep_comm (MoE layers): |ep U tp U compute| - |tp U compute|: the expert-parallel dispatch /
  combine (and expert-TP collectives) run while compute waits and no TP collective does; the DP term is
  then measured past them (|dp U ep U tp U compute| - |ep U tp U compute|);
- exposed_cp_comm (cp > 1): |cp U ep U tp U compute| - |ep U tp U compute|: context parallelism's KV ring,
  all-to-alls or KV all-gathers run while compute waits and no TP or EP collective does; the DP term is
  then measured past them too;
- exposed_pp_comm_only (pp > 1): only P2P transfers run;
- pipeline_bubble (pp > 1): nothing runs while the stage waits for a neighbour: while one of its P2P
  batches waits for the peer to post, and the tail from the rank's last op to the step's end;
- nothing_running: no stream busy otherwise.
exposed_comm = the sum of the exposed_* terms = |all comm U compute| - |compute|; compute_waiting_at_start is
the part of compute_waiting before the first compute op.
The partition of the step a report leads with is the critical path's (sim/results/critical_path.py):
its categories (compute, TP, DP, P2P communication, pipeline bubble, waiting) add up to the step.
Layer spans (layer_fwd_ms / layer_bwd_ms): first start to last end of one transformer layer's ops of
micro-batch 0 (compute and comm), for the middle layer of the model; DP traffic is not part of it (FSDP's
weight gathers, issued one block ahead, and gradient reduce-scatters: sim/schedule/fsdp_ops.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from meshsim.sim.engine.events import Event

Interval = tuple[float, float]
# the keys of StepResult.breakdown_s: busy time per stream (they overlap), then the compute stream's waiting
BREAKDOWN_KEYS = ("compute_busy", "tp_comm_busy", "dp_comm_busy", "compute_waiting", "compute_waiting_at_start",
                  "exposed_comm", "exposed_tp_comm", "exposed_dp_comm_only", "nothing_running")
PIPELINE_BREAKDOWN_KEYS = BREAKDOWN_KEYS + ("pp_comm_busy", "exposed_pp_comm_only", "pipeline_bubble")
EP_BREAKDOWN_KEYS = ("ep_comm_busy", "exposed_ep_comm")  # present when the step has MoE layers
CP_BREAKDOWN_KEYS = ("cp_comm_busy", "exposed_cp_comm")  # present when cp > 1
# results written before these names: old key -> new key (read by compare and sweeps for old files)
LEGACY_KEYS = {"compute": "compute_busy", "tp_comm": "tp_comm_busy", "dp_comm": "dp_comm_busy",
               "pp_comm": "pp_comm_busy", "idle": "nothing_running"}


def upgrade_breakdown(old: Mapping[str, float], step_time_s: float) -> dict[str, float]:
    """A breakdown_s written with the old keys (compute, tp_comm, dp_comm, exposed_comm, idle, ...) -> the
    current keys; compute_waiting = step - compute busy; the part before the first op is unknown (0)."""
    if "compute_busy" in old:
        return dict(old)
    new = {LEGACY_KEYS.get(k, k): v for k, v in old.items()}
    new.setdefault("compute_waiting", max(0.0, step_time_s - new.get("compute_busy", 0.0)))
    new.setdefault("compute_waiting_at_start", 0.0)
    return new


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


def _busy_intervals(events: list[Event], pipeline: bool) -> dict[str, list[Interval]]:
    by_stream: dict[str, list[Interval]] = {"compute": [], "tp_comm": [], "dp_comm": []}
    if pipeline:
        by_stream["pp_comm"] = []
    for ev in events:
        start_s = ev.start_s + ev.wait_s if ev.stream == "pp_comm" else ev.start_s
        if ev.end_s > start_s:
            by_stream.setdefault(ev.stream, []).append((start_s, ev.end_s))
    return by_stream


def _neighbour_waits(events: list[Event], step_time_s: float) -> list[Interval]:
    """While a P2P batch waits for its peer to post, plus the tail from the rank's last op to the step end."""
    waits = [(ev.start_s, ev.start_s + ev.wait_s) for ev in events if ev.stream == "pp_comm" and ev.wait_s > 0]
    last_s = max((ev.end_s for ev in events), default=0.0)
    if step_time_s > last_s:
        waits.append((last_s, step_time_s))
    return waits


def breakdown(events: Iterable[Event], step_time_s: float, *, pipeline: bool = False) -> dict[str, float]:
    """BREAKDOWN_KEYS (PIPELINE_BREAKDOWN_KEYS with `pipeline`) in seconds for the events of one rank."""
    events = list(events)
    iv = _busy_intervals(events, pipeline)
    compute, tp, dp = iv["compute"], iv["tp_comm"], iv["dp_comm"]
    ep, cp = iv.get("ep_comm"), iv.get("cp_comm")
    busy_compute = union_s(compute)
    with_tp = union_s(tp + compute)
    with_ep = union_s(ep + tp + compute) if ep else with_tp
    with_cp = union_s(cp + (ep or []) + tp + compute) if cp else with_ep
    with_dp = union_s(dp + (cp or []) + (ep or []) + tp + compute)
    all_busy = union_s([i for ivs in iv.values() for i in ivs])
    first_compute_s = min((start for start, _ in compute), default=step_time_s)
    out = {"compute_busy": busy_compute, "tp_comm_busy": union_s(tp), "dp_comm_busy": union_s(dp),
           "compute_waiting": max(0.0, step_time_s - busy_compute), "compute_waiting_at_start": first_compute_s,
           "exposed_comm": all_busy - busy_compute, "exposed_tp_comm": with_tp - busy_compute,
           "exposed_dp_comm_only": with_dp - with_cp}
    if ep:
        out.update(ep_comm_busy=union_s(ep), exposed_ep_comm=with_ep - with_tp)
    if cp:
        out.update(cp_comm_busy=union_s(cp), exposed_cp_comm=with_cp - with_ep)
    if not pipeline:
        return {**out, "nothing_running": max(0.0, step_time_s - all_busy)}
    with_gaps = union_s([i for ivs in iv.values() for i in ivs] + _neighbour_waits(events, step_time_s))
    return {**out, "pp_comm_busy": union_s(iv["pp_comm"]), "exposed_pp_comm_only": all_busy - with_dp,
            "pipeline_bubble": with_gaps - all_busy, "nothing_running": max(0.0, step_time_s - with_gaps)}


def middle_layer(events: Iterable[Event]) -> int | None:
    layers = sorted({ev.layer for ev in events if ev.layer is not None})
    return layers[len(layers) // 2] if layers else None


def layer_span_ms(events: Iterable[Event], layer: int | None, phases: tuple[str, ...]) -> float:
    """Span (ms) of the ops of `layer` in `phases`, micro-batch 0 (all of them if none is numbered)."""
    sel = [ev for ev in events if ev.layer == layer and ev.phase in phases and ev.stream != "dp_comm"]
    sel = [ev for ev in sel if ev.micro_batch == 0] or sel
    if layer is None or not sel:
        return 0.0
    return (max(ev.end_s for ev in sel) - min(ev.start_s for ev in sel)) * 1e3


EP_OPS = ("fwd.dispatch", "fwd.combine", "bwd.dispatch", "bwd.combine")  # op types (sim/schedule/op_keys.py)


def ep_layer_ms(events: Iterable[Event]) -> dict[str, float]:
    """One MoE layer's token all-to-alls (ms, rendezvous wait excluded): the middle layer that has them,
    micro-batch 0, per op type of EP_OPS ({} for a model without them)."""
    ep = [ev for ev in events if ev.layer is not None and ev.name.split(".", 2)[-1] in EP_OPS]
    layer = middle_layer(ep)
    sel = [ev for ev in ep if ev.layer == layer]
    sel = [ev for ev in sel if ev.micro_batch == 0] or sel
    out: dict[str, float] = {}
    for ev in sel:
        key = ev.name.split(".", 2)[-1]
        out[key] = out.get(key, 0.0) + (ev.dur_s - ev.wait_s) * 1e3
    return {k: out[k] for k in EP_OPS if k in out}
