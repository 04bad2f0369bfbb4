"""Max-min fair rates: hand-solved cases and the defining property on random instances."""

from __future__ import annotations

import math
import random

import pytest

from meshsim.sim.cost.collectives import maxmin_rates


def test_two_flows_on_one_link_share_it_equally():
    rates = maxmin_rates([{0: 1.0}, {0: 1.0}], {0: 10.0})
    assert rates == pytest.approx([5.0, 5.0])
    alone = maxmin_rates([{0: 1.0}], {0: 10.0})[0]
    # the same bytes take twice as long when two flows share the link
    assert (1.0 / rates[0]) / (1.0 / alone) == pytest.approx(2.0)


def test_disjoint_flows_do_not_interact():
    assert maxmin_rates([{0: 1.0}, {1: 1.0}], {0: 10.0, 1: 4.0}) == pytest.approx([10.0, 4.0])


def test_textbook_three_flows_two_links():
    # A (cap 1) carries f0 and f1; B (cap 2) carries f1 and f2. A saturates at 1/2; f2 takes the rest of B.
    rates = maxmin_rates([{0: 1.0}, {0: 1.0, 1: 1.0}, {1: 1.0}], {0: 1.0, 1: 2.0})
    assert rates == pytest.approx([0.5, 0.5, 1.5])


def test_demand_weights_and_callable_capacity():
    # a flow using 2 units of capacity per unit rate gets half the rate of a unit flow alone
    assert maxmin_rates([{7: 2.0}], lambda link: 3.0) == pytest.approx([1.5])
    # weighted sharing: equal rates, 1*r + 3*r = 8
    assert maxmin_rates([{0: 1.0}, {0: 3.0}], {0: 8.0}) == pytest.approx([2.0, 2.0])


def test_flow_without_demand_is_unbounded():
    rates = maxmin_rates([{}, {0: 1.0}, {0: 0.0}], {0: 1.0})
    assert math.isinf(rates[0]) and math.isinf(rates[2]) and rates[1] == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(20))
def test_random_instances_are_feasible_and_max_min_fair(seed):
    """Feasible, and every flow crosses a saturated link on which no flow has a larger rate
    (the bottleneck characterisation of max-min fairness)."""
    rng = random.Random(seed)
    links = list(range(rng.randint(2, 8)))
    cap = {lk: rng.uniform(1.0, 10.0) for lk in links}
    demands = [{lk: rng.choice([1.0, 2.0, 0.5]) for lk in rng.sample(links, rng.randint(1, len(links)))}
               for _ in range(rng.randint(1, 12))]
    rates = maxmin_rates(demands, cap)
    load = {lk: sum(d.get(lk, 0.0) * r for d, r in zip(demands, rates, strict=True)) for lk in links}
    for lk in links:
        assert load[lk] <= cap[lk] * (1 + 1e-9)
    for d, r in zip(demands, rates, strict=True):
        bottlenecks = [lk for lk in d if load[lk] >= cap[lk] * (1 - 1e-9)
                       and all(r2 <= r * (1 + 1e-9) for d2, r2 in zip(demands, rates, strict=True) if lk in d2)]
        assert bottlenecks, (d, r)
