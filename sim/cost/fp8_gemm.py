"""FP8 GEMM cost constants: the FP8 peak a GEMM runs against and the large-FP8-GEMM ceiling per generation.

An FP8 GEMM (sim/schedule/ops.Gemm with fp8) is priced by sim/cost/compute.py with the same shape model as a
16-bit one (sim/cost/gemm_efficiency.py: tile padding, wave quantization, skinny k) against
`fp8_peak_tflops(gpu)`, with 1-byte A and B operands (FP8_OPERAND_BYTES) and the 16-bit output epilogue.
Because the FP8 peak is twice the 16-bit one at the same HBM bandwidth, k_fill (peak / bandwidth, the
epilogue's cost in k-steps) doubles: a GEMM with k = 4096 on an H100 loses 4096 / (4096 + 590) vs
4096 / (4096 + 295) of its tile time, so small and skinny FP8 GEMMs reach less of their peak than bf16 ones,
as the shape model predicts without a separate constant.

FP8_GEMM_CEILING_BY_GPU: the fraction of the FP8 peak an 8192^3 FP8 GEMM reaches (the reference shape of
the shape model) inside a training step: a sustained-clock figure (sim/cost/gemm_ceiling.py; a lone kernel
runs it / sustained_clock). No FP8 GEMM measurement is in this project's reference set and this machine has no GPU,
so both values come from whole-step rows of public-measurements-2.md (benchmarks/accuracy/fits.yaml names
them; every other fp8 case is out of fit):
- h100 / h200 0.62: fitted on the NeMo 24.07 Llama 2 7B FP8 row (8 H100, tp 1, the compute-bound case)
  with the H100 attention rate of sim/cost/attention_rate.py (0.60 before that rate was fitted);
- b200 0.52: fitted on the Megatron-Bridge 25.11 Llama 3 8B FP8-CS row on DGX-B200 (tp 1) with
  the B200 attention rate and Blackwell's transpose-free per-tensor FP8 (sim/schedule/fp8_rules.py);
  GB200 carries the B200 die and runs at its absolute rate: 0.52 x 4500 / 5000 of its own FP8 peak
  (sim/cost/reference_rate.py; its rows are out of fit).
BLOCK_SCALED_RATE_BY_GPU: block-scaled recipes' GEMMs reach a fraction of that per-tensor ceiling. A per-tensor
FP8 GEMM applies its two scales once, in the epilogue. A block-scaled one applies a scale per K-block inside the
main loop: on Hopper, Float8BlockScaling's 1 x 128 / 128 x 128 scales are applied by the CUDA cores when the
partial sums are promoted to fp32 every 128 values of K (cuBLASLt's VEC128 / BLK128x128 scale modes, the
DeepSeek-V3 recipe); on Blackwell, MXFP8's E8M0 scales per 32 values feed the block-scaled tensor-core MMA, which
also loads them per K-block, and TE runs Float8BlockScaling there as MXFP8 GEMMs (pytorch/csrc/extensions/
gemm.cpp L312-314 @d0067d0, "Emulate the FP8 block scaling recipe with MXFP8 on Blackwell"). The published
same-layout pairs say it costs time: Megatron-Bridge's MXFP8 rows are 2.0-5.5% slower per step than its FP8-CS
rows of the same model and layout (Llama 3 8B on B200 / GB200, 25.09 and 25.11; public-measurements-2.md 2.2)
although MXFP8 quantizes with one pass fewer; Megatron-LM's MoE layer benchmark on 8 H100 runs its FP8-blockwise
layers 6-9 points slower against the bf16 ones than per-tensor FP8 at the 0.62 ceiling predicts (section 1.5).
- h100 / h200 0.78: fitted on the Mixtral a2a FP8 layer pair (forward + backward), the other ten FP8 layer rows
  out of fit; the layer rows are lone kernels, priced at the burst clock (sim/cost/gemm_ceiling.py: the FP8
  ceiling / sustained_clock, 0.62 / 0.872), so 0.78 is the block-scaled / per-tensor ratio at one clock (it was
  0.89 against the sustained FP8 ceiling: the same burst rate, 0.552 against 0.555);
- b200 0.92: fitted on the Bridge 25.11 Llama 3 8B MXFP8 row on B200 (the FP8-CS row of the same layout fixed
  the ceiling); the GB200 MXFP8 rows are out of fit. GB200 takes it through its reference.
NVFP4 (run.fp8: nvfp4, TE NVFP4BlockScaling): the GEMMs run against the FP4 peak (topologies/gpus.py
fp4_peak_tflops, Blackwell only) with 0.5-byte E2M1 operands plus one E4M3 scale byte per 16 values
(NVFP4_OPERAND_BYTES), and reach the same fraction of it as the part's block-scaled FP8 GEMMs reach of the FP8 peak
(fp8 ceiling x BLOCK_SCALED_RATE, at the part's FP8 rate_scale): an assumption, no NVFP4 GEMM or NVFP4 step
measurement is in our reference set. So a part's NVFP4 GEMM is as much faster than its MXFP8 one as its
datasheet's FP4 / FP8 ratio says (2x on Blackwell, 3x on Blackwell Ultra) until the shape model's k_fill, which
grows with the peak, says otherwise for small and skinny GEMMs.
A stated hardware.compute.fp8_gemm_efficiency is the recipe's own ceiling and is not scaled.
Override with hardware.compute.fp8_gemm_efficiency, or measure the FP8 GEMMs on a GPU
(validate/calibrate/fp8_gemm.py, torch._scaled_mm; written but not run on a GPU here).
"""

from __future__ import annotations

from meshsim.topologies.gpus import GpuSpec, by_gpu_prefix

FP8_OPERAND_BYTES = 1.0
NVFP4 = "nvfp4"
NVFP4_OPERAND_BYTES = 0.5 + 1 / 16  # E2M1 value + an E4M3 scale per 16 values (the fp32 tensor scale: negligible)
FP8_GEMM_CEILING_BY_GPU = {"h100": 0.62, "h200": 0.62, "b200": 0.52}
DEFAULT_FP8_CEILING = 0.60
# Block-scaled FP8 GEMMs (blockwise, mxfp8): the fraction of the per-tensor ceiling they reach (module doc)
BLOCK_SCALED_RATE_BY_GPU = {"h100": 0.78, "h200": 0.78, "b200": 0.92}
BLOCK_SCALED_RECIPES = ("blockwise", "mxfp8", NVFP4)


def fp8_peak_tflops(gpu: GpuSpec) -> float:
    """The GPU's FP8 dense peak (topologies/gpus.py); a GPU without FP8 is refused at load (scenarios/fp8_checks.py)."""
    if gpu.fp8_peak_tflops <= 0:
        raise ValueError(f"{gpu.name} has no FP8 peak; scenarios/fp8_checks.py should have refused run.fp8")
    return gpu.fp8_peak_tflops


def lowp_peak_tflops(gpu: GpuSpec, recipe: str) -> float:
    """The dense peak a low-precision GEMM of `recipe` runs against: FP4 for nvfp4 (refused at load on a GPU
    without one, scenarios/fp8_checks.py), else FP8."""
    if recipe != NVFP4:
        return fp8_peak_tflops(gpu)
    if gpu.fp4_peak_tflops <= 0:
        raise ValueError(f"{gpu.name} has no FP4 peak; scenarios/fp8_checks.py should have refused run.fp8: nvfp4")
    return gpu.fp4_peak_tflops


def lowp_operand_bytes(recipe: str) -> float:
    """Bytes per A / B element of a low-precision GEMM: NVFP4_OPERAND_BYTES for nvfp4, else 1."""
    return NVFP4_OPERAND_BYTES if recipe == NVFP4 else FP8_OPERAND_BYTES


def lowp_value_bytes(recipe: str) -> float:
    """Bytes per A / B value, scales aside: 0.5 for nvfp4's E2M1, else 1 (the mainloop's k step,
    gemm_efficiency.k_tile)."""
    return 0.5 if recipe == NVFP4 else FP8_OPERAND_BYTES


def fp8_gemm_ceiling(gpu_name: str) -> float:
    """The generation's FP8_GEMM_CEILING_BY_GPU (hardware.compute.fp8_gemm_efficiency, where stated, wins:
    sim/cost/compute.py ComputeModel fills only unstated knobs)."""
    return by_gpu_prefix(FP8_GEMM_CEILING_BY_GPU, gpu_name, DEFAULT_FP8_CEILING)


def block_scaled_rate(recipe: str, gpu_name: str) -> float:
    """BLOCK_SCALED_RATE_BY_GPU for a block-scaled recipe (blockwise, mxfp8, nvfp4), 1 for per-tensor ones."""
    return by_gpu_prefix(BLOCK_SCALED_RATE_BY_GPU, gpu_name, 1.0) if recipe in BLOCK_SCALED_RECIPES else 1.0
