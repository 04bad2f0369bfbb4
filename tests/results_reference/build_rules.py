"""tiling's per-op rules for loose ops, the long way its column checks (sim/schedule/tiling.py _all_plain,
_int64_column) replace; tests/test_build_shortcuts.py compares them."""

from __future__ import annotations

from meshsim.sim.schedule.ops import Op
from meshsim.sim.schedule.stencil import STREAM_INDEX
from meshsim.sim.schedule.tiling import NONE


def int_or_none(v: object) -> bool:
    return v is None or type(v) is int and NONE < v < 2**63


def plain(op: Op) -> bool:
    """A loose op the arrays can hold as it is: a known stream, and host calls, deps and host wait (or None)
    as ints the np.intc columns take, the wait not negative (-1 stands for None). Any other op is left to
    the long way, whose check (sim/engine/events.py) names it; the rest of the check (calls not negative,
    deps among the positions, a wait on an earlier op) reads the columns."""
    wait = op.host_wait
    return (op.stream in STREAM_INDEX and fits(op.host_calls) and (wait is None or fits(wait) and wait >= 0)
            and all(map(fits, op.deps)))


def fits(v: object) -> bool:
    return type(v) is int and -2**31 <= v < 2**31
