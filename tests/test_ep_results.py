"""Per-layer dispatch / combine times and their critical-path seconds in results (ep_comm), the report line
and the sweep explanation's all-to-all clause; a dense model has none (negative control)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.engine.events import Event
from meshsim.sim.outputs.step_report import ep_line
from meshsim.sim.results.breakdown import EP_OPS, ep_layer_ms
from meshsim.sim.results.simulate import simulate
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.sweep.explain_mesh import a2a_clause

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu",
       "parallel.tp": 1, "parallel.ep": 2}


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, copy.deepcopy(overrides), source), source)


def ev(name: str, layer: int, mb: int, start: float, end: float, wait: float = 0.0) -> Event:
    return Event(0, 0, name, "ep_comm", "ep_comm", name.split(".")[2], layer, mb, start, end, wait)


def test_ep_layer_ms_by_hand():
    events = [ev("L0.mb0.fwd.dispatch", 0, 0, 0.0, 0.003, 0.001), ev("L1.mb0.fwd.dispatch", 1, 0, 0.0, 0.005),
              ev("L1.mb1.fwd.dispatch", 1, 1, 0.0, 0.009), ev("L1.mb0.bwd.combine", 1, 0, 0.01, 0.012),
              ev("L1.mb0.fwd.attn", 1, 0, 0.0, 0.1)]
    # the middle layer with all-to-alls is layer 1; micro-batch 0; waits excluded
    assert ep_layer_ms(events) == pytest.approx({"fwd.dispatch": 5.0, "bwd.combine": 2.0})
    assert ep_layer_ms([e for e in events if "attn" in e.name]) == {}


def test_results_carry_ep_comm_and_the_explanation_names_the_bigger_all_to_all():
    r = simulate(tiny(MOE))
    d = r.to_dict()
    assert set(d["ep_comm"]["layer_ms"]) == set(EP_OPS) == set(d["ep_comm"]["critical_path_s"])
    assert StepResult.from_dict(d).ep_comm == r.ep_comm  # the record round-trips through its JSON
    mine = [e for e in r.events if e.layer == 1 and e.micro_batch == 0 and e.name.endswith("fwd.combine")]
    assert d["ep_comm"]["layer_ms"]["fwd.combine"] == pytest.approx(sum(e.dur_s - e.wait_s for e in mine) * 1e3)
    on_path = sum(d["ep_comm"]["critical_path_s"].values())
    assert 0 < on_path <= r.step_time_s and "one MoE layer's all-to-all: fwd dispatch" in ep_line(r)
    rec = SimpleNamespace(result=r)  # _a2a_clause reads a record's result only
    path = d["ep_comm"]["critical_path_s"]
    kind = max(("dispatch", "combine"), key=lambda k: (path[f"fwd.{k}"] + path[f"bwd.{k}"], k))
    assert a2a_clause(rec).startswith(f", its {kind} is ")
    dense = simulate(tiny({"parallel.tp": 1}))
    assert "ep_comm" not in dense.to_dict() and a2a_clause(SimpleNamespace(result=dense)) == ""
