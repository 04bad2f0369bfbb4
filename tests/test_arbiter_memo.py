"""The arbiter's shortcuts (sim/engine/arbiter.py) change no float: MemoRates reuses rates only for the
same load items in the same order, and the one-job-per-key path grants the same rates as the general
path (demands merged per key)."""

from __future__ import annotations

import random

from meshsim.sim.engine import arbiter
from meshsim.sim.engine import fair_rates as fair_rates_module
from meshsim.sim.engine.arbiter import Arbiter, MemoRates, fair_rates
from meshsim.sim.engine.loop import Loop


def counting_rates():
    calls = []

    def rates(loads):
        calls.append([dict(load) for load in loads])
        return fair_rates(loads)

    return rates, calls


def test_equal_loads_in_other_objects_reuse_the_rates():
    rates, calls = counting_rates()
    memo = MemoRates(rates)
    first = memo([{1: 0.9, 2: 0.4}, {1: 0.7}])
    assert first == fair_rates([{1: 0.9, 2: 0.4}, {1: 0.7}]) and first[0] < 1.0
    again = memo([{1: 0.9, 2: 0.4}, {1: 0.7}])  # new mappings, same items in the same order
    assert again == first and len(calls) == 1


def test_other_order_or_values_are_computed_again():
    rates, calls = counting_rates()
    memo = MemoRates(rates)
    memo([{1: 0.9, 2: 0.4}, {1: 0.7}])
    memo([{2: 0.4, 1: 0.9}, {1: 0.7}])  # same contents, items in another order: not assumed equal
    memo([{1: 0.7}, {1: 0.9, 2: 0.4}])  # jobs in another order
    memo([{1: 0.9, 2: 0.4}, {1: 0.7000000000000001}])
    assert len(calls) == 4


def finish_times(loads, starts_s, general: bool) -> list[float]:
    """When each job ends: job j (load loads[j], 1 s of work, its own key) starts at starts_s[j]. With
    `general`, the arbiter is told a job has `own` loads, so it takes the merged-per-key path."""
    env = Loop()
    arb = Arbiter(env)
    ends = [0.0] * len(loads)

    def job(j):
        yield env.timeout(starts_s[j])
        if general:
            arb._owning = 1  # noqa: SLF001 (forces the general path; no job has own loads)
        yield arb.drain(("job", j), 1.0, loads[j])
        ends[j] = env.now

    for j in range(len(loads)):
        env.process(job(j))
    env.run()
    return ends


def test_one_job_per_key_path_equals_the_general_path():
    loads = [{1: 0.9, 2: 0.3}, {1: 0.6}, {2: 0.8, 3: 0.5}, {3: 1.0}, {1: 0.2, 3: 0.7}]
    starts_s = [0.0, 0.1, 0.1, 0.35, 0.9]
    fast, general = finish_times(loads, starts_s, False), finish_times(loads, starts_s, True)
    assert fast == general  # bit for bit
    assert max(fast) > 2.0  # negative control: the jobs did contend (alone each takes 1 s)


def test_arbiters_share_the_fair_rates_of_equal_loads():
    # a steady-state extrapolation runs the engine twice; the second run's arbiter reuses the first's rates
    first = MemoRates()([{11: 0.9, 12: 0.4}, {11: 0.7}])
    again = MemoRates()([{11: 0.9, 12: 0.4}, {11: 0.7}])
    assert again is first and first == fair_rates([{11: 0.9, 12: 0.4}, {11: 0.7}])


def test_numpy_sums_give_fair_rates_floats():
    """MemoRates computes fair_rates from numpy's summed loads (arbiter.fair_rates_of_arrays): generated cases,
    each equal to fair_rates exactly, on both sides of the threshold (loads summing to 1 + 1e-13 stay
    below it; a negative control above it gets a rate < 1), hot links in every order of appearance."""
    rng = random.Random(7)
    memo, fast = MemoRates(), 0
    for _ in range(3000):
        loads = [{k: rng.choice([0.0, 0.25, 1 / 3, 0.5, rng.random() * 0.6, 1e-13, 0.9])
                  for k in rng.sample(range(40), rng.randint(1, 10)) + [("cpu", rng.randint(0, 2))]}
                 for _ in range(rng.randint(2, 5))]
        assert memo(loads) == fair_rates(loads)
        fast += all(r == 1.0 for r in fair_rates(loads))
    assert 100 < fast < 2900  # both sides of the threshold were drawn
    edge = [{0: 0.5, 1: 0.1}, {0: 0.5 + 1e-13}]
    assert memo(edge) == fair_rates(edge) == [1.0, 1.0]
    over = [{0: 0.5}, {0: 0.6}]
    assert memo(over) == fair_rates(over) and min(memo(over)) < 1.0


def test_hot_filling_memo_equals_fair_rates():
    """fair_rates_of_arrays reuses a filling when the hot resources (in insertion order) and the numbers of
    the loads that have one are the same (sim/engine/fair_rates.py): generated job lists that aim at its
    edges, each checked against fair_rates exactly: loads with no hot link swapped for other ones (a hit
    that must still be right), the same touching loads with the hot links first seen in another order, a
    hot link loaded 0.0 by a job, jobs reordered, and ("cpu", r) resources."""
    rng = random.Random(19)
    memo, hot_hits = MemoRates(), 0
    hot_pool = [{0: 0.7, 1: 0.6}, {1: 0.6, 0: 0.7}, {0: 0.5, 2: 0.0}, {2: 0.9, 1: 0.45}, {0: 0.4, ("cpu", 1): 0.3}]
    cold_pool = [{10 + k: rng.choice([0.1, 0.3, 0.5]), ("cpu", k % 3): 0.2} for k in range(12)] + [{}]
    for _ in range(4000):
        loads = [dict(rng.choice(hot_pool)) for _ in range(rng.randint(1, 3))]
        loads += [dict(rng.choice(cold_pool)) for _ in range(rng.randint(0, 4))]
        rng.shuffle(loads)
        fillings, by_numbers = len(fair_rates_module._HOT_RATES), len(arbiter._FAIR_RATES_BY_NUMBERS)  # noqa: SLF001
        expected = fair_rates(loads)
        assert memo(loads) == expected
        hot_hits += (min(expected) < 1.0 and len(fair_rates_module._HOT_RATES) == fillings  # noqa: SLF001
                     and len(arbiter._FAIR_RATES_BY_NUMBERS) > by_numbers)  # noqa: SLF001
    assert hot_hits > 100  # the reuse was exercised: new job lists whose filling was an earlier one's


def _disjoint_jobs(rng: random.Random, links: range, jobs: int) -> list[dict]:
    return [{k: rng.choice([0.3, 0.5, 0.7, rng.random()]) for k in rng.sample(links, rng.randint(1, 4))}
            for _ in range(jobs)]


def test_fair_rates_fill_each_component_alone():
    """Jobs on disjoint links do not interact: the rates of two such groups drained together, interleaved
    (each group's jobs in their order), are each group's rates alone, bit for bit (max-min fairness is
    separable over connected components).
    Negative control: a job that joins the two groups through a shared link slows the other group down."""
    rng = random.Random(23)
    for _ in range(500):
        left, right = _disjoint_jobs(rng, range(0, 6), rng.randint(1, 4)), _disjoint_jobs(rng, range(10, 16), 3)
        mixed = left + right
        slots = sorted(rng.sample(range(len(mixed)), len(left)))  # where the left group's jobs go
        rest = iter(range(len(left), len(mixed)))
        picks = iter(range(len(left)))
        order = [next(picks) if i in slots else next(rest) for i in range(len(mixed))]
        together = fair_rates([mixed[i] for i in order])
        alone = fair_rates(left) + fair_rates(right)
        assert together == [alone[i] for i in order]
    a, b = [{0: 0.8}, {0: 0.8}], [{10: 0.9}, {10: 0.9}]
    bridge = {0: 0.8, 10: 0.9}
    assert fair_rates(a + b) == fair_rates(a) + fair_rates(b)
    assert fair_rates(a + b + [bridge])[2] < fair_rates(b)[0]


def test_component_memo_equals_fair_rates():
    """MemoRates' component memo (fair_rates._COMPONENT_RATES) reuses one group's filling inside another
    combination of draining jobs: generated combinations of a few recurring groups (each on its own links,
    as pipeline stages drain their collectives) with cold jobs mixed in, each equal to fair_rates exactly,
    and the components found from numpy's arrays equal the ones found from the dicts."""
    rng = random.Random(29)
    groups = [[{base + k: 0.6 for k in range(3)}, {base + 1: 0.7, base + 2: 0.5}, {base: 0.45}]
              for base in (0, 10, 20, 30)]
    memo, reused = MemoRates(), 0
    for _ in range(2000):
        loads = [dict(job) for g in rng.sample(groups, rng.randint(1, 4)) for job in g[:rng.randint(1, 3)]]
        loads += [{100 + rng.randint(0, 9): 0.2} for _ in range(rng.randint(0, 2))]
        rng.shuffle(loads)
        before = len(fair_rates_module._COMPONENT_RATES)  # noqa: SLF001
        assert memo(loads) == fair_rates(loads)
        reused += len(fair_rates_module._COMPONENT_RATES) == before  # noqa: SLF001
    assert reused > 1000  # the component memo was exercised


def test_array_components_equal_dict_components():
    """components_of_arrays (numpy, the reference of the compiled one) finds _components' lists from the
    arrays: generated loads with zero loads on hot links, each compared with the dict version."""
    rng = random.Random(31)
    for _ in range(500):
        loads = [{k: rng.choice([0.0, 0.4, 0.7]) for k in rng.sample(range(12), rng.randint(1, 4))}
                 for _ in range(rng.randint(2, 7))]
        total: dict = {}
        for load in loads:
            for k, w in load.items():
                total[k] = total.get(k, 0.0) + w
        hot = [k for k, w in total.items() if w > 1.0 + 1e-12]
        pairs = [(j, k) for j, load in enumerate(loads) for k, w in load.items() if w > 0 and k in set(hot)]
        arrays = [fair_rates_module.load_arrays(load) for load in loads]
        order, _ = fair_rates_module.hot_of_arrays(arrays)
        assert [fair_rates_module._RESOURCES[k] for k in order] == hot  # noqa: SLF001
        if hot:
            comps = fair_rates_module.components_of_arrays(arrays, order)
            assert [([hot[c] for c in cols], jobs) for cols, jobs in comps] == fair_rates_module._components(  # noqa: SLF001
                pairs, hot)
