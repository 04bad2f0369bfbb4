"""Interleaved pipelines with overlapped P2P and N = 2p - 2 or 2p - 1 micro-batches per group (N > p): the
steady plan (sim/results/simulate.py steady_plan) places the first cut one period too early, and the proof
refuses it ("... is not ... one period later at the cuts": the forward receives the warm-up's last steps
post one step ahead have not settled), so the whole step is simulated. Counting two more warm-up entries
with overlapped P2P (w + 2: a receive posted one step ahead on each side) adds the lead group these cases
need and no other: found on p 3-6, v 2-3, N from p to 2p + 2 (every failure had w + 2 > v N with one
period of lead; every other case was proven as planned). `proposed_plan` is that rule; steady_plan is not
this branch's to change, so the tests run the proof through it: it proves these cases exactly (equal to
the whole step), and it is today's plan on every library scenario and without overlap (so it moves no
figure). Today's refusal is the negative control (skipped once steady_plan has the rule)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_steady_state import assert_same_step

from meshsim.scenarios.library import builtin_scenarios
from meshsim.scenarios.load import load_and_resolve, load_scenario, resolve, with_overrides
from meshsim.sim.results import simulate as sim_glue
from meshsim.sim.results.simulate import simulate, simulate_steady
from meshsim.sim.results.steady_state import Plan

todays_plan = sim_glue.steady_plan  # the module attribute the tests below replace


def proposed_plan(rs) -> Plan:
    """steady_plan with w + 2 warm-up entries under overlapped interleaving (module docstring)."""
    plan = todays_plan(rs)
    if rs.pp == 1 or rs.vp == 1 or not rs.scenario.parallel.p2p_overlap:
        return plan
    n = plan.unit
    warmup = 2 * (rs.pp - 1) + (rs.vp - 1) * n + rs.scenario.parallel.moe_ep_overlap
    periods = -(-(warmup + 2) // (rs.vp * n))
    return replace(plan, lead=max(plan.lead, (periods + 1) * n))


def overlapped(p: int, v: int, n: int, groups: int = 12):
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": p, "parallel.tp": 1, "parallel.sp": False, "parallel.dp": "auto",
            "model.layers": p * v, "parallel.pp": p, "parallel.vp": v, "parallel.p2p_overlap": True,
            "parallel.microbatch_group_size": n, "parallel.global_batch": groups * n * 2, "parallel.micro_batch": 2}
    return resolve(with_overrides(scenario, over, source), source)


CASES = [(4, 2, 6), (3, 3, 4), (5, 2, 9)]  # N = 2p - 2 (two of them) and N = 2p - 1


@pytest.mark.parametrize(("p", "v", "n"), CASES)
def test_one_more_lead_group_proves_overlapped_groups_of_2p_minus_2_and_2p_minus_1(monkeypatch, p, v, n):
    rs = overlapped(p, v, n)
    today, proposed = todays_plan(rs), proposed_plan(rs)
    if today != proposed:  # the negative control: today's plan is refused at its cut
        ex, why = simulate_steady(rs, force=True)
        assert ex is None and "one period later at the cuts" in why, why
        assert proposed == replace(today, lead=today.lead + today.unit)
    monkeypatch.setattr(sim_glue, "steady_plan", proposed_plan)
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    assert_same_step(ex, simulate(rs, full=True))


def test_the_proposed_plan_is_todays_on_the_library_and_without_overlap():
    for name in sorted(builtin_scenarios()):
        rs = load_and_resolve(name)
        assert proposed_plan(rs) == todays_plan(rs), name
    for p, v, n in CASES:
        rs = overlapped(p, v, n)
        plain = resolve(with_overrides(rs.scenario, {"parallel.p2p_overlap": False}, rs.source), rs.source)
        assert proposed_plan(plain) == todays_plan(plain)
