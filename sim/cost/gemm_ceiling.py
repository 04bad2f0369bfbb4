"""The large-GEMM ceiling per GPU generation, at two clocks: sustained (a training step) and burst (a lone kernel).

A GPU's tensor-core rate is its SM clock times a fixed FLOP per clock; NVIDIA states the peak at the boost
clock. A GPU timed for a few iterations of one kernel (FLUX's 5 warm-up + 10 timed GEMMs, bytedance/flux
@239a13d2 test/test_ag_kernel.py L118-145; Megatron-LM's moe_perf, 5 + 20 iterations of one layer with a
synchronize after each, tests/functional_tests/test_cases/common/moe_perf/__main__.py L36-37 @d98e8a64) runs
cold, at or near boost. A training job keeps the tensor cores busy for minutes: the die heats, its leakage
power rises, and the clock settles where the board's power limit holds it (H100 SXM 700 W, A100 SXM 400 W,
datasheets). No source at hand gives that sustained clock, so it is fitted: two figures per GPU, each on the
rows of its own kind, and every by-generation rate (this file, fp8_gemm.py, attention_rate.py) is a
sustained one unless it says otherwise.

    GemmCeiling.sustained   fraction of the 16-bit peak an 8192^3 GEMM reaches inside a training step (the
                            default: every `meshsim run` / sweep / search prices training steps)
    GemmCeiling.burst       the same GEMM timed alone for a few iterations (benchmarks/accuracy's kernel and
                            MoE-layer rows)
    sustained_clock(gpu) = sustained / burst   (<= 1; 1 where no row tells the two apart)

In burst mode (ComputeModel(clock="burst")) the 16-bit ceiling is the burst figure and every other tensor-core
rate, fitted on training steps, is divided by sustained_clock: the clock moves the FP8 and attention MMAs as
it moves the 16-bit ones (an assumption, fitted on nothing: no FP8 or attention kernel row is in our set).

Values (benchmarks/accuracy/fits.yaml names the rows; docs/cost-models.md "GEMM ceiling: sustained and burst"):
- h100: sustained 0.68, fitted on the two dgxc-benchmarking Llama 3.1 405B BF16 H100 steps (nemo 25.04; GEMMs
  ~90% of the step), which ask for 0.680 / 0.687; the Megatron CI GPT-3 7B H100 steps (another release family)
  ask for 0.709 / 0.714 and are out of fit (+0.9% / +2.5% at 0.68). Burst 0.78: FLUX's two H800 cuBLAS GEMMs
  (H100 SXM silicon and clocks) with the all-gather baseline's `alpha_scale * matmul` multiply priced, which
  ask for 0.779 / 0.776. sustained_clock 0.872.
- a100: sustained 0.78, fitted on the three 2020 Megatron-LM A100 dp 1 steps (no data-parallel communication;
  they ask for 0.770 / 0.776 / 0.803); out of fit: the Megatron CI A100 steps (0.828 / 0.750) and NeMo 5B.
  Burst 0.85: FLUX's two A800 GEMMs priced the same way (0.880 / 0.828). sustained_clock 0.918.
- h200: burst 0.80, measured here (8192^3 bf16 at ~790 of 989 TFLOP/s, reference/modeling-facts.md, a lone
  kernel); sustained 0.70 = 0.80 x H100's sustained_clock (0.697): the same GH100 die at the same 700 W limit. Fitted on
  nothing (no H200 step is a case).
- b200: 0.60 both (fitted on the dgxc 405B BF16 GB200 step, a training row: sustained; no Blackwell kernel row).
- v100: DEFAULT_CEILING both, no measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshsim.sim.cost.gemm_efficiency import DEFAULT_CEILING
from meshsim.topologies.gpus import by_gpu_prefix

Clock = Literal["sustained", "burst"]
SUSTAINED: Clock = "sustained"
BURST: Clock = "burst"


@dataclass(frozen=True)
class GemmCeiling:
    """An 8192^3 16-bit GEMM's fraction of the datasheet peak: inside a training step, and timed alone."""

    sustained: float
    burst: float

    def at(self, clock: Clock) -> float:
        return self.burst if clock == BURST else self.sustained

    @property
    def sustained_clock(self) -> float:
        """sustained / burst: the clock a training step holds, as a fraction of a lone kernel's."""
        return self.sustained / self.burst


H100_SUSTAINED, H100_BURST = 0.68, 0.78
H200_BURST = 0.80  # measured here (module docstring)
GEMM_CEILING_BY_GPU = {
    "a100": GemmCeiling(sustained=0.78, burst=0.85),
    "h100": GemmCeiling(sustained=H100_SUSTAINED, burst=H100_BURST),
    "h200": GemmCeiling(sustained=round(H200_BURST * H100_SUSTAINED / H100_BURST, 2), burst=H200_BURST),
    "b200": GemmCeiling(sustained=0.60, burst=0.60),
    "v100": GemmCeiling(sustained=DEFAULT_CEILING, burst=DEFAULT_CEILING),
}
UNKNOWN = GemmCeiling(sustained=DEFAULT_CEILING, burst=DEFAULT_CEILING)


def gemm_ceilings(gpu_name: str) -> GemmCeiling:
    """The GPU preset's pair (GEMM_CEILING_BY_GPU by name prefix, else its reference's), UNKNOWN if neither."""
    return by_gpu_prefix(GEMM_CEILING_BY_GPU, gpu_name, UNKNOWN)


def gemm_ceiling(gpu_name: str, clock: Clock = SUSTAINED) -> float:
    """The large-GEMM fraction of the 16-bit peak at `clock` (sustained: a training step's)."""
    return gemm_ceilings(gpu_name).at(clock)


def gemm_burst_ceiling(gpu_name: str) -> float:
    return gemm_ceiling(gpu_name, BURST)


def clock_factor(gpu_name: str, clock: Clock) -> float:
    """What a sustained (training-step) tensor rate is multiplied by at `clock`: 1, or 1 / sustained_clock."""
    return 1.0 / gemm_ceilings(gpu_name).sustained_clock if clock == BURST else 1.0
