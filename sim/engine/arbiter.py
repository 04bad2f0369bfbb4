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
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from meshsim.sim.engine.fair_rates import MAX_ENTRIES, LinkLoad, fair_rates, fair_rates_of_arrays, load_arrays
from meshsim.sim.engine.loop import Loop, Signal

RatesFn = Callable[[Sequence[LinkLoad]], list[float]]
_EPS_S = 1e-15  # remaining standalone seconds treated as done (float round-off of rate * dt)
_LOAD_NUMBERS: dict[tuple, int] = {}  # a load mapping's items, in order -> its number (never reused)
_NEXT_NUMBER = itertools.count()
_FAIR_RATES_BY_NUMBERS: dict[tuple[int, ...], list[float]] = {}  # shared by every MemoRates of fair_rates


class MemoRates:
    """fair_rates memoized exactly: first on the identity of the load mappings (the cost model memoizes
    them, so the same few combinations of concurrent collectives recur all step long), then on their
    items in order, numbered (equal mappings from another cost entry, or from an earlier engine run: the
    two short runs of a steady-state extrapolation share most of them). fair_rates reads only the items
    of each mapping, in order, so equal ordered items give bit-identical rates. The compiled core looks up
    `_memo` itself before calling (sim/engine/_core.pyx rates_of): keep its key the tuple of the ids."""

    def __init__(self, rates: RatesFn = fair_rates):
        self._rates = rates
        self._memo: dict[tuple[int, ...], tuple[Sequence[LinkLoad], list[float]]] = {}
        self._number_of: dict[int, tuple[LinkLoad, int]] = {}  # id -> (the mapping, kept alive; its number)
        self._arrays: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # number -> load_arrays (fair_rates only)
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
            if len(_LOAD_NUMBERS) >= MAX_ENTRIES:
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
            if len(self._by_numbers) >= MAX_ENTRIES:
                self._by_numbers.clear()
            if self._rates is fair_rates:  # the same floats (fair_rates_of_arrays)
                rates = fair_rates_of_arrays(loads, self._arrays_of(loads, numbers), numbers)
            else:
                rates = self._rates(loads)
            self._by_numbers[numbers] = rates
        return rates

    def _arrays_of(self, loads: Sequence[LinkLoad], numbers: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for load, number in zip(loads, numbers, strict=True):
            arrays = self._arrays.get(number)
            if arrays is None:
                arrays = self._arrays[number] = load_arrays(load)
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
