"""The Megatron CI gpt3 7B GB200 rows, round four: what the runs' own memory says about their attention
backend, the FlashAttention 2 grid tail each FA2 row asks for, and the single mechanisms tried against the
tp1 pp4 / tp4 split (each a what-if: nothing scored, no constant changed).

    cd benchmarks && ../.venv/bin/python accuracy_ci_gb200.py

Part 1, memory. The golden mem-max-allocated-bytes of the six rows (Megatron-LM @d98e8a64,
tests/functional_tests/test_cases/gpt/gpt3_7b_*_memory_speed, step 10) against meshsim's worst stage. A100
and GB200 agree to 30 MB in both layouts while H100 differs: the two run one attention backend, FlashAttention
2 (sim/cost/fa2_memory.py: its sbhd output copy at micro-batch 2 is the 1.07 GB between them and H100 at tp 4).

Part 2, the grid tail each FlashAttention 2 row asks for. FA2's deterministic backward is priced as its work
times split_ratio (sim/cost/fa2_deterministic.py: the (G, batch, heads) grid list-scheduled on one CTA per
SM, about 1.7-1.9 here). Holding every other term, the ratio each row's measured step needs, found by
bisection. Where the pp4 and tp4 rows of one GPU ask for different ratios while the grid model gives both
about the same, the split is not in the grid.

Part 3, single mechanisms, each on its own, with the pp4 and tp4 errors and the error of their ratio
(GB200 measured 0.923, H100 1.031, A100 1.135).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from accuracy_cases import step_cases
from accuracy_rows import what_if_step_s

from meshsim.scenarios.load import resolve, with_overrides
from meshsim.sim.cost import compute
from meshsim.sim.cost.attention_rate import fa2_fraction
from meshsim.sim.cost.fa2_deterministic import split_ratio
from meshsim.sim.cost.memory import memory_per_gpu

GPUS = ("a100", "h100", "gb200")
GOLDEN_PEAK_BYTES = {  # mem-max-allocated-bytes, step 10, golden_values_dev_dgx_<gpu>.json @d98e8a64
    ("tp1-pp4", "a100"): 60_489_064_448, ("tp1-pp4", "h100"): 60_720_852_992, ("tp1-pp4", "gb200"): 60_519_342_080,
    ("tp4-pp1", "a100"): 58_188_115_968, ("tp4-pp1", "h100"): 57_143_791_616, ("tp4-pp1", "gb200"): 58_217_476_096,
}


def _cases() -> dict[str, object]:
    return {c.name: c for c in step_cases("dense") if c.name.startswith("ci-gpt3-7b-")}


@contextlib.contextmanager
def fixed_split_ratio(value: float) -> Iterator[None]:
    """FA2's deterministic backward priced at one grid ratio (compute.py imports split_ratio by name)."""
    saved = compute.split_ratio
    compute.split_ratio = lambda *args: value
    try:
        yield
    finally:
        compute.split_ratio = saved


@contextlib.contextmanager
def fa2_at_own_clock() -> Iterator[None]:
    """FlashAttention 2 at the part's own datasheet clock instead of its reference die's rate: a kernel at a
    quarter of the tensor width draws little power (GB200 2,500 against B200's 2,250 TFLOP/s)."""
    saved = compute.ComputeModel.fa2_rate_flops

    def own_clock(self, a):
        width = 2.0 * (a.head_dim + (a.v_head_dim or a.head_dim))
        return self.peak_flops * fa2_fraction(self.gpu, width, a.dropout, self.knobs.attention_efficiency, 1.0)
    compute.ComputeModel.fa2_rate_flops = own_clock
    try:
        yield
    finally:
        compute.ComputeModel.fa2_rate_flops = saved


def asked_split_ratio(case, lo: float = 0.8, hi: float = 3.0, steps: int = 24) -> float:
    """The grid ratio at which the case's simulated step equals its measurement (bisection)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        with fixed_split_ratio(mid):
            lo, hi = (mid, hi) if what_if_step_s(case, {}) < case.measured_s else (lo, mid)
    return (lo + hi) / 2


def memory_table(cases) -> None:
    print(f"{'layout':8s} {'gpu':6s} {'golden GB':>9s} {'meshsim GB':>10s} {'error':>7s}")
    for (layout, gpu), golden in GOLDEN_PEAK_BYTES.items():
        case = cases[f"ci-gpt3-7b-{layout}-{gpu}"]
        scenario = with_overrides(case.scenario, {"hardware.release": case.release}, str(case.path))
        sim_gb = memory_per_gpu(resolve(scenario, str(case.path))).total_gb
        print(f"{layout:8s} {gpu:6s} {golden / 1e9:9.2f} {sim_gb:10.2f} {100 * (sim_gb * 1e9 / golden - 1):+6.1f}%")


def grid_table(cases) -> None:
    print(f"{'case':28s} {'model ratio':>11s} {'asked':>6s}")
    for gpu in ("a100", "gb200"):
        for layout, (batch, heads) in (("tp1-pp4", (1, 32)), ("tp4-pp1", (2, 8))):
            case = cases[f"ci-gpt3-7b-{layout}-{gpu}"]
            sms = resolve(case.scenario, str(case.path)).gpu.sm_count
            model = split_ratio(sms, batch, heads, 8192, 8192, 128, True, None)
            print(f"{case.name:28s} {model:11.3f} {asked_split_ratio(case):6.3f}")


NONE = contextlib.nullcontext
VARIANTS = {  # label -> (overrides, context, GPUs it applies to)
    "as modelled": ({}, NONE, GPUS),
    "GB200 GEMM ceiling 0.70 of its peak": ({"hardware.compute.gemm_efficiency": 0.70}, NONE, ("gb200",)),
    "elementwise at 0.35 of HBM": ({"hardware.compute.elementwise_efficiency": 0.35}, NONE, GPUS),
    "comm interference 0.22 (channels / SMs)": ({"hardware.compute.comm_interference": 0.22}, NONE, GPUS),
    "GB200 NVLink at 450 GB/s (TP all-reduce ~2x)": ({"topology.nvlink_gbps": 450.0}, NONE, ("gb200",)),
    "FA2 at the part's own clock": ({}, fa2_at_own_clock, ("gb200",)),
    "FA2 grid without its tail (ratio 1)": ({}, lambda: fixed_split_ratio(1.0), ("a100", "gb200")),
}


def variants_table(cases) -> None:
    print(f"{'variant':44s} {'gpu':6s} {'pp4 s':>7s} {'err':>6s} {'tp4 s':>7s} {'err':>6s} {'ratio err':>9s}")
    for label, (overrides, context, gpus) in VARIANTS.items():
        with context():
            for gpu in gpus:
                pp, tp = cases[f"ci-gpt3-7b-tp1-pp4-{gpu}"], cases[f"ci-gpt3-7b-tp4-pp1-{gpu}"]
                pp_s, tp_s = what_if_step_s(pp, overrides), what_if_step_s(tp, overrides)
                ratio_err = (pp_s / tp_s) / (pp.measured_s / tp.measured_s) - 1
                print(f"{label:44s} {gpu:6s} {pp_s:7.3f} {100 * (pp_s / pp.measured_s - 1):+5.1f}% {tp_s:7.3f} "
                      f"{100 * (tp_s / tp.measured_s - 1):+5.1f}% {100 * ratio_err:+8.1f}%")


def main() -> None:
    cases = _cases()
    memory_table(cases)
    print()
    grid_table(cases)
    print()
    variants_table(cases)


if __name__ == "__main__":
    main()
