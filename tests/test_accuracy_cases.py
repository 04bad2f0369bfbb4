"""The accuracy report's own data (benchmarks/accuracy/) and the error bands it writes.

What is checked is the data's consistency, never a measured error: every step case loads as a scenario,
names only fields it sets as assumptions and fits in GPU memory under them (an assumption meshsim's own
model refutes is not allowed); fits.yaml names only cases that exist; the checked-in band file is
well-formed and the band of a scenario is its group's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy_cases as cases  # noqa: E402
from accuracy_moe import LAYER_FP8_MS, LAYER_MS  # noqa: E402

from meshsim.scenarios.load import load_and_resolve, resolve  # noqa: E402
from meshsim.sim.cost.memory import memory_per_gpu  # noqa: E402
from meshsim.sim.results import error_band as eb  # noqa: E402
from meshsim.topologies.gpus import GPUS  # noqa: E402

STEP_CASES = [c for g in eb.STEP_GROUPS for c in cases.step_cases(g.name)]


def test_every_step_group_has_cases_and_names_are_unique():
    assert {c.group for c in STEP_CASES} == {g.name for g in eb.STEP_GROUPS if (cases.HERE / g.name).is_dir()}
    names = [c.name for c in STEP_CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.name)
def test_step_case_fits_in_memory_under_its_assumptions(case):
    memory = memory_per_gpu(resolve(case.scenario, str(case.path)))
    assert memory.fits, f"{case.name}: {memory.total_gb:.0f} of {memory.capacity_gb:.0f} GB"
    assert case.measured_s > 0 and case.source
    assert all(a.why for a in case.assumptions)


def test_fits_name_only_existing_cases():
    curve_points = {f"{c.id}-{mib}" for c in cases.curves() for mib, _ in c.busbw_gbps}
    kernel_ids = {k.id for k in cases.kernels()[0]}
    layer_rows = {f"moe-layer-{proxy}-{disp}-{precision}-{phase}" for precision, table in
                  (("bf16", LAYER_MS), ("fp8", LAYER_FP8_MS)) for proxy, disp in table for phase in ("forward", "backward")}
    known = {c.name for c in STEP_CASES} | curve_points | kernel_ids | layer_rows
    fitted = {case for f in cases.fits() for case in f.cases}
    assert fitted <= known, sorted(fitted - known)
    ratio_cases = {n for r in cases.ratios() for n in (r.num, r.den)}
    assert ratio_cases <= {c.name for c in STEP_CASES}


def test_assumption_naming_an_unset_field_is_refused(tmp_path):
    src = STEP_CASES[0].path.read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("  assumptions:", "  assumptions:\n    model.no_such_field: \"x\"", 1), encoding="utf-8")
    with pytest.raises(ValueError, match="no_such_field"):
        cases.load_step_case(bad, "dense")


def test_band_file_is_well_formed():
    data = json.loads(eb.BANDS_FILE.read_text(encoding="utf-8"))
    assert eb.DEFAULT_GROUP in data["groups"]
    registered = {g.name for g in eb.STEP_GROUPS}
    for name, band in data["groups"].items():
        assert name in registered and set(band) == set(eb.BAND_KEYS)
        assert 0 <= band["out_of_fit_mape"] <= band["out_of_fit_max"] and band["out_of_fit_cases"] >= 1
        assert 0 <= band["all_mape"] <= band["all_max"] and band["all_cases"] >= band["out_of_fit_cases"]


def test_error_band_is_the_scenario_groups_and_falls_back_when_it_has_none(monkeypatch):
    rs = load_and_resolve("tiny-2gpu")
    bands = {"dense": eb.ErrorBand("dense", "iteration-time", 0.05, 0.1, 10),
             "other": eb.ErrorBand("other", "iteration-time", 0.2, 0.3, 4)}
    assert eb.error_band(rs, bands) == bands["dense"]
    monkeypatch.setattr(eb, "STEP_GROUPS", (eb.StepGroup("other", "iteration-time", lambda s: s.parallel.tp == 2),
                                            eb.StepGroup("new", "iteration-time", lambda s: True)))
    assert eb.group_of(rs.scenario) == "other" and eb.error_band(rs, bands) == bands["other"]
    monkeypatch.setattr(eb, "STEP_GROUPS", (eb.StepGroup("new", "iteration-time", lambda s: True),))
    band = eb.error_band(rs, bands)
    assert (band.group, band.mape, band.scenario_group) == ("dense", 0.05, "new")
    assert band.sentence().startswith("±5.0% (max 10.0%): the dense group's out-of-fit")
    assert band.sentence().endswith("(the new group has no figures yet)")


def test_cp_cases_are_context_parallel_and_wait_for_their_pending_fields():
    """Every cp case has cp > 1; the NeMo long-sequence ones state the FP8 recipe they ran as accuracy.pending
    (the dgxc 405B ones set their recipe, or none, in the scenario); a case whose pending field the schema
    lacks is shown, not scored; a pending field the schema has is applied."""
    from dataclasses import replace

    import accuracy_rows as rows

    cp_cases = [c for c in STEP_CASES if c.group == "cp"]
    assert cp_cases and all(c.scenario.parallel.cp > 1 and eb.group_of(c.scenario) == "cp" for c in cp_cases)
    assert all(dict(c.pending).keys() == {"run.fp8"} for c in cp_cases if c.name.startswith("nemo-"))
    assert all(not c.pending for c in cp_cases if not c.name.startswith("nemo-"))
    assert rows.has_field("parallel.cp") and not rows.has_field("parallel.no_such_field")
    case = min(cp_cases, key=lambda c: c.scenario.model.seq_len)
    waiting = replace(case, pending=(("run.no_such_field", 1),))
    row = rows.step_row(waiting, rows.Context())
    assert row.simulated is None and not row.scored and row.note.startswith("needs run.no_such_field")
    applied = rows.step_row(replace(case, pending=(("parallel.cp_comm", "a2a"),)), rows.Context())
    assert applied.scored and applied.simulated > 0


def test_fitted_generation_constants_are_the_code_values():
    """fits.yaml's value of each by-generation constant is the one the code uses (no drift between the
    fit table the report reads and the simulator)."""
    from meshsim.sim.cost.attention_rate import attention_efficiency
    from meshsim.sim.cost.collectives.flex import FLEX_NVLINK_CAP_GBPS
    from meshsim.sim.cost.compute import ELEMENTWISE_EFFICIENCY
    from meshsim.sim.cost.fp8_gemm import block_scaled_rate, fp8_gemm_ceiling
    from meshsim.sim.cost.gemm_ceiling import gemm_burst_ceiling, gemm_ceiling

    lookups = {"gemm_ceiling": gemm_ceiling, "gemm_burst_ceiling": gemm_burst_ceiling,
               "fp8_gemm_ceiling": fp8_gemm_ceiling,
               "attention_efficiency": attention_efficiency,
               "block_scaled_rate": lambda gpu: block_scaled_rate("mxfp8" if gpu == "b200" else "blockwise", gpu),
               "reference_rate": lambda gpu: GPUS[gpu].reference_rate,
               "flex_nvlink_cap": FLEX_NVLINK_CAP_GBPS.__getitem__}
    checked = 0
    for fit in cases.fits():
        family, _, gpu = fit.name.partition(".")
        if family in lookups and gpu:
            assert lookups[family](gpu) == pytest.approx(float(fit.value)), fit.name
            checked += 1
    assert checked >= 12
    assert next(f for f in cases.fits() if f.name == "elementwise_efficiency").value == ELEMENTWISE_EFFICIENCY
