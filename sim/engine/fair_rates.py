"""The arbiter's rates: max-min fair progressive filling over the loads of the jobs draining at once.

fair_rates(loads) is the definition (sim/engine/arbiter.py's module docstring: capacity 1 per link, each
job capped at its standalone speed). fair_rates_of_arrays computes the same floats from numpy's summed
loads, and, given the loads' numbers (arbiter.MemoRates: equal ordered items, equal number), reuses the
filling of an earlier call with the same inputs to it (`_HOT_RATES`, below).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from meshsim.sim.cost.collectives.maxmin import maxmin_rates

LinkLoad = Mapping[Hashable, float]  # link index -> load; ("cpu", rank) -> load on a compute resource
_HOT = 1.0 + 1e-12  # fair_rates' test of a link that can bind
MAX_ENTRIES = 1 << 16  # per table; a full table is emptied (a sweep of many scenarios)
_RESOURCE_INDEX: dict[Hashable, int] = {}  # a load's resource key -> a dense index (never reused)
_RESOURCES: list[Hashable] = []  # the inverse: index -> resource key
_HOT_RATES: dict[tuple, list[float]] = {}  # (hot resources in insertion order, touching loads' numbers) -> rates


def fair_rates(loads: Sequence[LinkLoad]) -> list[float]:
    """Rates in (0, 1] of concurrent collectives with these link loads (capacity 1 per link).

    Only links whose summed load exceeds 1 can bind (all rates are <= 1), so the others are dropped
    before progressive filling; a private resource -(j+1) of capacity 1 caps job j at its standalone
    speed, letting the surplus go to the others."""
    if len(loads) == 1:
        return [1.0]
    total: dict[int, float] = {}
    for load in loads:
        for lk, w in load.items():
            total[lk] = total.get(lk, 0.0) + w
    hot = {lk for lk, w in total.items() if w > _HOT}
    if not hot:
        return [1.0] * len(loads)
    return _rates_of_hot(loads, hot)


def _rates_of_hot(loads: Sequence[LinkLoad], hot: set, touching: Sequence[bool] | None = None) -> list[float]:
    """fair_rates' filling once its binding candidates `hot` are known. `touching[j]` False: load j has
    no hot resource, so its demand is its private resource alone (what the comprehension gives it)."""
    demands = [{**{lk: load[lk] for lk in hot if load.get(lk, 0.0) > 0}, -(j + 1): 1.0}
               if touching is None or touching[j] else {-(j + 1): 1.0} for j, load in enumerate(loads)]
    capacity = {lk: 1.0 for d in demands for lk in d}
    return [min(1.0, r) for r in maxmin_rates(demands, capacity)]


def load_arrays(load: LinkLoad) -> tuple[np.ndarray, np.ndarray]:
    """A load mapping's resources as dense indices and their loads, in the mapping's item order."""
    idx = []
    for lk in load:
        i = _RESOURCE_INDEX.get(lk)
        if i is None:
            i = _RESOURCE_INDEX[lk] = len(_RESOURCES)
            _RESOURCES.append(lk)
        idx.append(i)
    return np.asarray(idx, dtype=np.intp), np.asarray(list(load.values()), dtype=np.float64)


def fair_rates_of_arrays(loads: Sequence[LinkLoad], arrays: Sequence[tuple[np.ndarray, np.ndarray]],
                         numbers: Sequence[int] | None = None) -> list[float]:
    """fair_rates(loads) with its summed loads taken by numpy (`arrays`: load_arrays of each load).

    np.bincount adds the weights into zeros in array order (numpy's arr_bincount loop): per resource in
    job order, each job's load once, the same IEEE additions as fair_rates' dict loop (0.0 + w, then + each
    later job's w), so the same links pass the threshold. They are put in the hot set in the order of
    their first appearance (the dict's insertion order), so the set, built by the same insertions into an
    empty set, iterates as fair_rates' does, and the demands, capacities and maxmin_rates call that follow
    are fair_rates' own: the same floats.

    `numbers`: each load's number (equal number, equal items in the same order). The filling's inputs are
    then fixed by the hot resources in insertion order (which fix the set's iteration order) and, per job,
    the number of a load that has a hot resource or the mark -1 of one that has none (its demand is its
    private resource alone, whatever its items): equal keys, equal demands, equal floats (_HOT_RATES)."""
    if len(loads) == 1:
        return [1.0]
    idx = np.concatenate([a[0] for a in arrays])
    total = np.bincount(idx, weights=np.concatenate([a[1] for a in arrays])) if len(idx) else np.zeros(0)
    over = np.flatnonzero(total > _HOT)
    if not len(over):
        return [1.0] * len(loads)
    present, first = np.unique(idx, return_index=True)  # sorted resources, each one's first position in idx
    order = over[np.argsort(first[np.searchsorted(present, over)])].tolist()  # first positions are distinct
    hot = set()
    for k in order:
        hot.add(_RESOURCES[k])
    if numbers is None:
        return _rates_of_hot(loads, hot)
    touching = _touching(arrays, idx, over, len(total))
    key = (tuple(order), tuple(n if t else -1 for n, t in zip(numbers, touching, strict=True)))
    rates = _HOT_RATES.get(key)
    if rates is None:
        if len(_HOT_RATES) >= MAX_ENTRIES:
            _HOT_RATES.clear()
        rates = _HOT_RATES[key] = _rates_of_hot(loads, hot, touching)
    return rates


def _touching(arrays: Sequence[tuple[np.ndarray, np.ndarray]], idx: np.ndarray, over: np.ndarray,
              resources: int) -> list[bool]:
    """Per load: whether any of its resources is among `over` (the hot ones)."""
    mask = np.zeros(resources, dtype=bool)
    mask[over] = True
    owner = np.repeat(np.arange(len(arrays)), [len(a[0]) for a in arrays])
    return (np.bincount(owner[mask[idx]], minlength=len(arrays)) > 0).tolist()
