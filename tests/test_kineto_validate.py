"""read -> compare -> calibrate on traces validate records of its own run (gloo, 2 processes, CPU).

Asserts structure (every schedule op is in the trace, once per step, with the schedule's collectives and
attention cores) and that the profile learnt from the trace brings the simulated step closer to the
traced one than the scenario's own hardware does; the size of the remaining error is a measurement on a
shared CPU, printed by benchmarks/trace_calibration.py, not asserted here."""

from __future__ import annotations

import pytest
import yaml

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.profile import save_profile
from meshsim.sim.kineto.calibrate import profile_from_trace
from meshsim.sim.kineto.classify import category, work_class
from meshsim.sim.kineto.ranks import load_ranks, summaries
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.sweep.trace_compare import compare_trace, simulated_side

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    from meshsim.validate.crosscheck.crosscheck import timing_payload, write_traced_scenario
    from meshsim.validate.launch.launch import launch

    out = tmp_path_factory.mktemp("traced")
    sc, source = load_scenario("tiny-2gpu")
    shrunk, _, payload = timing_payload(sc, source, 2, "gloo", repeats=1, numerics=False)
    payload.update(trace_dir=str(out), trace_steps=3, warmup=1)
    scenario_path = write_traced_scenario(shrunk, source, out)
    per_rank = launch("timing", payload, 2, backend="gloo", timeout_s=300.0)
    return out, scenario_path, per_rank


def test_every_schedule_op_is_traced_once_per_step(traced):
    out, scenario_path, _ = traced
    ranks = load_ranks([out])
    assert [d.trace.rank for d in ranks] == [0, 1] and all(d.trace.cpu_device for d in ranks)
    sc, source = load_scenario(scenario_path)
    schedule = build_schedule(resolve(sc, source))
    compute = {op.name for op in schedule.ops if category(work_class(op.work)) == "compute"}
    comm = {op.name for op in schedule.ops if category(work_class(op.work)) == "comm"}
    for step in summaries(ranks, critical=False):
        assert set(step.labels) >= compute  # every compute op's own operators, under its name
        assert set(step.labels) & comm == comm  # every collective, by the issue it was matched to
        assert len(step.labels) == len(compute | comm)


def test_structure_agrees_and_calibration_closes_the_gap(traced, tmp_path):
    out, scenario_path, _ = traced
    ranks = load_ranks([out])
    steps = summaries(ranks, critical=False, min_over_ranks=False)
    doc = compare_trace(simulated_side(str(scenario_path)), ranks, steps)
    assert doc["structure_issues"] == [] and all(r["agrees"] for r in doc["structure"])
    names = {r["name"] for r in doc["rows"]}
    assert {"step", "compute busy", "TP communication busy", "class gemm", "fwd.qkv"} <= names
    sc, source = load_scenario(scenario_path)
    profile = profile_from_trace(ranks, steps, build_schedule(resolve(sc, source)), "p", sc.name)
    save_profile(profile, tmp_path / "p.yaml")
    traced_s = sum(s.span_s for s in steps if s.rank == 0) / sum(s.rank == 0 for s in steps)
    before = simulate(resolve(sc, source), full=True).step_time_s
    calibrated = with_overrides(sc, {"hardware.profile": str(tmp_path / "p.yaml")}, source)
    after = simulate(resolve(calibrated, source), full=True).step_time_s
    assert abs(after - traced_s) < abs(before - traced_s)


def test_a_scenario_of_other_depth_is_named_not_compared(traced, tmp_path):
    """Negative control: the same trace against the scenario with twice the layers."""
    out, scenario_path, _ = traced
    data = yaml.safe_load(scenario_path.read_text())
    data["model"]["layers"] *= 2
    deeper = tmp_path / "deeper.yaml"
    deeper.write_text(yaml.safe_dump(data))
    ranks = load_ranks([out])
    doc = compare_trace(simulated_side(str(deeper)), ranks, summaries(ranks, critical=False))
    assert doc["rows"] == [] and any("layers" in issue for issue in doc["structure_issues"])
