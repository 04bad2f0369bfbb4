"""A part that carries another preset's die sustains that die's absolute tensor rate, not its own datasheet peak.

    rate_scale = silicon peak / part peak        (16-bit for GEMMs and attention, FP8 for FP8 GEMMs)
    ceiling(part) = ceiling(silicon) x rate_scale

The by-generation ceilings (sim/cost/gemm_efficiency.py, fp8_gemm.py, attention_rate.py) are fractions of a
part's datasheet peak. GB200 (topologies/gpus.py, `silicon="b200"`) carries the B200 die at a higher power
limit (1200 W against the HGX B200's 1000 W), and its datasheet prints a higher dense peak for it (2,500 /
5,000 TFLOP/s bf16 / FP8 against 2,250 / 4,500). Applying B200's fractions to that peak would make every
GB200 GEMM 11% faster than B200's. The published runs say otherwise. Megatron-Bridge ran the same model with
the same layout and recipe on DGX-GB200 and DGX-B200 (reference/public-measurements-2.md), and the pairs come
out equal:
- Llama 3 8B, FP8-CS / MXFP8, tp 1, mbs 2, 8 GPUs (section 2.2): 25.11 GB200 +2.9% / +0.9% tokens/s over
  B200, 25.09 +4.5% / +1.8%;
- Qwen3-30B-A3B, MXFP8, ep 8, mbs 4, 8 GPUs (section 1.3): 26.04.01 -3.8%, 26.04 -3.1%, 26.02.01 -1.2%.
Seven pairs, mean +0.3%, none beyond 4.5%: the dense tensor work runs at the same sustained clocks on both
parts, so the extra datasheet peak does not show up. So a part with `silicon` set sustains the silicon's
absolute rate: its by-generation ceilings are the silicon's scaled by the ratio of the peaks. No constant is
fitted here: the ratio comes from the two datasheets, and the rule from the pairs. MFU still divides by the
part's own datasheet peak, as its vendor states it.

A ceiling the scenario or a profile states (hardware.compute) is a fraction of the part's own peak and is
not scaled (sim/cost/compute.py ComputeModel fills and scales only the unstated by-generation knobs).
"""

from __future__ import annotations

from meshsim.topologies.gpus import GPUS, GpuSpec

SCALED_KNOBS = {"gemm_efficiency": "peak_tflops", "attention_efficiency": "peak_tflops",
                "fp8_gemm_efficiency": "fp8_peak_tflops"}  # knob -> the peak it is a fraction of


def rate_scale(gpu: GpuSpec, knob: str) -> float:
    """silicon peak / part peak for `knob`'s peak (SCALED_KNOBS); 1 for a part of its own die or without that peak."""
    silicon = GPUS.get(gpu.silicon) if gpu.silicon else None
    if silicon is None:
        return 1.0
    field = SCALED_KNOBS[knob]
    own, reference = getattr(gpu, field), getattr(silicon, field)
    return reference / own if own > 0 and reference > 0 else 1.0
