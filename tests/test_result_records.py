"""The typed result records (sim/results/records.py): frozen, and the JSON boundary is a lossless round
trip: StepResult.from_dict(to_dict) == the result, and the JSON text written from the read-back result is
the text written from the original, byte for byte."""

from __future__ import annotations

import dataclasses
import json

import pytest

from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.outputs.step_report import results_json_text
from meshsim.sim.results.critical_path import Segment, top_op_types
from meshsim.sim.results.records import (
    CONFIG_KEYS,
    CollectiveRow,
    ConfigEcho,
    MemoryGB,
    PipelineSummary,
    StageMemory,
)
from meshsim.sim.results.simulate import simulate
from meshsim.sim.results.steady_state import SteadyState
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.sweep.axes import SweepPoint
from meshsim.sim.sweep.record import SweepRecord

RECORDS = (ConfigEcho, MemoryGB, StageMemory, CollectiveRow, PipelineSummary, Segment, SteadyState, StepResult)
# a whole step (too short to extrapolate), dense TP/DP, a pipeline (per-stage memory, PipelineSummary), MoE
QUICK = ("tiny-2gpu", "llama3-8b-h200", "llama2-70b-h100-pp4", "mixtral-8x7b-h100-ep8")


@pytest.fixture(scope="module", params=QUICK)
def result(request) -> StepResult:
    return simulate(load_and_resolve(request.param))


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_is_a_frozen_dataclass(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_a_record_cannot_be_changed_in_place():
    row = CollectiveRow("all_reduce", "tp", 8, 1024)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.count = 2  # type: ignore[misc]


def test_results_round_trip_through_json(result):
    data = json.loads(json.dumps(result.to_dict()))
    back = StepResult.from_dict(data)
    assert back == result
    assert type(back.memory_gb) is MemoryGB and type(back.config) is ConfigEcho
    assert all(type(c) is CollectiveRow for c in back.collectives) and back.collectives
    assert all(type(s) is Segment for s in back.critical_path) and back.critical_path
    assert type(back.steady_state) is SteadyState
    assert (back.pipeline is None) == (result.config.pp == 1)
    for full in (False, True):
        assert results_json_text(back, full_critical_path=full) == results_json_text(result, full_critical_path=full)


def test_each_block_round_trips_on_its_own(result):
    blocks = [result.memory_gb, result.config, result.steady_state, *result.collectives, *result.critical_path[:50]]
    blocks += [result.pipeline] if result.pipeline is not None else []
    blocks += list(result.memory_gb.stages or ())
    for block in blocks:
        assert type(block).from_json(json.loads(json.dumps(block.to_json()))) == block


def test_a_sweep_record_round_trips(result):
    point = SweepPoint(result.config.tp, result.config.sp, result.config.micro_batch, False, result.config.recompute)
    record = SweepRecord.ran(point, "digest", result)
    line = json.dumps(record.to_json())
    assert json.dumps(SweepRecord.from_json(json.loads(line)).to_json()) == line


def test_optional_echoes_are_written_only_when_set():
    """The extension point: a ConfigEcho field left None is not in the JSON, so results without it keep
    their bytes (vp without pp, the MoE keys without MoE layers)."""
    dense = ConfigEcho(**{k: 1 for k in CONFIG_KEYS})
    assert tuple(dense.to_json()) == CONFIG_KEYS
    assert tuple(ConfigEcho(**{k: 1 for k in CONFIG_KEYS}, vp=2).to_json()) == (*CONFIG_KEYS, "vp")
    assert not dense.has("ep") and dense.has("tp")
    row = CollectiveRow("all_to_all", "ep", 8, 64)
    assert "kernel" not in row.to_json() and CollectiveRow.from_json(row.to_json()) == row
    flex = dataclasses.replace(row, kernel="deepep")
    assert flex.to_json()["kernel"] == "deepep" and CollectiveRow.from_json(flex.to_json()) == flex
    assert MemoryGB().to_json() == dict.fromkeys(("weights", "grads", "optimizer", "activations", "workspace",
                                                  "total", "capacity"), 0.0) | {"fits": True}


def test_a_replaced_critical_path_gets_its_own_op_types(result):
    """The op types typed once per result follow its critical path: a copy with another path (a sweep
    record keeps none) lists that path's types, not the original's."""
    assert result.top_op_types(10) == top_op_types(result.critical_path, 10) and result.top_op_types(10)
    lean = dataclasses.replace(result, critical_path=())
    assert lean.top_op_types(10) == [] and lean.to_dict()["critical_path_top"] == []
    short = dataclasses.replace(result, critical_path=result.critical_path[:3])
    assert short.top_op_types(10**6) == top_op_types(result.critical_path[:3], 10**6)


@pytest.mark.parametrize("name", QUICK)
def test_a_sweep_record_keeps_the_runs_critical_path_top(name):
    """A sweep simulates lean (no op-by-op path) and its record drops the path, but both keep the path's op
    types: the record's critical_path_top is the full run's (it was once silently empty)."""
    rs = load_and_resolve(name)
    full, lean = simulate(rs), simulate(rs, lean=True)
    top = full.to_dict()["critical_path_top"]
    assert top and lean.critical_path == () and lean.to_dict()["critical_path_top"] == top
    point = SweepPoint(full.config.tp, full.config.sp, full.config.micro_batch, False, full.config.recompute)
    assert SweepRecord.ran(point, "d", lean).to_json()["result"]["critical_path_top"] == top
    assert SweepRecord.ran(point, "d", full).to_json()["result"]["critical_path_top"] == top


def test_a_results_file_without_the_path_keeps_its_critical_path_top(result):
    """results.json without --full-critical-path read back and written again gives the same bytes, its
    critical_path_top included; with the path in the file, the rows come from the path (saved_top unused)."""
    text = json.dumps(result.to_dict(full_critical_path=False))
    again = StepResult.from_dict(json.loads(text))
    assert again.saved_top and json.dumps(again.to_dict(full_critical_path=False)) == text
    whole = StepResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert whole.saved_top == () and whole.to_dict()["critical_path_top"] == result.to_dict()["critical_path_top"]
