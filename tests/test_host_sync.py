"""The host's device-to-host syncs (sim/engine/host.py): an op with a host_wait is issued only after the op
it waits for has finished, and the ops after it that much later; closed-form event times, a negative
control without the sync, the host's call counts, and the checks on bad input."""

from __future__ import annotations

import pytest

from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import events as engine
from meshsim.sim.engine.host import delays_s, host_syncs, last_known
from meshsim.sim.schedule.ops import Elementwise, Gemm, Op, Schedule

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
