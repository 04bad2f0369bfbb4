"""What moves the dgxc 405B FP8 / BF16 step ratios: the six 405B rows simulated under one change at a time.

    cd benchmarks && ../.venv/bin/python accuracy_fp8_terms.py

Each 405B layout was measured in BF16 and in FP8 with nothing else changed (public-measurements-3.md sections
1-2; benchmarks/accuracy/cp/dgxc405-*.yaml), so their ratio cancels what both recipes share (attention, norms,
the layout's communication pattern) and leaves the GEMMs, the quantize kernels, FP8's wire bytes and how much
communication the faster FP8 GEMMs still hide. A term that moves every pair's simulated ratio alike, or moves
none, cannot explain one pair that misses. Each variant is a scenario override (no constant changes); an
override marked FP8-only (BF16-only) is applied to that row alone. The table prints both steps, the ratio,
the measured ratio and the error. A what-if, not a fit: nothing here is scored.

"BF16-only: gradients reduced in bf16" is what NeMo's performance mode runs (docs/calibration-history.md,
round three, "The 405B FP8 / BF16 ratios"): llama31_405b.py `pretrain_performance_optimizations` sets the
precision plugin's grad_reduce_in_fp32 = False (NVIDIA/NeMo v2.2.0 and v2.3.1, L253), and
megatron_strategy.py L369 (v2.2.0) copies it into the DDP config, for the BF16 plugin as for the FP8 one.
The BF16 cases now set it themselves (run.grad_reduce_dtype: bf16), so that variant equals "as modelled".
"""

from __future__ import annotations

from accuracy_cases import step_cases
from accuracy_rows import what_if_step_s

PAIRS = ("dgxc405-h100-512", "dgxc405-h100-proxy32", "dgxc405-gb200-128")
# label -> (overrides on both rows, on the BF16 row only, on the FP8 row only)
VARIANTS: dict[str, tuple[dict, dict, dict]] = {
    "as modelled": ({}, {}, {}),
    "BF16-only: gradients reduced in bf16 (NeMo)": ({}, {"run.grad_reduce_dtype": "bf16"}, {}),
    "compute/comm interference kappa 0.1": ({"hardware.compute.comm_interference": 0.1}, {}, {}),
    "tp_comm_overlap off (TP collectives exposed)": ({"parallel.tp_comm_overlap": False}, {}, {}),
    "elementwise kernels at full HBM bandwidth": ({"hardware.compute.elementwise_efficiency": 1.0}, {}, {}),
    "FP8-only: no FP8 parameter gather": ({}, {}, {"run.fp8_param_gather": False}),
    "FP8-only: amax history 1": ({}, {}, {"run.fp8_amax_history_len": 1}),
    "DP grad reduce / param gather not overlapped": ({"parallel.dp_overlap": False}, {}, {}),
}


def _cases() -> dict[str, object]:
    return {c.name: c for c in step_cases("cp") if c.name.startswith("dgxc405-")}


def main() -> None:
    cases = _cases()
    print(f"{'variant':46s} {'pair':22s} {'bf16 s':>7s} {'fp8 s':>7s} {'ratio':>6s} {'measured':>8s} {'error':>7s}")
    for label, (both, bf16_only, fp8_only) in VARIANTS.items():
        for pair in PAIRS:
            bf16, fp8 = cases[f"{pair}-bf16"], cases[f"{pair}-fp8"]
            bf16_s, fp8_s = what_if_step_s(bf16, {**both, **bf16_only}), what_if_step_s(fp8, {**both, **fp8_only})
            measured = fp8.measured_s / bf16.measured_s
            ratio = fp8_s / bf16_s
            print(f"{label:46s} {pair:22s} {bf16_s:7.3f} {fp8_s:7.3f} {ratio:6.3f} {measured:8.3f} "
                  f"{100 * (ratio / measured - 1):+6.1f}%")


if __name__ == "__main__":
    main()
