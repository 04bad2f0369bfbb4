"""Max-min fair sharing by progressive filling: the project's one flow-sharing model.

Flow i uses resource l with demand d_i[l] (capacity units per unit of rate). All unfrozen flows rise at a
common rate t; resource l saturates at t_l = (cap_l - frozen load_l) / (sum of its unfrozen demands).
The smallest t_l fixes the rate of every flow crossing a saturated resource; repeat until no flow is
left. The result is the unique max-min fair allocation (Bertsekas & Gallager, Data Networks, 6.5.2).
Resources that saturate at one level are frozen in the order flows first use them (a dict, not a set:
a set of ("cpu", rank) keys iterates in string-hash order, which changes per process with PYTHONHASHSEED,
and the order of the frozen-load subtractions moves the last bits of later levels).

Cost: O(iterations x (flows x resources per flow)), where iterations = number of distinct bottleneck
levels, a handful for symmetric collectives. Flows with no positive demand get rate inf.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence

try:  # the same filling as C loops (_maxmin.pyx), built by setup.py when a compiler is there
    import meshsim.sim.cost.collectives._maxmin as _maxmin
except ImportError:  # no compiled extension: the reference below runs
    _maxmin = None

_REL_TOL = 1e-9  # resources within this relative distance of the bottleneck level saturate together
_FACTOR = 1 + _REL_TOL  # limit = level x _FACTOR + _TINY
_TINY = 1e-300
_PLAIN_SUM = sys.version_info < (3, 12)  # sum() of floats adds left to right before 3.12, compensated after


def compiled_phase_rates(own: Sequence, extra: Sequence, capacity_bps: list[float]):
    """phases._phase_rates as the compiled loop (_maxmin.phase_rates) with this module's saturation constants;
    None when the extension is not built or the input is outside what it covers (the caller runs the reference)."""
    if _maxmin is None:
        return None
    return _maxmin.phase_rates(own, extra, capacity_bps, _FACTOR, _TINY, _PLAIN_SUM)


def _usage(demands: Sequence[Mapping[int, float]]) -> dict[int, list[tuple[int, float]]]:
    users: dict[int, list[tuple[int, float]]] = {}
    for i, demand in enumerate(demands):
        for res, w in demand.items():
            if w > 0:
                users.setdefault(res, []).append((i, w))
    return users


def maxmin_rates(demands: Sequence[Mapping[int, float]],
                 capacity: Mapping[int, float] | Callable[[int], float]) -> list[float]:
    """Max-min fair rates r_i with sum_i d_i[l] r_i <= cap[l] for every resource l (progressive filling):
    the compiled transliteration (_maxmin.pyx) when it is built and covers the input (dict demands, float
    weights), else maxmin_rates_reference; the same floats either way (tests/test_maxmin_compiled.py)."""
    if _maxmin is not None:
        rates = _maxmin.maxmin_rates(demands if type(demands) is list else list(demands), capacity,
                                     _FACTOR, _TINY, _PLAIN_SUM)
        if rates is not None:
            return rates
    return maxmin_rates_reference(demands, capacity)


def maxmin_rates_reference(demands: Sequence[Mapping[int, float]],
                           capacity: Mapping[int, float] | Callable[[int], float]) -> list[float]:
    """maxmin_rates in Python, the reference: progressive filling as the module docstring states it."""
    cap_of = capacity if callable(capacity) else capacity.__getitem__
    users = _usage(demands)
    rates = [math.inf] * len(demands)
    frozen = [True] * len(demands)
    for lst in users.values():
        for i, _ in lst:
            frozen[i] = False
    left = {res: float(cap_of(res)) for res in users}
    weight = {res: sum(w for _, w in lst) for res, lst in users.items()}
    active = {res: len(lst) for res, lst in users.items()}
    open_res = dict.fromkeys(users)  # ordered: resources tighten in first-use order, whatever their hash
    while open_res:
        level = min(max(left[r], 0.0) / weight[r] for r in open_res)
        limit = level * _FACTOR + _TINY
        tight = [r for r in open_res if max(left[r], 0.0) / weight[r] <= limit]
        for res in tight:
            for i, _ in users[res]:
                if not frozen[i]:
                    frozen[i] = True
                    rates[i] = level
                    _freeze(i, level, demands[i], left, weight, active, open_res)
            open_res.pop(res, None)
    return rates


def _freeze(i: int, rate: float, demand: Mapping[int, float], left: dict[int, float],
            weight: dict[int, float], active: dict[int, int], open_res: dict[int, None]) -> None:
    """Move flow i's demand from the active weight to the frozen load of each resource it uses."""
    for res, w in demand.items():
        if w <= 0:
            continue
        left[res] -= w * rate
        weight[res] -= w
        active[res] -= 1
        if active[res] == 0:
            open_res.pop(res, None)
