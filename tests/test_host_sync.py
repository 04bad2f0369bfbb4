"""The host's device-to-host syncs (sim/engine/host.py): an op with a host_wait is issued only after the op
it waits for has finished, and the ops after it that much later; closed-form event times, a negative
control without the sync, the host's call counts, and the checks on bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_moe_schedule import layer_ops, names, tiny
from test_steady_state import resolved

from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import events as engine
from meshsim.sim.engine.host import delays_s, host_syncs, last_known
from meshsim.sim.results import period_proof
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.simulate import simulate_steady
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm, Op, Schedule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from accuracy_moe import block_ops, block_time_ms, layer_scenario  # noqa: E402
from accuracy_rows import lone_kernel_compute_fn  # noqa: E402

US = 1e-6
DURATION_US = {"long": 100.0, "short": 1.0}


def _ops(wait: int | None, calls: int = 2) -> tuple[Op, ...]:
    """long (100 us), then two 1 us kernels, each depending on the one before; the second waits on the
    host for `wait` and the third takes `calls` host calls."""
    return (Op(0, "long", "compute", "compute", "fwd", Gemm(1, 1, 1)),
            Op(1, "short", "compute", "compute", "fwd", Elementwise("a", 1, 1), (0,), host_wait=wait),
            Op(2, "short", "compute", "compute", "fwd", Elementwise("b", 1, 1), (1,), host_calls=calls))


def _run(ops: tuple[Op, ...], dispatch_us: float = 10.0) -> dict[int, tuple[float, float]]:
    sched = Schedule(ops, 1, 1, 1)
    log = engine.run(sched, (0,), lambda op, r: DURATION_US[op.name] * US, None,
                     issue_s=issue_times_s(sched, dispatch_us * US))
    return {e.op_id: (e.start_s / US, e.end_s / US) for e in log.events}


def test_a_sync_makes_the_next_ops_wait_for_the_host():
    """Host at 10 us per op: long is issued at 10 and ends at 110. The host waits for it before issuing
    the next op, which it issues at 110 + 10 = 120 (not at 20: the stream was free at 110), and the one
    after at 130: each short kernel now waits for its own dispatch."""
    times = _run(_ops(wait=0))
    assert times[0] == pytest.approx((10.0, 110.0))
    assert times[1] == pytest.approx((120.0, 121.0))
    assert times[2] == pytest.approx((130.0, 131.0))


def test_without_a_sync_the_host_runs_ahead():
    """Negative control: the same ops with no host_wait run back to back after long (today's times)."""
    times = _run(_ops(wait=None))
    assert times[1] == pytest.approx((110.0, 111.0))
    assert times[2] == pytest.approx((111.0, 112.0))


def test_host_calls_scale_the_dispatch():
    """An op of 6 host calls takes three dispatches of two calls: issued 30 us after the one before."""
    sched = Schedule(_ops(wait=0, calls=6), 1, 1, 1)
    assert issue_times_s(sched, 10 * US) == pytest.approx((10 * US, 20 * US, 50 * US))
    assert _run(_ops(wait=0, calls=6))[2] == pytest.approx((150.0, 151.0))


def test_the_delay_is_a_running_maximum_read_back_from_the_ends():
    """D = max(0, end of the awaited op - the static clock before the waiting op) = 110 - 10 = 100 us,
    known once long has ended."""
    ops = _ops(wait=0)
    syncs = host_syncs(ops, issue_times_s(Schedule(ops, 1, 1, 1), 10 * US))
    assert syncs.point_of == (-1, 0, 0) and syncs.awaited == (0,) and syncs.base_s == pytest.approx((10 * US,))
    ends = {0: 110 * US}
    assert delays_s(syncs, ends.__getitem__) == pytest.approx([100 * US])
    assert last_known(syncs, ends.__getitem__, 109 * US) == -1 and last_known(syncs, ends.__getitem__, 110 * US) == 0
    assert host_syncs(ops, ()) is None and host_syncs(_ops(wait=None), (1.0, 2.0, 3.0)) is None


def test_no_host_model_no_sync():
    """Without host dispatch (CUDA graphs: no issue times) a sync changes nothing."""
    sched = Schedule(_ops(wait=0), 1, 1, 1)
    log = engine.run(sched, (0,), lambda op, r: DURATION_US[op.name] * US, None)
    assert log.step_time_s == pytest.approx(102 * US)


@pytest.mark.parametrize("wait, calls", [(2, 2), (5, 2), (None, -1)])
def test_bad_host_fields_are_refused(wait, calls):
    """An op waiting for itself or a later op, or a negative call count."""
    ops = (*_ops(wait=None)[:2],
           Op(2, "short", "compute", "compute", "fwd", Elementwise("b", 1, 1), (1,), host_calls=calls, host_wait=wait))
    with pytest.raises(ValueError, match="host"):
        engine.check_inputs(Schedule(ops, 1, 1, 1), (0,))


# ----- the MoE layer's syncs (sim/schedule/moe_sync.py) ----------------------------------------------------
def _syncs(overrides: dict) -> dict[str, tuple[str, int]]:
    """Layer 1, micro-batch 0: waiting op -> (the op its host waits for, its host calls)."""
    ops = [op for phase in ("fwd", "bwd") for op in layer_ops(tiny(overrides), phase=phase)]
    by_id = {op.id: op for op in ops}
    short = dict(zip((op.id for op in ops), names(ops), strict=True))
    out = {short[op.id]: (short[op.host_wait], op.host_calls) for op in ops if op.host_wait is not None}
    assert all(by_id[op.id].phase == "fwd" for op in ops if op.host_wait is not None)  # none in the backward
    return out


@pytest.mark.parametrize("overrides, expected", [
    ({"parallel.ep": 4}, {"dispatch": ("dispatch_meta", 3)}),
    ({"parallel.ep": 1}, {"expert_fc1": ("route", 5)}),
    ({"parallel.ep": 4, "parallel.moe_dispatcher": "allgather"},
     {"permute": ("moe_gather", 10), "expert_fc1": ("permute", 7)}),
    ({"parallel.ep": 4, "parallel.moe_dispatcher": "flex", "parallel.moe_flex_backend": "hybridep"},
     {"dispatch": ("route", 2)}),
    ({"parallel.ep": 4, "parallel.moe_dispatcher": "flex", "parallel.moe_flex_backend": "deepep"},
     {"dispatch": ("route", 2)}),
    ({"parallel.ep": 4, "parallel.moe_dispatcher": "flex", "parallel.moe_flex_backend": "deepep",
      "run.fp8": "blockwise"},
     {"dispatch": ("route", 2), "permute": ("dispatch", 15), "expert_fc1_fp8_quant": ("permute", 3 + 2)}),
])
def test_moe_forward_syncs_per_dispatcher(overrides, expected):
    """Each dispatcher's syncs and the calls the host makes after them, as moe_sync.py counts them from the
    source (2 local experts here: 8 experts over ep 4); the backward has none."""
    assert _syncs(overrides) == expected


def test_a_sync_that_binds_moves_the_forward_only_by_its_host_calls():
    """HybridEP on one DGX H100 (the moe-layer benchmark's Mixtral proxy): the host waits for the router
    before it issues the dispatch, so the GPU idles for that op's dispatch (2 calls = 20 us); the backward
    and a run without syncs are unchanged."""
    rs = layer_scenario("mixtral", "hybridep")
    synced = [op for op in block_ops(rs, False) if op.host_wait is not None]
    assert [(op.name, op.host_calls) for op in synced] == [("fwd.dispatch", 2)]
    assert block_time_ms(rs, False) - _serial_ms(rs, False) == pytest.approx(0.020, abs=1e-9)
    assert block_time_ms(rs, True) == pytest.approx(_serial_ms(rs, True), rel=1e-12)


def _serial_ms(rs, backward: bool) -> float:
    """The block's ops back to back (no host): the sum of their times, at the burst clock the layer benchmark's
    rows are priced at (sim/cost/gemm_ceiling.py)."""
    compute, coster = lone_kernel_compute_fn(rs), CollectiveCoster(rs)
    total = 0.0
    for op in block_ops(rs, backward):
        if isinstance(op.work, Collective):
            latency, bandwidth, _ = coster.cost(op.work, rs.group(op.work.group, 0))[0]
            total += latency + bandwidth
        else:
            total += compute(op, 0)
    return total * 1e3


def test_the_steady_state_proof_checks_the_hosts_sync_delay(monkeypatch):
    """Qwen3 (HybridEP, a sync per MoE forward) extrapolates, its host's delay growing by T - H per period;
    with that growth perturbed (1 us more per sync) the proof refuses and says why (negative control)."""
    rs = resolved("qwen3-30b-a3b-h100-ep16", {"model.layers": 2})
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    real = period_proof.delays_s
    monkeypatch.setattr(period_proof, "delays_s", lambda syncs, end_of: [d + i * US for i, d in
                                                                           enumerate(real(syncs, end_of))])
    ex, why = simulate_steady(rs, force=True)
    assert ex is None and "the host's delay at its sync" in why
