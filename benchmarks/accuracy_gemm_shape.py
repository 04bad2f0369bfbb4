"""Where H100's 16-bit GEMM rate misses: the rows that use it, the ceiling each would need, and the shapes they run.

    cd benchmarks && ../.venv/bin/python accuracy_gemm_shape.py

This script is the evidence behind the two 16-bit ceilings per GPU (sim/cost/gemm_ceiling.py): the training rows'
"needs" column fits the sustained figure (fits.yaml `gemm_ceiling.*`), the FLUX rows' implied ceiling with the
multiply priced (section 3) the burst one (`gemm_burst_ceiling.*`); FLUX rows are priced at the burst clock.
Before that split H100 had one ceiling, 0.75, fitted on FLUX's two H800 cuBLAS GEMMs, and the 405B BF16 H100
rows came out ~7% fast with it (docs/calibration-history.md, round three). This script asks
whether the GEMM *shapes* of those rows, as sm_90 kernels run them, separate them from FLUX's:

1. Per row (H100 and A100: FLUX's kernels and the training rows whose steps are mostly 16-bit GEMMs), its error
   at the GPU's ceiling and the ceiling that would make it exact: for a step, from two simulations (the
   ceiling and 0.05 less, the step taken as a + b / ceiling); for a kernel, ceiling x simulated / measured.
2. Per row, its 16-bit GEMMs' shape as the model prices them, time-weighted over the last pipeline stage's
   schedule: the shape factor against the 8192^3 reference (gemm_efficiency's tiles, waves, split-K, k
   quantization, the epilogue), the wave efficiency and k efficiency of the best unsplit tile, and the operand
   traffic a persistent sm_90 kernel would read from HBM (benchmarks/operand_traffic.py: CUTLASS's
   raster heuristic, L2 reuse within a wave) over the GEMMs' modelled time, at 0.90 of HBM bandwidth.
   `gemm16 s` is the 16-bit GEMM seconds of the last stage's schedule (a kernel row: its measured time).

3. FLUX's "GEMM" times as its torch baselines ran them (bytedance/flux @239a13d2): the all-gather case times
   `alpha_scale * torch.matmul(full_input, weight.t())` with alpha_scale = 1.0 for 16-bit inputs
   (test/test_ag_kernel.py L118-145, perf_torch): the matmul and an elementwise multiply that reads and writes
   the m x n fp16 output; the reduce-scatter case times the matmul alone (test/test_gemm_rs.py L131-148, no
   --has_bias in the README's command lines L62-65). Per FLUX GEMM row: the model's time with the multiply
   priced as an Elementwise kernel (compute.py), and the ceiling each row then implies (the ceiling at which
   the model's GEMM time equals the measured time less the multiply's).

A what-if, not a fit: nothing here is scored and no constant changes.
"""

from __future__ import annotations

from collections import Counter

from accuracy_cases import kernels, step_cases
from accuracy_rows import what_if_step_s
from operand_traffic import operand_traffic_bytes

from meshsim.scenarios.load import resolve, with_overrides
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.gemm_ceiling import BURST
from meshsim.sim.cost.gemm_efficiency import DEFAULT_TILES, REFERENCE_MNK, k_efficiency, wave_efficiency
from meshsim.sim.results.simulate import build_stage_schedules
from meshsim.sim.schedule.ops import Elementwise, Gemm
from meshsim.topologies.gpus import GPUS

# the training rows whose step is mostly 16-bit GEMMs on A100 / H100 (the MoE rows miss by more for other reasons)
ROWS = (("dense", "ci-gpt3-7b-tp4-pp1-h100"), ("dense", "ci-gpt3-7b-tp1-pp4-h100"),
        ("cp", "dgxc405-h100-proxy32-bf16"), ("cp", "dgxc405-h100-512-bf16"),
        ("dense", "ci-gpt3-7b-tp4-pp1-a100"), ("dense", "ci-gpt3-7b-tp1-pp4-a100"),
        ("dense", "megatron2020-a100-2.03b-tp2-dp1"), ("dense", "megatron2020-a100-4.24b-tp4-dp1"),
        ("dense", "megatron2020-a100-8.67b-tp8-dp1"), ("dense", "nemo-gpt3-5b-1node"))
KNOB = "hardware.compute.gemm_efficiency"
STEP = 0.05  # the second simulation's ceiling: the GPU's own less this
L2_BYTES = {"h100": 50 * 1024 * 1024, "a100": 40 * 1024 * 1024}  # reference/hardware-facts.md
HBM_EFFICIENCY = 0.90


def needed_ceiling(case, ceiling: float) -> tuple[float, float]:
    """(the 16-bit ceiling at which the row is exact, step error at `ceiling`) from step(c) = a + b / c fitted
    through two simulations (ceiling and ceiling - STEP)."""
    c0, c1 = ceiling, ceiling - STEP
    hi, lo = (what_if_step_s(case, {KNOB: c}) for c in (c0, c1))
    b = (hi - lo) / (1 / c0 - 1 / c1)
    a = hi - b / c0
    return b / (case.measured_s - a), hi / case.measured_s - 1


def model_and_works(case) -> tuple[ComputeModel, Counter]:
    """The case's compute model and its last pipeline stage's 16-bit GEMMs, counted."""
    scenario = with_overrides(case.scenario, {"hardware.release": case.release}, str(case.path))
    rs = resolve(scenario, str(case.path))
    model = ComputeModel(rs.gpu, rs.scenario.hardware.compute, rs.profile, fill_uninitialized=rs.scenario.run.deterministic,
                         fp8_recipe=rs.scenario.run.fp8, fp8_gemm_rate=rs.fp8_gemm_rate)
    ops = build_stage_schedules(rs)[-1].ops
    return model, Counter(op.work for op in ops if isinstance(op.work, Gemm) and not op.work.fp8)


def shape_terms(model: ComputeModel, g: Gemm) -> tuple[float, float, float, float]:
    """(shape factor / reference's, wave efficiency and k efficiency of the best unsplit tile, HBM operand
    traffic in seconds) of one 16-bit GEMM as the model prices it."""
    gpu = model.gpu
    sms = gpu.sm_count - g.comm_sms
    k_fill = gpu.peak_tflops * 1e3 / gpu.mem_bw_gbps
    rel = model.gemm_efficiency(g) / model.knobs.gemm_efficiency
    tm, tn = max(DEFAULT_TILES, key=lambda t: wave_efficiency(-(-g.m // t[0]) * -(-g.n // t[1]) * g.batch, sms))
    wave = wave_efficiency(-(-g.m // tm) * -(-g.n // tn) * g.batch, sms)
    keff = k_efficiency(g.k, k_fill * g.out_bytes / 2) / k_efficiency(REFERENCE_MNK, k_fill)
    traffic = operand_traffic_bytes(g.m, g.n, g.k, g.batch, tile_m=128, tile_n=256, sm_count=sms,
                                    l2_bytes=L2_BYTES[gpu.name[:4]], value_bytes=2, out_bytes=g.out_bytes)
    return rel, wave, keff, traffic / (gpu.mem_bw_gbps * 1e9 * HBM_EFFICIENCY)


def weighted_shape(case) -> tuple[float, tuple[float, float, float, float]]:
    """(16-bit GEMM seconds of the last stage's schedule, time-weighted shape_terms; traffic as a share)."""
    model, works = model_and_works(case)
    total, sums = 0.0, [0.0, 0.0, 0.0, 0.0]
    for g, count in works.items():
        t = model.time_s(g) * count
        total += t
        rel, wave, keff, traffic_s = shape_terms(model, g)
        for i, v in enumerate((rel, wave, keff)):
            sums[i] += v * t
        sums[3] += traffic_s * count
    if total == 0:
        return 0.0, (0.0, 0.0, 0.0, 0.0)
    return total, (sums[0] / total, sums[1] / total, sums[2] / total, sums[3] / total)


def flux_rows() -> None:
    """Section 3: each FLUX GEMM row with the all-gather baseline's scale multiply priced, and the implied ceiling."""
    print(f"\n{'FLUX GEMM row':40s} {'measured':>8s} {'gemm':>7s} {'+scale':>7s} {'error':>7s} {'ceiling':>7s} "
          f"{'implied':>7s}")
    rows, _ = kernels()
    for k in rows:
        if k.gemm is None:
            continue
        model = ComputeModel(GPUS[k.gpu], clock=BURST)
        m, n, kk = k.gemm
        gemm_ms = model.time_s(Gemm(m, n, kk)) * 1e3
        scale_ms = model.time_s(Elementwise("flux_alpha_scale", 2 * m * n, 2 * m * n)) * 1e3 if "-ag" in k.id else 0.0
        ceiling = model.knobs.gemm_efficiency
        implied = ceiling * gemm_ms / (k.measured_ms - scale_ms)
        print(f"{k.id:40s} {k.measured_ms:8.3f} {gemm_ms:7.3f} {gemm_ms + scale_ms:7.3f} "
              f"{100 * ((gemm_ms + scale_ms) / k.measured_ms - 1):+6.1f}% {ceiling:7.3f} {implied:7.3f}")


def main() -> None:
    print(f"{'row':40s} {'error':>10s} {'needs':>6s} {'gemm16 s':>9s} {'shape':>6s} {'wave':>6s} "
          f"{'k eff':>6s} {'traffic':>7s}")
    for k in kernels()[0]:
        if k.gemm is None:
            continue
        m, n, kk = k.gemm
        g = Gemm(m, n, kk)
        model = ComputeModel(GPUS[k.gpu], clock=BURST)
        rel, wave, keff, traffic_s = shape_terms(model, g)
        sim_ms = model.time_s(g) * 1e3
        need = model.knobs.gemm_efficiency * sim_ms / k.measured_ms
        print(f"{k.id:40s} {100 * (sim_ms / k.measured_ms - 1):+9.1f}% {need:6.3f} "
              f"{k.measured_ms / 1e3:9.5f} {rel:6.3f} {wave:6.3f} {keff:6.3f} {traffic_s * 1e3 / sim_ms:7.2f}")
    cases = {c.name: c for group in {g for g, _ in ROWS} for c in step_cases(group)}
    for _, name in ROWS:
        case = cases[name]
        model, _ = model_and_works(case)
        need, err = needed_ceiling(case, model.knobs.gemm_efficiency)
        secs, (rel, wave, keff, traffic) = weighted_shape(case)
        print(f"{name:40s} {100 * err:+9.1f}% {need:6.3f} {secs:9.3f} {rel:6.3f} {wave:6.3f} {keff:6.3f} "
              f"{traffic:7.2f}")
    flux_rows()


if __name__ == "__main__":
    main()
