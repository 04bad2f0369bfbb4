"""Link arbiter: how concurrent collectives share the network while their bandwidth parts drain.

Each collective's bandwidth part is an amount of work `work_s` (seconds it would take alone) and a link
load `{link_index: load}` (the fraction of each link's capacity it uses when running alone; the cost
model's `CollectiveCost.link_load`). While several collectives drain at once, each progresses at a rate
r in (0, 1] (1 = its standalone speed). Rates come from max-min fair progressive filling
(`meshsim.sim.cost.collectives.maxmin.maxmin_rates`, the project's one flow-sharing model) with capacity 1 per link:

    maximise min_j r_j  subject to  sum_j r_j * load_j[l] <= 1 for every link l,  r_j <= 1.

So two collectives that each saturate the same link run at 1/2 speed (take twice as long), and two on
disjoint links do not interact. A collective with no link load (one rank, or a measured time with no
route information) always runs at rate 1. Rates are recomputed whenever a collective starts or finishes.

Symmetric copies of one op (the same schedule op on different TP/DP groups, in the engine's
explicit-ranks mode) share one `key`: the cost model already priced their mutual contention through
`concurrent_groups`, so the arbiter counts them once (they drain at the rate of their key). A job may
also name `own` resources, loads on resources private to its copy (the compute resource of each of its
group's ranks, below): a key's demand is its first job's link load plus the union of its jobs' `own`
loads, so every copy's ranks are loaded, not only the first copy's.

Compute/communication interference (used only when the engine's kappa > 0; docs/cost-models.md): each
simulated rank r has a compute resource ("cpu", r) of capacity 1 (SMs and HBM on a GPU, cores on a CPU).
A compute op is a job with load {("cpu", r): 1}; a collective's bandwidth part adds {("cpu", m): kappa}
for each simulated member m of its group. The same filling then gives a compute op overlapping one
collective the rate 1 / (1 + kappa) on both (1 when alone): for a compute op of g seconds and a bandwidth
part of c <= g seconds starting together, both run at 1/(1+kappa) until the collective ends at
c (1 + kappa); the op's remaining g - c then runs alone, so it ends at g + kappa c.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from meshsim.sim.cost.collectives.maxmin import maxmin_rates
from meshsim.sim.engine.loop import Loop, Signal

LinkLoad = Mapping[Hashable, float]  # link index -> load; ("cpu", rank) -> load on a compute resource
RatesFn = Callable[[Sequence[LinkLoad]], list[float]]
_EPS_S = 1e-15  # remaining standalone seconds treated as done (float round-off of rate * dt)


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


def _rates_of_hot(loads: Sequence[LinkLoad], hot: set) -> list[float]:
    """fair_rates' filling once its binding candidates `hot` are known."""
    demands = [{**{lk: load[lk] for lk in hot if load.get(lk, 0.0) > 0}, -(j + 1): 1.0}
               for j, load in enumerate(loads)]
    capacity = {lk: 1.0 for d in demands for lk in d}
    return [min(1.0, r) for r in maxmin_rates(demands, capacity)]


_LOAD_NUMBERS: dict[tuple, int] = {}  # a load mapping's items, in order -> its number (never reused)
_NEXT_NUMBER = itertools.count()
_FAIR_RATES_BY_NUMBERS: dict[tuple[int, ...], list[float]] = {}  # shared by every MemoRates of fair_rates
_MAX_ENTRIES = 1 << 16  # per table; a full table is emptied (a sweep of many scenarios)
_HOT = 1.0 + 1e-12  # fair_rates' test of a link that can bind
_RESOURCE_INDEX: dict[Hashable, int] = {}  # a load's resource key -> a dense index (never reused)
_RESOURCES: list[Hashable] = []  # the inverse: index -> resource key


def _load_arrays(load: LinkLoad) -> tuple[np.ndarray, np.ndarray]:
    """A load mapping's resources as dense indices and their loads, in the mapping's item order."""
    idx = []
    for lk in load:
        i = _RESOURCE_INDEX.get(lk)
        if i is None:
            i = _RESOURCE_INDEX[lk] = len(_RESOURCES)
            _RESOURCES.append(lk)
        idx.append(i)
    return np.asarray(idx, dtype=np.intp), np.asarray(list(load.values()), dtype=np.float64)


def fair_rates_of_arrays(loads: Sequence[LinkLoad], arrays: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    """fair_rates(loads) with its summed loads taken by numpy (`arrays`: _load_arrays of each load).

    np.bincount adds the weights into zeros in array order (numpy's arr_bincount loop): per resource in
    job order, each job's load once, the same IEEE additions as fair_rates' dict loop (0.0 + w, then + each
    later job's w), so the same links pass the threshold. They are put in the hot set in the order of
    their first appearance (the dict's insertion order), so the set, built by the same insertions into an
    empty set, iterates as fair_rates' does, and the demands, capacities and maxmin_rates call that follow
    are fair_rates' own: the same floats."""
    if len(loads) == 1:
        return [1.0]
    idx = np.concatenate([a[0] for a in arrays])
    total = np.bincount(idx, weights=np.concatenate([a[1] for a in arrays])) if len(idx) else np.zeros(0)
    over = np.flatnonzero(total > _HOT)
    if not len(over):
        return [1.0] * len(loads)
    present, first = np.unique(idx, return_index=True)  # sorted resources, each one's first position in idx
    order = over[np.argsort(first[np.searchsorted(present, over)])]  # first positions are distinct
    hot = set()
    for k in order.tolist():
        hot.add(_RESOURCES[k])
    return _rates_of_hot(loads, hot)


class MemoRates:
    """fair_rates memoized exactly: first on the identity of the load mappings (the cost model memoizes
    them, so the same few combinations of concurrent collectives recur all step long), then on their
    items in order, numbered (equal mappings from another cost entry, or from an earlier engine run: the
    two short runs of a steady-state extrapolation share most of them). fair_rates reads only the items
    of each mapping, in order, so equal ordered items give bit-identical rates."""

    def __init__(self, rates: RatesFn = fair_rates):
        self._rates = rates
        self._memo: dict[tuple[int, ...], tuple[Sequence[LinkLoad], list[float]]] = {}
        self._number_of: dict[int, tuple[LinkLoad, int]] = {}  # id -> (the mapping, kept alive; its number)
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # number -> _load_arrays (fair_rates only)
        self._by_numbers: dict[tuple[int, ...], list[float]] = _FAIR_RATES_BY_NUMBERS if rates is fair_rates else {}

    def __call__(self, loads: Sequence[LinkLoad]) -> list[float]:
        key = tuple(map(id, loads))
        hit = self._memo.get(key)
        if hit is None:  # keep the loads alive with the entry so their ids cannot be reused
            hit = self._memo[key] = (list(loads), self._by_items(loads))
        return hit[1]

    def _number(self, load: LinkLoad) -> int:
        hit = self._number_of.get(id(load))
        if hit is None:
            if len(_LOAD_NUMBERS) >= _MAX_ENTRIES:
                _LOAD_NUMBERS.clear()  # numbers are never reused, so older ones only stop matching
            items = tuple(load.items())
            number = _LOAD_NUMBERS.get(items)
            if number is None:
                number = _LOAD_NUMBERS[items] = next(_NEXT_NUMBER)
            hit = self._number_of[id(load)] = (load, number)
        return hit[1]

    def _by_items(self, loads: Sequence[LinkLoad]) -> list[float]:
        numbers = tuple(map(self._number, loads))
        rates = self._by_numbers.get(numbers)
        if rates is None:
            if len(self._by_numbers) >= _MAX_ENTRIES:
                self._by_numbers.clear()
            if self._rates is fair_rates:  # the same floats (fair_rates_of_arrays)
                rates = fair_rates_of_arrays(loads, self._arrays_of(loads, numbers))
            else:
                rates = self._rates(loads)
            self._by_numbers[numbers] = rates
        return rates

    def _arrays_of(self, loads: Sequence[LinkLoad], numbers: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for load, number in zip(loads, numbers, strict=True):
            arrays = self._arrays.get(number)
            if arrays is None:
                arrays = self._arrays[number] = _load_arrays(load)
            out.append(arrays)
        return out


@dataclass(eq=False, slots=True)
class _Job:
    key: Hashable
    remaining_s: float
    load: LinkLoad
    done: Signal
    own: LinkLoad | None = None  # loads private to this copy (merged over the jobs of its key)
    rate: float = 1.0
    tag: Hashable = None  # what the job drains (the caller's name for it, kept in its record)
    start_s: float = 0.0


class Job(NamedTuple):
    """One finished job: the caller's tag, its key, when it started and finished draining, its loads (the
    very objects passed to drain: the rates it got depend only on the keys and loads draining with it)."""

    tag: Hashable
    key: Hashable
    start_s: float
    end_s: float
    load: LinkLoad
    own: LinkLoad | None


class Arbiter:
    """Drains the bandwidth parts of concurrent collectives at max-min fair rates inside the engine's event loop."""

    def __init__(self, env: Loop, rates: RatesFn | None = None):
        self._env = env
        self._rates = rates or MemoRates()
        self._jobs: list[_Job] = []
        self._last_s = 0.0
        self._timer: Signal | None = None  # the pending wake-up; an earlier one that fires is stale
        self._merged: dict[tuple[int, ...], tuple[list[LinkLoad], LinkLoad]] = {}
        self._jobs_of_key: dict[Hashable, int] = {}  # running jobs per key
        self._owning = 0  # running jobs with `own` loads
        self.records: list[Job] = []  # every finished job, in finishing order

    def drain(self, key: Hashable, work_s: float, load: LinkLoad, own: LinkLoad | None = None,
              tag: Hashable = None) -> Signal:
        """Start draining `work_s` standalone seconds; the returned event fires when it is done.
        `own`: resource loads private to this copy of `key` (module docstring); `tag`: kept in its record."""
        self._advance()
        job = _Job(key, work_s, load, self._env.event(), own, tag=tag, start_s=self._env.now)
        self._jobs.append(job)
        self._jobs_of_key[key] = self._jobs_of_key.get(key, 0) + 1
        if own:
            self._owning += 1
        self._reschedule()
        return job.done

    def _advance(self) -> None:
        now = self._env.now
        dt = now - self._last_s
        if dt > 0:
            for job in self._jobs:
                job.remaining_s -= job.rate * dt
        self._last_s = now

    def _reschedule(self) -> None:
        jobs = self._jobs
        if len(jobs) == 1:
            job = jobs[0]
            job.rate = 1.0  # alone: standalone speed
            wait_s = max(0.0, job.remaining_s / job.rate)
        elif not self._owning and len(self._jobs_of_key) == len(jobs):  # one job per key: its own load
            for job, rate in zip(jobs, self._rates([job.load for job in jobs]), strict=True):
                job.rate = rate
            wait_s = max(0.0, min([job.remaining_s / job.rate for job in jobs]))
        else:
            keys = self._key_loads()
            rate_of = dict(zip(keys, self._rates(list(keys.values())), strict=True))
            for job in jobs:
                job.rate = rate_of[job.key]
            wait_s = max(0.0, min(job.remaining_s / job.rate for job in jobs))
        timer = self._timer = self._env.timeout(wait_s)
        timer.callbacks.append(self._tick)

    def _key_loads(self) -> dict[Hashable, LinkLoad]:
        """Each key's demand: its first job's load, plus the union of its jobs' `own` loads."""
        keys: dict[Hashable, LinkLoad] = {}
        owns: dict[Hashable, list[LinkLoad]] = {}
        for job in self._jobs:
            keys.setdefault(job.key, job.load)
            if job.own:
                owns.setdefault(job.key, []).append(job.own)
        for key, parts in owns.items():
            keys[key] = self._merge(keys[key], parts)
        return keys

    def _merge(self, load: LinkLoad, owns: list[LinkLoad]) -> LinkLoad:
        """load | owns[0] | owns[1] ..., memoized on the parts' identities (so MemoRates still hits)."""
        memo_key = (id(load), *map(id, owns))
        hit = self._merged.get(memo_key)
        if hit is None:
            merged = dict(load)
            for own in owns:
                merged.update(own)
            hit = self._merged[memo_key] = ([load, *owns], merged)  # parts kept alive: ids stay unique
        return hit[1]

    def _forget(self, job: _Job) -> None:
        left = self._jobs_of_key[job.key] - 1
        if left:
            self._jobs_of_key[job.key] = left
        else:
            del self._jobs_of_key[job.key]
        if job.own:
            self._owning -= 1

    def _tick(self, timer: Signal) -> None:
        if timer is not self._timer:  # superseded by a later start or finish
            return
        self._advance()
        jobs = self._jobs
        finished = [job for job in jobs if job.remaining_s <= _EPS_S * max(1.0, job.rate)]
        if not finished:  # round-off: the earliest job is a hair short; finish it now
            finished = [min(jobs, key=lambda job: job.remaining_s / job.rate)]
        self._jobs = [job for job in jobs if job not in finished] if len(finished) < len(jobs) else []
        now = self._env.now
        for job in finished:
            self._forget(job)
            self.records.append(Job(job.tag, job.key, job.start_s, now, job.load, job.own))
            self._env.succeed(job.done)
        if self._jobs:
            self._reschedule()
