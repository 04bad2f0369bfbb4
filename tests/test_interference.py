"""Compute/communication interference: the engine's shared compute resource and its calibration.

Model (sim/engine/events.py, sim/engine/arbiter.py): while a compute op and a collective's bandwidth part overlap on a
rank, both progress at 1/(1+kappa). A compute op of g and a bandwidth part of c started together:
the shorter ends at min(g, c)(1 + kappa), the longer at max(g, c) + kappa min(g, c)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.profile import HardwareProfile
from meshsim.scenarios.schema import ComputeTuning, Scenario
from meshsim.sim.core.engines import DEFAULT_ENGINE
from meshsim.sim.engine import arbiter
from meshsim.sim.engine.events import run, symmetric_groups
from meshsim.sim.results.costers import comm_interference
from meshsim.sim.results.simulate import simulate, simulate_with_events
from meshsim.sim.schedule.ops import Collective, Elementwise, Op, Schedule


def comp(i, name, deps=()):
    return Op(i, name, "compute", "compute", "fwd", Elementwise(name, 0, 0), tuple(deps), None, None)


def coll(i, name, deps=(), group="tp"):
    stream = "tp_comm" if group == "tp" else "dp_comm"
    return Op(i, name, stream, stream, "fwd", Collective("all_reduce", group, 1000), tuple(deps), None, None)


def overlap_log(g_s, c_s, kappa, ranks=(0,), tp=2, dp=1, lat_s=0.0, engine=DEFAULT_ENGINE):
    """One compute op `gemm` of g_s and one collective `ar` (latency lat_s, bandwidth c_s), both at t = 0."""
    schedule = Schedule((comp(0, "gemm"), coll(1, "ar")), tp=tp, dp=dp, micro_batches=1)
    return run(schedule, ranks, lambda op, rank: g_s, lambda op, group: (lat_s, c_s, {7: 1.0}),
               symmetric_groups(tp, dp), comm_interference=kappa, engine=engine)


def ends(log, rank=0):
    return {e.name: e.end_s for e in log.of_rank(rank)}


@pytest.mark.parametrize("kappa", [0.0, 0.5, 1.0])
def test_compute_longer_than_collective(kappa):
    g, c = 3.0, 2.0  # c <= g: the collective ends at c (1 + kappa), the GEMM at g + kappa c
    log = overlap_log(g, c, kappa)
    assert ends(log) == pytest.approx({"ar": c * (1 + kappa), "gemm": g + kappa * c}, rel=1e-12)
    assert log.step_time_s == pytest.approx(g + kappa * c, rel=1e-12)


@pytest.mark.parametrize("kappa", [0.0, 0.5, 1.0])
def test_collective_longer_than_compute(kappa):
    g, c = 1.0, 4.0  # c > g: the GEMM ends at g (1 + kappa), the collective at c + kappa g
    log = overlap_log(g, c, kappa)
    assert ends(log) == pytest.approx({"gemm": g * (1 + kappa), "ar": c + kappa * g}, rel=1e-12)
    assert log.step_time_s == pytest.approx(c + kappa * g, rel=1e-12)


def test_latency_part_does_not_interfere():
    g, c, lat, kappa = 3.0, 1.0, 0.5, 1.0  # bandwidth part overlaps the GEMM over [0.5, 0.5 + 2c]
    log = overlap_log(g, c, kappa, lat_s=lat)
    assert ends(log) == pytest.approx({"ar": lat + c * (1 + kappa), "gemm": g + kappa * c}, rel=1e-12)


def test_every_simulated_member_and_copy_is_loaded():
    # tp 2 x dp 2, four simulated ranks: the collective's two copies (TP groups {0,1}, {2,3}) share one
    # arbiter key; each loads its own ranks, so every rank's GEMM ends at g + kappa c, as in collapsed mode
    g, c, kappa = 3.0, 2.0, 0.5
    log = overlap_log(g, c, kappa, ranks=range(4), tp=2, dp=2)
    for rank in range(4):
        assert ends(log, rank) == pytest.approx({"ar": c * (1 + kappa), "gemm": g + kappa * c}, rel=1e-12)
    assert log.step_time_s == pytest.approx(overlap_log(g, c, kappa, tp=2, dp=2).step_time_s, rel=1e-12)


def test_kappa_zero_keeps_compute_off_the_arbiter(monkeypatch):
    keys = []
    drain = arbiter.Arbiter.drain

    def spy(self, key, *args, **kwargs):
        keys.append(key)
        return drain(self, key, *args, **kwargs)

    monkeypatch.setattr(arbiter.Arbiter, "drain", spy)  # the Python core's arbiter
    log = overlap_log(3.0, 2.0, 0.0, engine="python")
    assert keys == [(0, 1)]  # only the collective's bandwidth part (stage 0, op 1); the GEMM is a plain timeout
    assert [(e.name, e.start_s, e.end_s) for e in log.events] == [("ar", 0.0, 2.0), ("gemm", 0.0, 3.0)]
    keys.clear()
    overlap_log(3.0, 2.0, 0.5, engine="python")
    assert keys == [("compute", 0), (0, 1)]
    # every core records the jobs it drained (in finishing order): the same keys on the default one
    assert [j.key for j in overlap_log(3.0, 2.0, 0.0).jobs] == [(0, 1)]
    assert [j.key for j in overlap_log(3.0, 2.0, 0.5).jobs] == [(0, 1), ("compute", 0)]


def tiny(kappa=None, **overrides):
    # slow NVLink and a long launch overhead, so bandwidth parts outlast latencies and overlap compute
    sc, src = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": 4, "topology.nvlink_gbps": 1.0, "hardware.compute.launch_overhead_us": 50.0,
            **overrides}
    if kappa is not None:
        over["hardware.compute.comm_interference"] = kappa
    return resolve(with_overrides(sc, over, src), src)


def test_kappa_zero_is_bit_identical_on_a_scenario():
    _, old, _ = simulate_with_events(tiny())
    _, new, _ = simulate_with_events(tiny(0.0))
    assert new.events == old.events


@pytest.mark.parametrize("sp", [False, True])
def test_collapsed_equals_explicit_ranks_with_interference(sp):
    steps = []
    for kappa in (0.0, 0.5, 1.0):
        rs = tiny(kappa, **{"parallel.sp": sp, "parallel.tp_comm_overlap": sp})
        collapsed, explicit = simulate(rs), simulate(rs, explicit_ranks=True)
        assert explicit.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-9)
        steps.append(collapsed.step_time_s)
    assert steps[0] < steps[1] < steps[2]  # overlapped communication now costs compute time


def test_kappa_precedence_scenario_then_profile_then_zero():
    sc, _ = load_scenario("tiny-2gpu")

    def rs(mine, theirs):
        scenario = Scenario.model_validate({**sc.model_dump(), "hardware": {"compute": {"comm_interference": mine}}})
        profile = None if theirs is None else HardwareProfile(name="p", compute=ComputeTuning(comm_interference=theirs))
        return SimpleNamespace(scenario=scenario, profile=profile)

    assert comm_interference(rs(None, None)) == 0.0
    assert comm_interference(rs(None, 0.4)) == 0.4
    assert comm_interference(rs(0.2, 0.4)) == 0.2


def test_kappa_is_bounded():
    with pytest.raises(ValueError):
        ComputeTuning(comm_interference=1.5)
    with pytest.raises(ValueError, match="comm_interference"):
        overlap_log(1.0, 1.0, -0.1)


# ----- calibration ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("g", "c"), [(2.0, 1.0), (1.0, 3.0), (1.5, 1.5)])
@pytest.mark.parametrize("kappa", [0.0, 0.3, 1.0])
def test_calibration_formula_recovers_kappa(g, c, kappa):
    pytest.importorskip("torch")
    from meshsim.validate.calibrate.interference import kappa_from_times

    both = max(g, c) + kappa * min(g, c)  # the engine's closed form
    assert kappa_from_times(g, c, both) == pytest.approx(kappa)
    assert kappa_from_times(g, c, max(g, c) - 0.1) == 0.0  # faster than the longer alone: clamped
    assert kappa_from_times(g, c, g + c + 0.1) == 1.0  # slower than serial: clamped


def test_kappa_is_written_in_the_units_of_the_collective_table():
    """The engine multiplies kappa by the table's mean collective time; with a heavy tail (mean 3x the
    median) the same measured extra gives a third of the median-based kappa, so kappa x c_mean is the
    extra; steady collectives (mean = median) give kappa_from_times exactly (negative control)."""
    pytest.importorskip("torch")
    from meshsim.validate.calibrate.interference import kappa_for_table, kappa_from_times, reduce_interference

    g, c_med, extra = 2.0, 0.5, 0.4
    assert kappa_for_table(g, c_med, c_med, g + extra) == pytest.approx(kappa_from_times(g, c_med, g + extra))
    assert kappa_for_table(g, c_med, 3 * c_med, g + extra) == pytest.approx(extra / (3 * c_med))
    # two ranks, 5 rounds: c's min over ranks per round = [0.5, 0.5, 0.5, 0.5, 5.5] (median 0.5, mean 1.5)
    c_rounds = [0.5, 0.5, 0.5, 0.5, 5.5]
    rank = {"gemm": [1, 1, 1, 1], "gemms": 1, "op": "all_reduce", "ranks": 2, "nbytes": 8,
            "samples": [[g] * 5, c_rounds, [g + extra] * 5]}
    kappa, rounds, record = reduce_interference([rank, rank])
    assert (rounds["c_s"], rounds["c_mean_s"]) == (0.5, pytest.approx(1.5))
    assert kappa == pytest.approx(extra / 1.5) and f"kappa {kappa:.3f} over c's mean" in record


def test_reduction_over_ranks_and_rounds():
    pytest.importorskip("torch")
    from meshsim.validate.calibrate.interference import reduce_interference

    # per rank: samples [g, c, both] over 3 rounds; g: mean over ranks, c and both: min; then medians
    r0 = {"gemm": [512, 384, 256, 1], "gemms": 2, "op": "all_reduce", "ranks": 2, "nbytes": 1024,
          "samples": [[2.0, 2.2, 9.0], [1.0, 5.0, 1.2], [2.5, 2.6, 2.7]]}
    r1 = {**r0, "samples": [[2.0, 2.0, 1.0], [3.0, 1.1, 0.9], [2.4, 3.0, 2.5]]}
    kappa, med, record = reduce_interference([r0, r1])
    g, c, both = 2.1, 1.0, 2.5  # medians of (2, 2.1, 5), (1, 1.1, 0.9), (2.4, 2.6, 2.5)
    # c's mean over the same rounds (the collective table's statistic) is 1.0 too: kappa unchanged
    assert med == pytest.approx({"g_s": g, "c_s": c, "both_s": both, "c_mean_s": 1.0})
    assert kappa == pytest.approx((both - g) / c)
    assert "kappa 0.400 over c's mean (0.400 over its median" in record and "x2" in record
    assert reduce_interference([r0, None]) is None
