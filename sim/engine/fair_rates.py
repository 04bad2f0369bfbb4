"""The arbiter's rates: max-min fair progressive filling over the loads of the jobs draining at once.

fair_rates(loads) is the definition (sim/engine/arbiter.py's module docstring: capacity 1 per link, each
job capped at its standalone speed), filled one connected component at a time: jobs are joined when they
load a common link that can bind (a "hot" one, summed load > 1), and each component is filled alone.
Max-min fairness is separable over such components (no constraint couples two of them, so the unique
max-min fair allocation of the union is the union of theirs; Bertsekas & Gallager 6.5.2), and filling
each alone gives it its own bottleneck levels exactly, where one filling of the union would merge levels of
unrelated components that fall within maxmin.py's relative tolerance of each other.

fair_rates_of_arrays computes the same floats from numpy's summed loads and, given the loads' numbers
(arbiter.MemoRates: equal ordered items, equal number), reuses the filling of an earlier call with the same
inputs (`_HOT_RATES`) and, below it, of an earlier component with the same inputs (`_COMPONENT_RATES`): a
step that simulates several pipeline stages at once drains collectives of every stage together, and
their combinations recur far less often than each stage's own.

The compiled core does not call this module per arbitration: sim/engine/_fair_rates.pxi (FairRates) does the
same steps as C loops over loads interned once per run, with the same memos, and asks the Python reference
only for loads its loops do not cover (tests/test_arbiter_compiled.py compares the two float for float).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from meshsim.sim.cost.collectives.maxmin import maxmin_rates

LinkLoad = Mapping[Hashable, float]  # link index -> load; ("cpu", rank) -> load on a compute resource
_HOT = 1.0 + 1e-12  # fair_rates' test of a link that can bind
MAX_ENTRIES = 1 << 16  # per table; a full table is emptied (a sweep of many scenarios)
_RESOURCE_INDEX: dict[Hashable, int] = {}  # a load's resource key -> a dense index (never reused)
_RESOURCES: list[Hashable] = []  # the inverse: index -> resource key
_HOT_RATES: dict[tuple, list[float]] = {}  # (hot resources in insertion order, touching loads' numbers) -> rates
_COMPONENT_RATES: dict[tuple, list[float]] = {}  # (a component's hot resources in order, its loads' numbers) -> rates


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
    hot = [lk for lk, w in total.items() if w > _HOT]  # in order of first appearance
    if not hot:
        return [1.0] * len(loads)
    hot_set = set(hot)
    pairs = [(j, lk) for j, load in enumerate(loads) for lk, w in load.items() if w > 0 and lk in hot_set]
    return _rates_of_hot(loads, _components(pairs, hot))


def _rates_of_hot(loads: Sequence[LinkLoad], comps: Sequence[tuple[Sequence[Hashable], Sequence[int]]],
                  numbers: Sequence[int] | None = None) -> list[float]:
    """fair_rates' filling once the connected components (hot links in order of first appearance, jobs in
    job order; _components) are known: per component, progressive filling over its jobs' demands (_fill).
    A job in no component (no positive load on a hot link) runs at 1. `numbers`: the loads' numbers, which
    with a component's hot links in order fix its demands, so equal keys reuse the same floats
    (_COMPONENT_RATES)."""
    rates = [1.0] * len(loads)
    for links, jobs in comps:
        key = None if numbers is None else (tuple(links), tuple(numbers[j] for j in jobs))
        part = _COMPONENT_RATES.get(key) if key is not None else None
        if part is None:
            part = _fill([loads[j] for j in jobs], links)
            if key is not None:
                if len(_COMPONENT_RATES) >= MAX_ENTRIES:
                    _COMPONENT_RATES.clear()
                _COMPONENT_RATES[key] = part
        for j, rate in zip(jobs, part, strict=True):
            rates[j] = rate
    return rates


def _components(pairs: Iterable[tuple[int, Hashable]], hot: Sequence[Hashable]) -> list[tuple[list, list[int]]]:
    """(hot links in `hot`'s order, jobs in job order) of each connected component of the jobs in `pairs`
    (job, hot link it loads, in job order), two jobs being connected when they load a common link;
    components in order of their first job."""
    parent: dict[int, int] = {}

    def root(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    first_user: dict[Hashable, int] = {}
    for j, lk in pairs:
        parent.setdefault(j, j)
        other = first_user.setdefault(lk, j)
        if other != j:
            parent[root(j)] = root(other)
    groups: dict[int, tuple[list, list[int]]] = {}
    for j in parent:
        groups.setdefault(root(j), ([], []))[1].append(j)
    for lk, j in first_user.items():
        groups[root(j)][0].append(lk)
    order = {lk: i for i, lk in enumerate(hot)}
    comps = sorted(groups.values(), key=lambda g: g[1][0])
    return [(sorted(links, key=order.__getitem__), jobs) for links, jobs in comps]


def _fill(loads: Sequence[LinkLoad], links: Sequence[Hashable]) -> list[float]:
    """Progressive filling of one component: job j's demand is its positive loads on `links` (in that
    order) and a private resource -(j + 1) of capacity 1 that caps it at its standalone speed."""
    demands = [{**{lk: load[lk] for lk in links if load.get(lk, 0.0) > 0}, -(j + 1): 1.0}
               for j, load in enumerate(loads)]
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
    """fair_rates(loads) with its summed loads taken from arrays (`arrays`: load_arrays of each load).

    hot_of_arrays sums each resource's load from 0.0 in job order, the same IEEE additions as fair_rates'
    dict loop (0.0 + w, then + each later job's w), so the same links pass the threshold; they are listed
    in the order of their first appearance (the dict's insertion order, fair_rates' list), so the
    components, demands, capacities and maxmin_rates calls that follow are fair_rates' own: the same floats.
    The compiled core's hot_of_arrays / components_of_arrays (sim/engine/_core.pyx) do these steps as C
    loops when it is built; the numpy ones below are their reference (tests/test_arbiter_memo.py).

    `numbers`: each load's number (equal number, equal items in the same order). The filling's inputs are
    then fixed by the hot resources in order and, per job, the number of a load that has a hot resource or
    the mark -1 of one that has none (it runs at 1, whatever its items): equal keys, equal demands, equal
    floats (_HOT_RATES; per component, _COMPONENT_RATES)."""
    if len(loads) == 1:
        return [1.0]
    arrays = arrays if type(arrays) is list else list(arrays)
    if numbers is None:
        order, _ = _hot_of(arrays)
        return _rates_of_hot(loads, _keyed_components(arrays, order)) if order else [1.0] * len(loads)
    order, marks = _hot_marks(arrays, numbers)
    if not order:
        return [1.0] * len(loads)
    key = (tuple(order), tuple(marks))
    rates = _HOT_RATES.get(key)
    if rates is None:
        if len(_HOT_RATES) >= MAX_ENTRIES:
            _HOT_RATES.clear()
        rates = _HOT_RATES[key] = _rates_of_hot(loads, _keyed_components(arrays, order), numbers)
    return rates


def _keyed_components(arrays: list[tuple[np.ndarray, np.ndarray]], order: list[int]) -> list[tuple[list, list[int]]]:
    """_components' lists (hot resource keys in order, jobs in order) from components_of_arrays' columns."""
    return [([_RESOURCES[order[c]] for c in cols], jobs) for cols, jobs in _components_of(arrays, order)]


def hot_of_arrays(arrays: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[list[int], list[bool]]:
    """(hot resource indices in order of first appearance, per load whether it has a hot resource); ([], [])
    when none is hot. np.bincount adds the weights into zeros in array order (numpy's arr_bincount loop):
    per resource, each job's load in job order."""
    idx, weights = np.concatenate([a[0] for a in arrays]), np.concatenate([a[1] for a in arrays])
    total = np.bincount(idx, weights=weights) if len(idx) else np.zeros(0)
    over = np.flatnonzero(total > _HOT)
    if not len(over):
        return [], []
    present, first = np.unique(idx, return_index=True)  # sorted resources, each one's first position in idx
    order = over[np.argsort(first[np.searchsorted(present, over)])].tolist()  # first positions are distinct
    owner = np.repeat(np.arange(len(arrays)), [len(a[0]) for a in arrays])
    return order, _touching(idx, owner, over, len(total), len(arrays))


def components_of_arrays(arrays: Sequence[tuple[np.ndarray, np.ndarray]], order: list[int]) -> list[tuple[list[int], list[int]]]:
    """_components from the arrays, as (columns: positions in `order`, ascending; jobs ascending), per
    component in order of its first job: a job x hot-resource incidence matrix of the positive loads, its
    job adjacency closed transitively by squaring (jobs are few)."""
    idx, weights = np.concatenate([a[0] for a in arrays]), np.concatenate([a[1] for a in arrays])
    owner = np.repeat(np.arange(len(arrays)), [len(a[0]) for a in arrays])
    jobs = len(arrays)
    column = np.full(max(int(idx.max()) + 1 if len(idx) else 0, max(order) + 1), -1, dtype=np.intp)
    column[order] = np.arange(len(order))
    keep = (column[idx] >= 0) & (weights > 0)
    uses = np.zeros((jobs, len(order)), dtype=np.int64)
    uses[owner[keep], column[idx[keep]]] = 1
    reach = (uses @ uses.T) > 0
    while True:
        wider = (reach.astype(np.int64) @ reach.astype(np.int64)) > 0
        if np.array_equal(wider, reach):
            break
        reach = wider
    comps, seen = [], np.zeros(jobs, dtype=bool)
    for j in np.flatnonzero(uses.any(axis=1)).tolist():
        if not seen[j]:
            members = reach[j]
            seen |= members
            comps.append((np.flatnonzero(uses[members].any(axis=0)).tolist(), np.flatnonzero(members).tolist()))
    return comps


def _touching(idx: np.ndarray, owner: np.ndarray, over: np.ndarray, resources: int, jobs: int) -> list[bool]:
    """Per load: whether any of its resources is among `over` (the hot ones); `owner`: each entry's load."""
    mask = np.zeros(resources, dtype=bool)
    mask[over] = True
    return (np.bincount(owner[mask[idx]], minlength=jobs) > 0).tolist()


def hot_marks_of_arrays(arrays: Sequence[tuple[np.ndarray, np.ndarray]],
                        numbers: Sequence[int]) -> tuple[list[int], list[int]]:
    """(hot resources in order, per load its number if it has a hot resource, else -1); ([], []) when
    none is hot."""
    order, touching = hot_of_arrays(arrays)
    if not order:
        return [], []
    return order, [n if t else -1 for n, t in zip(numbers, touching, strict=True)]


try:  # the same steps as C loops (sim/engine/_core.pyx); absent, the numpy ones run
    from meshsim.sim.engine._core import components_of_arrays as _components_of
    from meshsim.sim.engine._core import hot_of_arrays as _hot_of
    _hot_marks = _hot_of
except ImportError:
    _hot_of, _components_of, _hot_marks = hot_of_arrays, components_of_arrays, hot_marks_of_arrays
