"""GPU presets: vendor datasheet peaks (dense, no sparsity). Source: ../shared/reference/hardware-facts.md
(NVIDIA V100 / A100 / H100 / H200 / B200 datasheets). SM counts from the same vendor material.

HBM capacity: the datasheets' "80GB" / "141GB" are binary sizes (an A100 80GB reports 81920 MiB in
nvidia-smi, a V100 32GB 32768 MiB), so the presets give them in GiB and store them in GB (1e9 B), the
memory model's unit: `gib(80)` = 85.9 GB.

These are peaks. Achieved fractions (GEMM efficiency, HBM efficiency) live in the cost models
(`sim/cost/compute.py`), documented there and overridable per scenario or by a calibration profile.
"""

from __future__ import annotations

from dataclasses import dataclass

GB_PER_GIB = 1024**3 / 1e9


def gib(capacity_gib: float) -> float:
    """A capacity in GiB -> GB (1e9 B)."""
    return capacity_gib * GB_PER_GIB


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_tflops: float  # bf16/fp16 dense matrix TFLOP/s
    mem_gb: float  # HBM capacity, GB (1e9 bytes); presets state it in GiB via gib()
    mem_bw_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU per direction, GB/s (0 = no NVLink)
    nvlink_links: int  # number of NVLink links per GPU
    sm_count: int  # streaming multiprocessors (GEMM wave quantization)
    description: str = ""


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("v100-sxm2", 125.0, gib(32.0), 900.0, 150.0, 6, 80, "NVIDIA V100 SXM2 32GB (fp16 tensor cores)"),
        GpuSpec("a100-40gb", 312.0, gib(40.0), 1555.0, 300.0, 12, 108, "NVIDIA A100 SXM 40GB"),
        GpuSpec("a100-80gb", 312.0, gib(80.0), 2039.0, 300.0, 12, 108, "NVIDIA A100 SXM 80GB"),
        GpuSpec("h100-sxm", 989.0, gib(80.0), 3350.0, 450.0, 18, 132, "NVIDIA H100 SXM5 80GB"),
        GpuSpec("h200-sxm", 989.0, gib(141.0), 4800.0, 450.0, 18, 132, "NVIDIA H200 SXM 141GB"),
        GpuSpec("b200", 2250.0, gib(180.0), 8000.0, 900.0, 18, 148, "NVIDIA B200 (HGX, 1000 W)"),
    )
}
