"""Every built-in scenario simulates end to end, and its headline numbers are consistent with each other."""

from __future__ import annotations

import pytest

from meshsim.scenarios.library import builtin_scenarios
from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.cost.flops import model_flops_per_step
from meshsim.sim.results.simulate import simulate
from meshsim.topologies.gpus import GPUS


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
def test_library_scenario_runs_and_is_consistent(name):
    rs = load_and_resolve(name)
    d = simulate(rs).to_dict()
    step = d["step_time_s"]
    assert step > 0
    model = rs.scenario.model
    # tokens/s, TFLOP/s and MFU all follow from the step time
    assert d["tokens_per_s"] == pytest.approx(rs.scenario.parallel.global_batch * model.seq_len / step, rel=1e-9)
    tflops = model_flops_per_step(rs) / step / rs.gpus / 1e12
    assert d["tflops_per_gpu"] == pytest.approx(tflops, rel=1e-9)
    assert d["mfu"] == pytest.approx(tflops / rs.datasheet_peak_tflops, rel=1e-9)
    assert rs.datasheet_peak_tflops == (rs.scenario.hardware.peak_tflops or GPUS[rs.gpu.name].peak_tflops)
    # above the large-GEMM ceiling would mean FLOPs are miscounted; MFU is quoted over the 16-bit peak, so a
    # low-precision recipe's ceiling is its own peak's share of it (FP8 2x, NVFP4 4x on Blackwell, 6x on Ultra)
    gpu, recipe = GPUS[rs.gpu.name], rs.scenario.run.fp8
    lowp = {"off": gpu.peak_tflops, "nvfp4": gpu.fp4_peak_tflops}.get(recipe, gpu.fp8_peak_tflops)
    assert 0 < d["mfu"] < 0.85 * lowp / gpu.peak_tflops
    # the busy time of the compute stream cannot exceed the step; critical-path shares are a partition
    b = d["breakdown_s"]
    assert b["compute_busy"] <= step * (1 + 1e-9)
    assert b["exposed_comm"] <= (b["tp_comm_busy"] + b["dp_comm_busy"] + b.get("pp_comm_busy", 0.0)
                                 + b.get("ep_comm_busy", 0.0) + 1e-9)
    assert b["compute_busy"] + b["compute_waiting"] == pytest.approx(step, rel=1e-9)
    waiting_parts = ("exposed_tp_comm", "exposed_ep_comm", "exposed_dp_comm_only", "exposed_pp_comm_only",
                     "pipeline_bubble", "nothing_running")
    assert sum(b.get(k, 0.0) for k in waiting_parts) == pytest.approx(b["compute_waiting"], rel=1e-9, abs=1e-12)
    assert sum(d["critical_path_share"].values()) == pytest.approx(1.0)
    # segments of an extrapolated step stand for `count` periods each (sim/results/steady_state.py)
    assert sum(c["dur_us"] * c["count"] for c in d["critical_path"]) == pytest.approx(step * 1e6, rel=1e-6)
    assert d["hfu"] >= d["mfu"] * (1 - 1e-12)  # hardware FLOPs add recompute
    mem = d["memory_gb"]
    parts = ("weights", "grads", "optimizer", "activations", "workspace")
    assert mem["total"] == pytest.approx(sum(mem[k] for k in parts), rel=1e-9)
    assert mem["fits"] == (mem["total"] <= mem["capacity"])


def test_mfu_is_quoted_against_the_datasheet_peak_not_a_profiles_measured_gemm(tmp_path):
    """A calibration profile's gpu.peak_tflops (the best GEMM it measured) feeds the cost models only."""
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides

    (tmp_path / "profile.yaml").write_text("name: measured\ngpu: {peak_tflops: 500.0}\n")
    scenario, source = load_scenario("tiny-2gpu")
    profiled = with_overrides(scenario, {"hardware.profile": str(tmp_path / "profile.yaml")}, source)
    rs = resolve(profiled, source)
    assert rs.gpu.peak_tflops == 500.0 and rs.datasheet_peak_tflops == GPUS["h100-sxm"].peak_tflops
    d = simulate(rs).to_dict()
    assert d["mfu"] == pytest.approx(d["tflops_per_gpu"] / GPUS["h100-sxm"].peak_tflops, rel=1e-9)
    stated = resolve(with_overrides(profiled, {"hardware.peak_tflops": 700.0}, source), source)
    assert stated.datasheet_peak_tflops == 700.0
