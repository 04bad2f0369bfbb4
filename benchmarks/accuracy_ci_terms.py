"""What moves the Megatron CI gpt3 7B tp1 pp4 / tp4 ratio: the six CI rows simulated under one change at a time.

    cd benchmarks && ../.venv/bin/python accuracy_ci_terms.py

The CI runs the same model, batch and settings as tp1 pp4 (vp 8, micro-batch 1) and as tp4 (micro-batch 2) on
A100, H100 and GB200 (benchmarks/accuracy/dense/ci-gpt3-7b-*.yaml). Their ratio cancels what both layouts share
(the model's per-head attention, the GEMM ceiling, the step's fixed costs), so a term that leaves every GPU's
simulated ratio where it was cannot explain a ratio that misses. Each variant is a scenario override (no
constant is changed); the table prints each GPU's pp4 / tp4 ratio, measured and simulated, and both steps.
A what-if, not a fit: nothing here is scored.
"""

from __future__ import annotations

from accuracy_cases import step_cases
from accuracy_rows import what_if_step_s

GPUS = ("a100", "h100", "gb200")
# label -> (overrides applied to both layouts, GPUs it applies to)
VARIANTS: dict[str, tuple[dict, tuple[str, ...]]] = {
    "as modelled": ({}, GPUS),
    "elementwise kernels at full HBM bandwidth": ({"hardware.compute.elementwise_efficiency": 1.0}, GPUS),
    "launch overhead 0": ({"hardware.compute.launch_overhead_us": 0.0}, GPUS),
    "not deterministic (no FA2 grid, no NaN fill)": ({"run.deterministic": False}, GPUS),
    "vocab 1,024 (output layer and loss nearly free)": ({"model.vocab": 1024}, GPUS),
    "GB200 trays in two NVLink domains (IB between)": (
        {"topology.nodes": 2, "topology.gpus_per_node": 4}, ("gb200",)),
}


def _cases() -> dict[str, object]:
    return {c.name: c for c in step_cases("dense") if c.name.startswith("ci-gpt3-7b-")}


def main() -> None:
    cases = _cases()
    print(f"{'variant':48s} {'gpu':6s} {'pp4 s':>7s} {'tp4 s':>7s} {'ratio':>7s} {'measured':>8s} {'error':>7s}")
    for label, (overrides, gpus) in VARIANTS.items():
        for gpu in gpus:
            pp, tp = cases[f"ci-gpt3-7b-tp1-pp4-{gpu}"], cases[f"ci-gpt3-7b-tp4-pp1-{gpu}"]
            pp_s, tp_s = what_if_step_s(pp, overrides), what_if_step_s(tp, overrides)
            measured = pp.measured_s / tp.measured_s
            ratio = pp_s / tp_s
            print(f"{label:48s} {gpu:6s} {pp_s:7.3f} {tp_s:7.3f} {ratio:7.3f} {measured:8.3f} "
                  f"{100 * (ratio / measured - 1):+6.1f}%")


if __name__ == "__main__":
    main()
