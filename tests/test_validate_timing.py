"""Calibrate -> profile -> simulate -> run for real, at world size 2 on CPU (two spawns in this file)."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario, resolve  # noqa: E402
from meshsim.scenarios.profile import load_profile  # noqa: E402
from meshsim.sim.results.costers import comm_interference
from meshsim.sim.results.simulate import simulate  # noqa: E402
from meshsim.sim.schedule.ops import Collective, Gemm  # noqa: E402
from meshsim.validate.calibrate.calibration import calibrate  # noqa: E402
from meshsim.validate.crosscheck.crosscheck import run_crosscheck  # noqa: E402
from meshsim.validate.launch.shrink import TIMING, shrink, with_profile  # noqa: E402
from meshsim.validate.timing.measured import schedule_of  # noqa: E402
from meshsim.validate.timing.trace_merge import MEASURED_PID_OFFSET  # noqa: E402

pytestmark = pytest.mark.slow
# every calibration here is checked for its structure, not its accuracy: 5 timed runs per work, not 30
CALIBRATION_REPEATS = 5


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    sc, src = load_scenario("tiny-2gpu")
    shrunk = shrink(sc, 2, TIMING, src)
    path = tmp_path_factory.mktemp("cal") / "profile.yaml"
    calibrate(shrunk, src, 2, out=path, accept_noise=True, repeats=CALIBRATION_REPEATS)  # any load will do
    return sc, src, shrunk, path


def test_profile_covers_the_schedule(calibrated):
    _, src, shrunk, path = calibrated
    prof = load_profile(path)
    schedule = schedule_of(shrunk, src)
    gemms = {(op.work.m, op.work.n, op.work.k) for op in schedule.ops if isinstance(op.work, Gemm)}
    assert gemms == {(g.m, g.n, g.k) for g in prof.gemm_table}
    kernels = {p.kernel for p in prof.kernel_table}
    assert {"flash_attention_fwd", "flash_attention_bwd", "layernorm", "gelu"} <= kernels
    sizes = {op.work.nbytes for op in schedule.ops if isinstance(op.work, Collective)}
    table = {(p.op, p.ranks, p.nbytes): p for p in prof.collective_table}
    assert all(("all_reduce", 2, b) in table for b in sizes)
    p = table[("all_reduce", 2, 1 << 20)]
    assert p.algbw_gbps == pytest.approx((1 << 20) / (p.time_us * 1e-6) / 1e9)
    assert p.busbw_gbps == pytest.approx(p.algbw_gbps * 2 * (2 - 1) / 2)
    assert prof.elementwise_bw_gbps > 0 and prof.measured_on["backend"] == "gloo"
    # interference: kappa measured (validate/calibrate/interference.py), its raw figures recorded with it
    kappa = prof.compute.comm_interference
    assert kappa is not None and 0.0 <= kappa <= 1.0
    assert f"kappa {kappa:.3f}" in prof.measured_on["comm_interference"]


def test_simulation_uses_the_profile(calibrated):
    _, src, shrunk, path = calibrated
    prof = load_profile(path)
    result = simulate(resolve(with_profile(shrunk, str(path)), src))
    ops = {op.id: op for op in schedule_of(shrunk, src).ops}
    tflops = {(g.m, g.n, g.k): g.tflops for g in prof.gemm_table}
    table = {(p.op, p.ranks, p.nbytes): p.time_us for p in prof.collective_table}
    rep = [ev for ev in result.events if ev.rank == 0]
    gemm = next(ev for ev in rep if isinstance(ops[ev.op_id].work, Gemm))
    g = ops[gemm.op_id].work
    assert gemm.end_s - gemm.start_s == pytest.approx(g.flops / (tflops[(g.m, g.n, g.k)] * 1e12))
    coll = next(ev for ev in rep if isinstance(ops[ev.op_id].work, Collective))
    c = ops[coll.op_id].work
    assert (coll.end_s - coll.start_s - coll.wait_s) * 1e6 == pytest.approx(table[(c.op, 2, c.nbytes)])
    assert comm_interference(resolve(with_profile(shrunk, str(path)), src)) == prof.compute.comm_interference


def test_meshsim_run_accepts_the_profile(calibrated, tmp_path):
    from meshsim.sim.cli.main import main

    _, _, shrunk, path = calibrated
    data = shrunk.model_dump(mode="json", exclude_none=True)
    data["hardware"]["profile"] = str(path)
    scenario = tmp_path / "calibrated.yaml"
    scenario.write_text(yaml.safe_dump(data))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--no-html",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["step_time_s"] > 0


def test_crosscheck_reports_error(calibrated, tmp_path):
    sc, src, _, path = calibrated
    check = run_crosscheck(sc, src, 2, profile=str(path), out_dir=tmp_path, repeats=3)
    r = check.report
    assert r["numerics_ok"] is True
    assert r["simulated_step_s"] > 0 and r["measured_step_s"] > 0
    # the error itself is measured, so benchmarks/validate_cpu.py reports it; here only its definition
    expected = 100 * (r["simulated_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
    assert r["error_pct"] == pytest.approx(expected)
    assert set(r["categories"]) == {"compute", "tp_comm"}
    agree = r["critical_path_agreement"]
    assert 0 <= agree["jaccard"] <= 1 and set(agree["share"]) >= {"compute", "tp_comm"}
    doc = json.loads((tmp_path / "trace_merged.json").read_text())
    pids = {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert 0 in pids and {MEASURED_PID_OFFSET, MEASURED_PID_OFFSET + 1} <= pids


def test_crosscheck_runs_fsdp_gathers_and_reduce_scatters_for_real(tmp_path):
    """An FSDP scenario (tp 1, dp 2): the measured step ran every per-block all-gather and reduce-scatter of
    the schedule on gloo, and the report compares DP communication too."""
    from meshsim.scenarios.load import with_overrides
    from meshsim.sim.schedule import op_keys as K

    sc, src = load_scenario("tiny-2gpu")
    sc = with_overrides(sc, {"parallel.tp": 1, "parallel.fsdp": True, "parallel.distributed_optimizer": True,
                             "parallel.global_batch": 8}, src)
    check = run_crosscheck(sc, src, 2, out_dir=tmp_path, repeats=2, accept_noise=True,
                           calibration_repeats=CALIBRATION_REPEATS)
    r = check.report
    assert r["numerics_ok"] is True and r["measured_step_s"] > 0 and "dp_comm" in r["categories"]
    doc = json.loads((tmp_path / "trace_measured.json").read_text())
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    planned = [op.name for op in schedule_of(shrink(sc, 2, TIMING, src), src).ops
               if K.FSDP_GATHER in op.name or K.FSDP_GRAD in op.name]
    assert planned and all(any(name.endswith(p) for name in names) for p in planned)


@pytest.mark.parametrize("fsdp", [False, True])
def test_crosscheck_runs_instance_reduce_scatters_and_cross_instance_all_reduces_for_real(tmp_path, fsdp):
    """Distributed-optimizer instances (tp 1, dp 4 in 2 instances): the measured step ran every bucket's
    reduce-scatter inside its instance, the all-reduce of its shard across the two, and the parameter
    all-gather (with FSDP, hybrid sharding: every block's gathers and reduce-scatters inside the instance,
    the last micro-batch's all-reduces across), on gloo groups built from sim/core/mesh.py's instance kinds."""
    from meshsim.scenarios.load import with_overrides
    from meshsim.sim.schedule import op_keys as K

    sc, src = load_scenario("tiny-2gpu")
    sc = with_overrides(sc, {"parallel.tp": 1, "parallel.distributed_optimizer": True, "parallel.gpus": 4,
                             "parallel.dist_opt_instances": 2, "parallel.global_batch": 8,
                             "parallel.fsdp": fsdp}, src)
    shrunk = shrink(sc, 4, TIMING, src)
    assert shrunk.parallel.dist_opt_instances == 2 and shrunk.parallel.distributed_optimizer
    check = run_crosscheck(sc, src, 4, out_dir=tmp_path, repeats=2, accept_noise=True,
                           calibration_repeats=CALIBRATION_REPEATS)
    assert check.report["numerics_ok"] is True and "dp_comm" in check.report["categories"]
    doc = json.loads((tmp_path / "trace_measured.json").read_text())
    names = [e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    planned = [op.name for op in schedule_of(shrunk, src).ops
               if op.name.startswith("dp.") or K.FSDP_GRAD in op.name or K.FSDP_GATHER in op.name]
    assert any(K.ACROSS_INSTANCES in p for p in planned)
    assert all(any(name.endswith(p) for name in names) for p in planned)
