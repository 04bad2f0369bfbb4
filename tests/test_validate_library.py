"""`meshsim validate SCENARIO --check` on every built-in scenario: its default variants pass the scenario
rules at 2 and 4 processes (a pipelined scenario's matrix runs unpipelined, "pp1"; its pipeline variants
cover the stages), and what the shrunk model cannot run for real is dropped from it (MLA, MTP, the
recompute modules, a pipeline layout, vocabulary padding, every FP8 knob). Builds the variants only; the
real runs are tests/test_validate_numerics*.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from meshsim.scenarios.library import builtin_scenarios  # noqa: E402
from meshsim.scenarios.load import load_scenario, resolve  # noqa: E402
from meshsim.sim.schedule.shapes import layer_dims  # noqa: E402
from meshsim.validate.launch.shrink import NUMERICS, shrink  # noqa: E402
from meshsim.validate.numerics.check import numerics_payload, scenario_defaults  # noqa: E402
from meshsim.validate.numerics.fp8_emulation import without_fp8  # noqa: E402


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
@pytest.mark.parametrize("nproc", [2, 4])
def test_default_variants_of_every_library_scenario_are_valid(name, nproc):
    scenario, source = load_scenario(name)
    scenario = without_fp8(scenario) if scenario.run.fp8_on else scenario  # what the command runs
    variants, payload = numerics_payload(scenario, source, nproc, None)  # raises on an invalid variant
    assert len(variants) == len(payload["variants"]) > 0


def test_a_pipelined_scenario_runs_its_matrix_unpipelined():
    pipelined, _ = load_scenario("gpt3-175b-a100-pp8")
    flat, _ = load_scenario("tiny-2gpu")
    specs = scenario_defaults(pipelined, 2)
    assert "pp1+sp+gelu+mha+none" in specs and "pp2+tp+gelu+tied" in specs  # the pipeline ones kept as they are
    assert all(s.startswith(("pp1+", "pp2+", "pp4+")) for s in specs)
    assert not any(s.startswith("pp1") for s in scenario_defaults(flat, 2))  # negative control


def test_the_shrunk_model_drops_what_the_real_stack_does_not_run():
    scenario, source = load_scenario("deepseek-v3-h100-ep64")
    assert scenario.model.mla and scenario.model.mtp_layers and scenario.parallel.recompute_modules
    small = shrink(scenario, 2, NUMERICS, source)
    m, p = small.model, small.parallel
    assert m.mla is None and m.mtp_layers == 0 and p.recompute_modules is None and p.pipeline_layout is None
    rs = resolve(small, source)
    assert layer_dims(rs).vocab * rs.tp == m.vocab  # no padding beyond the real stack's vocabulary
    # Megatron's --qk-layernorm on an MLA model means its latent norms: the shrunk standard attention has none
    flagged = scenario.model_copy(update={"model": scenario.model.model_copy(update={"qk_norm": True})})
    assert not shrink(flagged, 2, NUMERICS, source).model.qk_norm


def test_every_fp8_knob_is_off_in_the_16_bit_run():
    scenario, _ = load_scenario("deepseek-v3-gb300-ep32-mxfp8")
    assert scenario.run.fp8_on and scenario.run.fp8_output_proj
    run = without_fp8(scenario).run
    assert not run.fp8_on and not run.fp8_output_proj
