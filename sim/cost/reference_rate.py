"""A part calibrated on another preset of its generation runs at that preset's absolute tensor rate (times its own
measured ratio), not at its own datasheet peak times the reference's fractions.

    rate_scale = reference peak / part peak x reference_rate   (16-bit peaks for GEMMs and attention, FP8 for FP8)
    ceiling(part) = ceiling(reference) x rate_scale

The by-generation ceilings (sim/cost/gemm_efficiency.py, fp8_gemm.py, attention_rate.py) are fractions of a
part's datasheet peak, measured on one part per generation. A GPU preset with `reference` set (topologies/
gpus.py) takes that part's constants, and `reference_rate` says how fast it sustains tensor work against it,
whatever the two datasheets print:

- GB200 (reference B200, rate 1, fitted on nothing). It carries the B200 die at a higher power limit (1200 W
  against the HGX B200's 1000 W), and its datasheet prints a higher dense peak (2,500 / 5,000 TFLOP/s bf16 /
  FP8 against 2,250 / 4,500). B200's fractions of that peak would make every GB200 GEMM 11% faster than B200's.
  Megatron-Bridge ran the same model with the same layout and recipe on DGX-GB200 and DGX-B200
  (reference/public-measurements-2.md), and the pairs come out equal: Llama 3 8B FP8-CS / MXFP8, tp 1, mbs 2
  (section 2.2): 25.11 GB200 +2.9% / +0.9% tokens/s over B200, 25.09 +4.5% / +1.8%; Qwen3-30B-A3B MXFP8 ep 8
  mbs 4 (section 1.3): 26.04.01 -3.8%, 26.04 -3.1%, 26.02.01 -1.2%. Seven pairs, mean +0.3%, none beyond 4.5%.
- B300 (Blackwell Ultra, HGX, reference B200, rate 1, fitted on nothing): its datasheet's dense bf16 / FP8
  peaks are B200's; the one B300 row whose model meshsim holds to within a few percent on B200-class parts,
  Qwen3-30B-A3B MXFP8 ep 8 mbs 8 (26.06, section 1.3), comes out -3.1% at rate 1 (out of fit), so nothing
  says it sustains more.
- GB300 (Blackwell Ultra, NVL72, reference B200, its reference_rate fitted): the same datasheet peaks as GB200,
  but its runs are faster at the same layout: Llama 3 8B FP8-CS / MXFP8 25.11 +19% / +21% tokens/s over
  GB200, GPT-OSS-120B BF16 ep 64 +16% to +23% over four releases (26.02-26.04.01). Blackwell Ultra doubles the
  SFU's exponential rate (faster softmax in attention) and the NVL72 part runs at 1400 W; which of the two
  (and how the 160 SMs of the Ultra die clock under load) is not separable with the rows we hold, so one
  rate covers every tensor kernel. Fitted on the Llama 3 8B FP8-CS GB300 row; out of fit: its MXFP8 twin
  and Qwen3-30B-A3B MXFP8 ep 8 mbs 8 on GB300 (26.08), an MoE step with far more non-tensor work.
MFU still divides by the part's own datasheet peak, as its vendor states it. A ceiling the scenario or a
profile states (hardware.compute) is a fraction of the part's own peak and is not scaled (sim/cost/compute.py
ComputeModel fills and scales only the unstated by-generation knobs).
"""

from __future__ import annotations

from meshsim.topologies.gpus import GPUS, GpuSpec

SCALED_KNOBS = {"gemm_efficiency": "peak_tflops", "attention_efficiency": "peak_tflops",
                "fp8_gemm_efficiency": "fp8_peak_tflops"}  # knob -> the peak it is a fraction of


def rate_scale(gpu: GpuSpec, knob: str) -> float:
    """reference peak / part peak x reference_rate for `knob`'s peak (SCALED_KNOBS); 1 without a reference."""
    reference = GPUS.get(gpu.reference) if gpu.reference else None
    if reference is None:
        return 1.0
    field = SCALED_KNOBS[knob]
    own, theirs = getattr(gpu, field), getattr(reference, field)
    return gpu.reference_rate * (theirs / own if own > 0 and theirs > 0 else 1.0)
