"""CollectiveCoster's process-wide memo (costers.SHARED_PRICES: _compute's results keyed by everything it
reads) gives what pricing afresh gives: on generated pairs of configurations of one library scenario (the
second priced after the first filled the memo, as in a sweep), every collective of the second's schedules
costs the same timing (latency, bandwidth, link loads) and report row with the memo as with a coster that
never reads it, and so does the whole simulated step (results dict and step time, bit for bit). Negative
control: a configuration whose network tuning differs (link_efficiency) or whose profile is another object
gets no price made for the first."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_schedule_arrays import LIBRARY

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.results import costers
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.ops import Collective
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules


class _Fresh(CollectiveCoster):
    """The long way: every price computed, SHARED_PRICES neither read nor written."""

    def _shared(self, work, group):
        return self._compute(work, group)


# the library less its three largest steps (each pair simulates twice; their variants can pass resolve and
# still exceed the op limit): the memo's key is checked on every model family, pipeline, CP, FP8 and MoE
SAMPLED = [n for n in LIBRARY if n not in ("deepseek-v3-h100-ep64", "deepseek-v3-gb300-ep32-mxfp8",
                                           "llama31-405b-h100-tp8-pp8-cp2")]


@st.composite
def layouts(draw):
    name = draw(st.sampled_from(SAMPLED))
    base = load_scenario(name)[0].parallel

    def layout():
        over = {"parallel.tp": draw(st.sampled_from([base.tp, max(1, base.tp // 2), 1, 2])),
                "parallel.micro_batch": draw(st.sampled_from([base.micro_batch, 1, 2]))}
        if draw(st.booleans()):
            over["parallel.recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
        if over["parallel.tp"] == 1:
            over["parallel.sp"] = False
        return over
    return name, layout(), layout()


def _resolved(name: str, over: dict):
    scenario, source = load_scenario(name)
    try:
        return resolve(with_overrides(scenario, over, source), source)
    except UserError:
        assume(False)


def _collectives(rs):
    """(work, group) of every distinct collective the step's schedules issue on each stage's first rank."""
    out = {}
    for s in build_stage_schedules(rs):
        for work in s.work_table.works:
            if isinstance(work, Collective):
                out[(work, rs.group(work.group, s.stage * rs.stage_size))] = None
    return list(out)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=layouts())
def test_shared_prices_equal_fresh_prices(case):
    name, first, second = case
    a, b = _resolved(name, first), _resolved(name, second)
    costers.clear_shared_prices()
    shared_a = CollectiveCoster(a)
    for work, group in _collectives(a):
        shared_a.cost(work, group)
    filled = len(costers.SHARED_PRICES)
    shared, fresh = CollectiveCoster(b), _Fresh(b)
    for work, group in _collectives(b):
        got, want = shared.cost(work, group), fresh.cost(work, group)
        assert got[0][:2] == want[0][:2] and dict(got[0][2]) == dict(want[0][2]) and got[1] == want[1]
    assert filled or not _collectives(a)
    # the whole step: priced through a memo the first configuration filled, and afresh
    try:
        with_memo = simulate(b, lean=True)
    except UserError:  # beyond a limit the run checks (sim/core/limits.py)
        assume(False)
    costers.clear_shared_prices()
    original = CollectiveCoster._shared
    CollectiveCoster._shared = _Fresh._shared
    try:
        alone = simulate(b, lean=True)
    finally:
        CollectiveCoster._shared = original
    assert with_memo.step_time_s == alone.step_time_s
    assert with_memo.to_dict() == alone.to_dict()


def test_other_tuning_or_topology_gets_no_shared_price():
    name = "llama2-70b-h100-tp8"
    a = _resolved(name, {})
    b = _resolved(name, {"hardware.network.link_efficiency": 0.5})
    costers.clear_shared_prices()
    pairs = _collectives(a)
    coster_a = CollectiveCoster(a)
    prices_a = [coster_a.cost(w, g) for w, g in pairs]
    after_a = len(costers.SHARED_PRICES)
    coster_b = CollectiveCoster(b)
    assert coster_b.tuning_key != coster_a.tuning_key
    prices_b = [coster_b.cost(w, g) for w, g in pairs]
    assert len(costers.SHARED_PRICES) > after_a  # priced anew, not found
    assert prices_a != prices_b  # the tuning changes the prices: a wrong hit would be seen
    fresh_b = _Fresh(b)
    assert prices_b == [fresh_b.cost(w, g) for w, g in pairs]
    # an entry whose topology is not this scenario's object (its id reused by another): priced again
    key = next(iter(costers.SHARED_PRICES))
    topo, profile, priced = costers.SHARED_PRICES[key]
    marker = ((-1.0, -1.0, {}), priced[1])
    costers.SHARED_PRICES[key] = (object(), profile, marker)
    again = CollectiveCoster(a)
    for w, g in pairs:
        assert again.cost(w, g) != marker
    assert costers.SHARED_PRICES[key][0] is topo


def test_shared_prices_stay_bounded(monkeypatch):
    """At most MAX_SHARED_PRICES entries and MAX_SHARED_LOADS link loads together, the oldest dropped first;
    what is dropped is priced again, the same."""
    a = _resolved("llama2-70b-h100-tp8", {})
    pairs = _collectives(a)
    costers.clear_shared_prices()
    monkeypatch.setattr(costers, "MAX_SHARED_PRICES", 3)
    first = [CollectiveCoster(a).cost(w, g) for w, g in pairs]
    assert len(costers.SHARED_PRICES) <= 3
    loads = sum(len(e[2][0][2]) for e in costers.SHARED_PRICES.values())
    monkeypatch.setattr(costers, "MAX_SHARED_LOADS", max(1, loads // 2))
    second = [CollectiveCoster(a).cost(w, g) for w, g in pairs]
    assert sum(len(e[2][0][2]) for e in costers.SHARED_PRICES.values()) <= max(1, loads // 2) or \
        len(costers.SHARED_PRICES) == 1
    assert first == second == [_Fresh(a).cost(w, g) for w, g in pairs]
