"""GPU presets: vendor datasheet peaks (dense, no sparsity). Source: ../shared/reference/hardware-facts.md
(NVIDIA V100 / A100 / H100 / H200 / B200 datasheets). SM counts from the same vendor material.

HBM capacity: the datasheets' "80GB" / "141GB" are binary sizes (an A100 80GB reports 81920 MiB in
nvidia-smi, a V100 32GB 32768 MiB), so the presets give them in GiB and store them in GB (1e9 B), the
memory model's unit: `gib(80)` = 85.9 GB.

FP8 dense peaks (no sparsity; the datasheets print the sparse figure, twice the dense one): H100 SXM and
H200 SXM 1,979 TFLOP/s (datasheets: "FP8 Tensor Core 3,958 teraFLOPS*", * with sparsity); B200 (HGX B200
datasheet, 8 GPUs: "FP8 72 PFLOPS" sparse) 4,500; GB200 (GB200 NVL72 datasheet, per superchip of two GPUs:
"FP8 20 PFLOPS" sparse, HBM3e 372 GB at 16 TB/s; bf16 "10 PFLOPS" sparse) 5,000 FP8 and 2,500 bf16 per GPU,
186 GB and 8 TB/s. These FP8 figures are not in ../shared/reference/hardware-facts.md: they are the public
NVIDIA datasheet figures, quoted from the datasheets' product tables. V100 and A100 have no FP8 tensor cores
(fp8_peak_tflops 0). compute_capability: sm_70 V100, sm_80 A100, sm_90 H100/H200, sm_100 B200/GB200.

FP4 dense peaks (NVFP4 GEMMs, Blackwell only; the datasheets print sparse and dense FP4 figures): B200 (HGX
B200, 8 GPUs: "FP4 144 PFLOPS", sparse) 9,000; GB200 (GB200 NVL72, 72 GPUs: "FP4 1,440 PFLOPS", sparse)
10,000; B300 (HGX B300, 8 GPUs: "FP4 144 | 108 PFLOPS", sparse | dense) 13,500; GB300 (GB300 NVL72, 72 GPUs:
"FP4 1,440 | 1,080 PFLOPS") 15,000: Blackwell Ultra raises the dense FP4 rate 1.5x over Blackwell, not its
bf16 or FP8 rate. Not in ../shared/reference/hardware-facts.md either (public datasheet figures).

B300 and GB300 (Blackwell Ultra, compute capability 10.3): the HGX B300 and GB300 NVL72 datasheets print the
same dense bf16 / FP8 peaks as B200 / GB200 (HGX B300, 8 GPUs: "FP8 72 PFLOPS", sparse; GB300 NVL72, 72 GPUs:
"FP8 720 PFLOPS" and "FP16/BF16 360 PFLOPS", sparse), 288 GB of HBM3e per GPU at 8 TB/s, NVLink 5 (1.8 TB/s
per GPU, both directions), 160 SMs, and ConnectX-8 800 Gb/s NICs (the dgx-b300 / gb300-nvl72 topology presets).
Not in ../shared/reference/hardware-facts.md either: the public datasheet and product-brief figures.

GB200, B300 and GB300 take B200's by-generation constants (`reference="b200"`), at B200's absolute sustained
rate times their `reference_rate` (sim/cost/reference_rate.py gives the published runs behind each).

These are peaks. Achieved fractions (GEMM efficiency, HBM efficiency) live in the cost models
(`sim/cost/compute.py`), documented there and overridable per scenario or by a calibration profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

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
    fp8_peak_tflops: float = 0.0  # FP8 dense matrix TFLOP/s (0 = no FP8 tensor cores)
    fp4_peak_tflops: float = 0.0  # FP4 (NVFP4) dense matrix TFLOP/s (0 = no FP4 tensor cores)
    compute_capability: tuple[int, int] = (0, 0)  # CUDA sm_XY: which FP8 recipes run (sim/schedule/fp8_rules.py)
    # the preset of its generation whose measured constants it takes ("" = its own): by-generation tables without
    # an entry for this part use that preset's, at that preset's absolute tensor rate x reference_rate
    # (sim/cost/reference_rate.py)
    reference: str = ""
    reference_rate: float = 1.0


GB300_REFERENCE_RATE = 1.30  # fitted (sim/cost/reference_rate.py, benchmarks/accuracy/fits.yaml)

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("v100-sxm2", 125.0, gib(32.0), 900.0, 150.0, 6, 80, "NVIDIA V100 SXM2 32GB (fp16 tensor cores)",
                compute_capability=(7, 0)),
        GpuSpec("a100-40gb", 312.0, gib(40.0), 1555.0, 300.0, 12, 108, "NVIDIA A100 SXM 40GB",
                compute_capability=(8, 0)),
        GpuSpec("a100-80gb", 312.0, gib(80.0), 2039.0, 300.0, 12, 108, "NVIDIA A100 SXM 80GB",
                compute_capability=(8, 0)),
        GpuSpec("h100-sxm", 989.0, gib(80.0), 3350.0, 450.0, 18, 132, "NVIDIA H100 SXM5 80GB",
                fp8_peak_tflops=1979.0, compute_capability=(9, 0)),
        GpuSpec("h200-sxm", 989.0, gib(141.0), 4800.0, 450.0, 18, 132, "NVIDIA H200 SXM 141GB",
                fp8_peak_tflops=1979.0, compute_capability=(9, 0)),
        GpuSpec("b200", 2250.0, gib(180.0), 8000.0, 900.0, 18, 148, "NVIDIA B200 (HGX, 1000 W)",
                fp8_peak_tflops=4500.0, fp4_peak_tflops=9000.0, compute_capability=(10, 0)),
        GpuSpec("gb200", 2500.0, gib(186.0), 8000.0, 900.0, 18, 148, "NVIDIA GB200 (one Blackwell GPU of a "
                "Grace Blackwell superchip, NVL72, 1200 W)", fp8_peak_tflops=5000.0, fp4_peak_tflops=10000.0,
                compute_capability=(10, 0), reference="b200"),
        GpuSpec("b300", 2250.0, gib(288.0), 8000.0, 900.0, 18, 160, "NVIDIA B300 (HGX, Blackwell Ultra)",
                fp8_peak_tflops=4500.0, fp4_peak_tflops=13500.0, compute_capability=(10, 3), reference="b200"),
        # reference_rate fitted on the Megatron-Bridge 25.11 Llama 3 8B FP8-CS row on DGX-GB300 (reference_rate.py)
        GpuSpec("gb300", 2500.0, gib(288.0), 8000.0, 900.0, 18, 160, "NVIDIA GB300 (one Blackwell Ultra GPU of a "
                "Grace Blackwell Ultra superchip, NVL72)", fp8_peak_tflops=5000.0, fp4_peak_tflops=15000.0,
                compute_capability=(10, 3), reference="b200", reference_rate=GB300_REFERENCE_RATE),
    )
}


def by_gpu_prefix(table: Mapping[str, T], gpu_name: str, default: T) -> T:
    """A per-generation table's value for a GPU preset name: the first key the name starts with ("h100" for
    "h100-sxm"), else the value of the preset's `reference` (GB200 takes B200's), else `default`. Every
    by-generation constant (GEMM ceilings, attention rates, NCCL rows, NVLink efficiencies) is looked up here."""
    for key, value in table.items():
        if gpu_name.startswith(key):
            return value
    spec = GPUS.get(gpu_name)
    return by_gpu_prefix(table, spec.reference, default) if spec is not None and spec.reference else default
