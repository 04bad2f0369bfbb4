"""The compiled core's arbiter rates (sim/engine/_fair_rates.pxi FairRates: fair_rates in C over loads interned
once per run) against the Python reference, float.hex for float.hex:

- directly, against fair_rates on generated load sets aimed at its edges (and its shortcut, hot resources
  found through the pairs of loads that share them, against summing every item): summed loads one ulp either side
  of the hot threshold, loads that share every link, equal loads (the same object twice, or equal items in
  two objects), zero, negative-zero and negative weights, compute resources ("cpu", r), and loads outside
  the C loops (int or NaN weights, negative-int, bool or string resource keys: the reference answers them);
  asked twice, in a fresh FairRates and after its memos are emptied;
- through the engine: generated runs whose collectives drain together on every stream of 1-4 ranks (shared
  links, ties at equal times, zero-byte and zero-latency parts, a job finishing as another starts, kappa),
  the same event log, transfers and jobs on the compiled, python and simpy engines;
- results.json of every library scenario, byte for byte, on the compiled core, on the compiled core asking
  the Python reference for its rates, and on the Python core (all but the costliest there).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.library import builtin_scenarios
from meshsim.scenarios.load import load_scenario, resolve
from meshsim.sim.engine import compiled
from meshsim.sim.engine.arbiter import MemoRates
from meshsim.sim.engine.events import run, symmetric_groups
from meshsim.sim.engine.fair_rates import fair_rates
from meshsim.sim.outputs.step_report import results_json_text
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.ops import FIFO_STREAMS, Collective, Elementwise, Op, Schedule

pytestmark = pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled core is not built")
_core = compiled._core  # None without the extension (every test here is then skipped)

_EDGE = 1.0 + 1e-12  # fair_rates' hot threshold: a summed load above it can bind


def _first_hot_partner(base: float) -> float:
    """The smallest w with base + w over the threshold (so base + the double below w is not)."""
    w = _EDGE - base
    while base + w <= _EDGE:
        w = math.nextafter(w, 2.0)
    while base + math.nextafter(w, 0.0) > _EDGE:
        w = math.nextafter(w, 0.0)
    return w


_HALF_HOT = _first_hot_partner(0.5)  # with 0.5: the first sum over the threshold
WEIGHTS = st.one_of(
    st.sampled_from([0.0, -0.0, -0.25, 0.25, 1 / 3, 0.5, 0.7, 1.0, 1e-13, _EDGE, math.nextafter(_EDGE, 2.0),
                     math.nextafter(_EDGE, 0.0), _EDGE - 0.5, _HALF_HOT, math.nextafter(_EDGE - 0.5, 0.0)]),
    st.floats(min_value=1e-6, max_value=1.2))
PLAIN_KEYS = st.one_of(st.integers(0, 7), st.tuples(st.just("cpu"), st.integers(0, 2)))
ODD = st.sampled_from([(0, 1), (1, float("nan")), (-1, 0.5), (True, 0.5), ("x", 1.0)])  # outside the C loops


@st.composite
def load_sets(draw):
    """2-9 loads: independent ones, ones on every link of a shared set, repeats (the same object or equal
    items), now and then one entry outside the C loops."""
    shared = draw(st.lists(PLAIN_KEYS, min_size=1, max_size=4, unique=True))
    loads = []
    for _ in range(draw(st.integers(2, 9))):
        pick = draw(st.integers(0, 5))
        if pick == 0 and loads:
            loads.append(draw(st.sampled_from(loads)))  # the same object again
        elif pick == 1 and loads:
            loads.append(dict(draw(st.sampled_from(loads))))  # equal items, another object
        elif pick == 2:
            loads.append({k: draw(WEIGHTS) for k in shared})  # every link of the shared set
        else:
            loads.append(draw(st.dictionaries(PLAIN_KEYS, WEIGHTS, max_size=6)))
    if draw(st.integers(0, 9)) == 0:
        key, w = draw(ODD)
        loads[draw(st.integers(0, len(loads) - 1))] = {**loads[0], key: w}
    return loads


def _hex(rates) -> list[str]:
    return [r.hex() for r in rates]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(load_sets())
def test_interned_rates_equal_fair_rates(loads):
    want = _hex(fair_rates(loads))
    fair = compiled.fair_rates()
    assert _hex(fair(loads)) == want
    assert _hex(fair(loads)) == want  # memo hits
    assert _hex(fair(list(reversed(loads)))) == _hex(fair_rates(list(reversed(loads))))
    assert _hex(compiled.fair_rates()(loads)) == want  # a fresh table, global memos warm
    _core.clear_memos()
    assert _hex(compiled.fair_rates()(loads)) == want  # memos empty


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(load_sets())
def test_hot_resources_by_pairs_equal_the_long_way(loads):
    """The shortcut FairRates takes (only resources shared by two loads are summed; the others are hot when
    their one load is) lists the same hot resources in the same order, and the same marks, as summing every
    item (the long way, fair_rates' own)."""
    fair = compiled.fair_rates()
    plain = [load for load in loads if all(type(w) is float and w == w for w in load.values())
             and all((type(k) is int and k >= 0) or type(k) is tuple for k in load)]
    if len(plain) >= 2:
        by_scan, by_pairs = fair.hot_both_ways(plain)
        assert by_pairs == by_scan


def test_the_hot_threshold_is_exact_and_binds():
    """Negative control: the first sum over 1 + 1e-12 binds (both jobs slowed), one ulp less leaves both at
    1: the comparison and the filling are exercised, not only the all-cold answer."""
    below = math.nextafter(_HALF_HOT, 0.0)
    assert 0.5 + below <= _EDGE < 0.5 + _HALF_HOT
    fair = compiled.fair_rates()
    assert fair([{0: 0.5}, {0: below}]) == fair_rates([{0: 0.5}, {0: below}]) == [1.0, 1.0]
    hot = fair([{0: 0.5}, {0: _HALF_HOT}])
    assert _hex(hot) == _hex(fair_rates([{0: 0.5}, {0: _HALF_HOT}])) and max(hot) < 1.0


def test_loads_sharing_every_link_split_it_and_odd_loads_ask_the_reference():
    every = [{0: 1.0, 1: 1.0, 2: 1.0} for _ in range(3)]
    assert compiled.fair_rates()(every) == fair_rates(every) == [1 / 3] * 3
    calls = []

    def reference(loads):
        calls.append(loads)
        return fair_rates(loads)

    fair = _core.FairRates(reference, 1 + 1e-9, 1e-300, True)
    odd = [{0: 1}, {0: 1.0}]  # an int weight: outside the C loops
    assert fair(odd) == fair_rates(odd) and len(calls) == 1
    assert fair(every) == [1 / 3] * 3 and len(calls) == 1  # plain loads: answered in C


# ---- through the engine ------------------------------------------------------------------------------
LINK_LOADS = ({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.5}, {0: _HALF_HOT}, {0: _EDGE - 0.5},
              {}, {1: 1.0, ("cpu", 0): 0.5}, {0: 0.0, 1: -0.0}, {0: 1}, {2: 0.7, 0: 0.6, 1: 0.3})
TIMES = (0.0, 0.25, 0.5, 1.0, 1.0, 2.0)  # binary fractions and repeats: jobs end as others start


@st.composite
def busy_runs(draw):
    """One stage on 1-4 ranks, 2-12 ops spread over every FIFO stream with few deps, so up to five
    collectives (and, with kappa, compute ops) drain at once on shared links."""
    tp, dp = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]))
    n = draw(st.integers(2, 12))
    ops = []
    for i in range(n):
        deps = tuple(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=1))))) if i and draw(st.booleans()) else ()
        stream = draw(st.sampled_from(FIFO_STREAMS))
        if stream == "compute":
            work = Elementwise(f"k{i}", 8 * i, 8)
        else:
            work = Collective("all_reduce", draw(st.sampled_from(["tp", "dp"])), 1000 * (i + 1))
        ops.append(Op(i, f"op{i}", stream, stream, "fwd", work, deps, 0, 0))
    comm = draw(st.lists(st.tuples(st.sampled_from(TIMES), st.sampled_from(TIMES),
                                   st.sampled_from(range(len(LINK_LOADS)))), min_size=n, max_size=n))
    durations = draw(st.lists(st.sampled_from(TIMES), min_size=n, max_size=n))
    return dict(schedule=Schedule(tuple(ops), tp=tp, dp=dp, micro_batches=1), ranks=list(range(tp * dp)),
                compute_s=lambda op, rank: durations[op.id],
                collective=lambda op, group: (comm[op.id][0], comm[op.id][1], LINK_LOADS[comm[op.id][2]]),
                group_of=symmetric_groups(tp, dp), comm_interference=draw(st.sampled_from([0.0, 0.5])))


def _outcome(kwargs, engine: str) -> str:
    try:
        log = run(**kwargs, engine=engine)
    except ValueError as exc:
        return f"error: {exc}"
    return repr((tuple(log.events), log.step_time_s, log.transfers, log.jobs))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(busy_runs())
def test_busy_runs_are_bit_identical_on_every_engine(kwargs):
    got = {engine: _outcome(kwargs, engine) for engine in ("compiled", "python", "simpy")}
    assert got["compiled"] == got["python"] == got["simpy"]


def test_a_job_ending_as_another_starts_on_its_link():
    """Two collectives on one link, the second issued (after a compute op) exactly when the first ends:
    they never share, so each takes its standalone time, on every engine."""
    ops = (Op(0, "a", "tp_comm", "tp_comm", "fwd", Collective("all_reduce", "tp", 8), (), 0, 0),
           Op(1, "c", "compute", "compute", "fwd", Elementwise("c", 8, 8), (), 0, 0),
           Op(2, "b", "dp_comm", "dp_comm", "fwd", Collective("all_reduce", "dp", 8), (1,), 0, 0))
    kwargs = dict(schedule=Schedule(ops, tp=1, dp=1, micro_batches=1), ranks=[0], compute_s=lambda op, r: 1.0,
                  collective=lambda op, g: (0.0, 1.0, LINK_LOADS[0]), group_of=symmetric_groups(1, 1))
    got = {engine: _outcome(kwargs, engine) for engine in ("compiled", "python", "simpy")}
    assert got["compiled"] == got["python"] == got["simpy"]
    log = run(**kwargs)
    assert sorted((e.name, e.start_s, e.end_s) for e in log.events) == [("a", 0.0, 1.0), ("b", 1.0, 2.0),
                                                                         ("c", 0.0, 1.0)]


SLOW_ON_PYTHON = {"llama31-405b-h100-tp8-pp8-cp2"}  # its Python-core run alone takes ~50 s on 2 cores


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
def test_library_results_json_is_byte_identical(name, monkeypatch):
    """results.json on the compiled core, on the compiled core asking the Python reference for every rate
    (arbiter.MemoRates: only the rates differ in how they are computed), and on the Python core."""
    scenario, source = load_scenario(name)
    rs = resolve(scenario, source)
    texts = {"compiled": results_json_text(simulate(rs, engine_name="compiled"))}
    if name not in SLOW_ON_PYTHON:
        texts["python"] = results_json_text(simulate(rs, engine_name="python"))
    monkeypatch.setattr(compiled, "fair_rates", MemoRates)
    texts["compiled, reference rates"] = results_json_text(simulate(rs, engine_name="compiled"))
    assert len(set(texts.values())) == 1, [k for k in texts if texts[k] != texts["compiled"]]
