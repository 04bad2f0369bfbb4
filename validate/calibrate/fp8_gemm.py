"""Measure FP8 GEMM efficiency by shape on a GPU with torch._scaled_mm (UNTESTED ON A GPU: this project's
machine has none; the CPU test only checks the guard).

    python -m meshsim.validate.calibrate.fp8_gemm [--shapes 8192x8192x8192,4096x14336x4096 ...]

For each (m, n, k): A [m, k] and B [k, n] in float8_e4m3fn (B column-major, as cuBLASLt's FP8 GEMM wants
it), per-tensor fp32 scales of 1, bf16 output; `torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=bf16)`
timed with CUDA events, WARMUP untimed and REPEATS timed runs, the mean. TFLOP/s = 2 m n k / t; efficiency
= TFLOP/s / the GPU's FP8 dense peak (topologies/gpus.py, found by the device name). The 8192^3 shape's
efficiency is what hardware.compute.fp8_gemm_efficiency means (sim/cost/fp8_gemm.py: the shape model
scales the other shapes from it), and the other shapes test that shape model. Needs CUDA compute
capability >= 8.9 (FP8 tensor cores); anything else is refused with one line.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from meshsim.sim.core.errors import CommandFailed
from meshsim.topologies.gpus import GPUS

WARMUP, REPEATS = 5, 20
DEFAULT_SHAPES = ((8192, 8192, 8192), (8192, 14336, 4096), (8192, 4096, 14336), (8192, 6144, 4096),
                  (4096, 4096, 4096), (2048, 4096, 1024), (8192, 4096, 256))
PEAK_BY_NAME = {"H100": "h100-sxm", "H200": "h200-sxm", "B200": "b200", "GB200": "gb200"}


@dataclass(frozen=True)
class Fp8GemmPoint:
    m: int
    n: int
    k: int
    time_us: float
    tflops: float
    efficiency: float  # of the FP8 dense peak


def require_fp8_gpu() -> float:
    """The FP8 dense peak (TFLOP/s) of this process's GPU; CommandFailed when there is no FP8 GPU."""
    if not torch.cuda.is_available():
        raise CommandFailed("FP8 GEMM calibration needs a CUDA GPU; none is visible")
    cc = torch.cuda.get_device_capability()
    if cc < (8, 9) or not hasattr(torch, "_scaled_mm"):
        raise CommandFailed(f"FP8 GEMM calibration needs compute capability >= 8.9 and torch._scaled_mm; "
                            f"this GPU is {cc[0]}.{cc[1]}")
    name = torch.cuda.get_device_name()
    preset = next((p for key, p in PEAK_BY_NAME.items() if key in name), None)
    if preset is None:
        raise CommandFailed(f"no FP8 peak is known for {name!r}: add it to topologies/gpus.py")
    return GPUS[preset].fp8_peak_tflops


def measure_shape(m: int, n: int, k: int, peak_tflops: float) -> Fp8GemmPoint:
    dev = torch.device("cuda")
    a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major [k, n]
    one = torch.ones((), device=dev, dtype=torch.float32)
    for _ in range(WARMUP):
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPEATS):
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    end.record()
    torch.cuda.synchronize()
    time_us = start.elapsed_time(end) * 1e3 / REPEATS
    tflops = 2.0 * m * n * k / (time_us * 1e-6) / 1e12
    return Fp8GemmPoint(m, n, k, time_us, tflops, tflops / peak_tflops)


def measure(shapes=DEFAULT_SHAPES) -> list[Fp8GemmPoint]:
    peak = require_fp8_gpu()
    return [measure_shape(m, n, k, peak) for m, n, k in shapes]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="comma-separated MxNxK shapes (default: a Llama-class set)")
    args = ap.parse_args(argv)
    shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s) or DEFAULT_SHAPES
    try:
        points = measure(shapes)
    except CommandFailed as err:
        print(err, file=sys.stderr)
        return 1
    for p in points:
        print(f"{p.m}x{p.n}x{p.k}: {p.time_us:.1f} us, {p.tflops:.0f} TFLOP/s, {p.efficiency:.3f} of the FP8 peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
