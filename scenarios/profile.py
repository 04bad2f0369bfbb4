"""A hardware profile: what `meshsim calibrate` measured, in a form the cost models consume.

A scenario names it with `hardware: {profile: PATH}`. Every section is optional; what is present
overrides the preset-derived defaults:
- `gpu`: peak figures of the device actually measured (peak_tflops, mem_bw_gbps, mem_gb).
- `compute`: the ComputeTuning knobs fitted from the measurements.
- `gemm_table`: measured GEMM throughput per shape; the compute model uses the nearest measured shape
  (log-distance in m, n, k) and scales by FLOPs (sim/cost/compute.py).
- `elementwise_bw_gbps`: measured bandwidth of memory-bound kernels.
- `collective_table`: measured collective times per (op, ranks, nbytes); for a group of that size the
  collective model interpolates in log(bytes) instead of using the analytic model.
- `samples` (optional, on every table row, and `samples` by field name for the scalar entries): how many
  measured kernels an entry rests on (`meshsim calibrate --from-trace` writes them; older profiles have
  none, which reads as unknown).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from meshsim.scenarios.schema import ComputeTuning, Frozen, NetworkTuning, defaults_of
from meshsim.sim.core.limits import MAX_GPUS
from meshsim.sim.core.quantities import (
    Bytes,
    Dim,
    Flops,
    GBps,
    GBpsOrZero,
    KernelTimeUs,
    MemGB,
    Samples,
    TFLOPs,
)
from meshsim.sim.core.userio import load_yaml


class GpuFigures(Frozen):
    peak_tflops: TFLOPs | None = None
    mem_bw_gbps: GBps | None = None
    mem_gb: MemGB | None = None


class GemmPoint(Frozen):
    m: Dim
    n: Dim
    k: Dim
    batch: Dim = 1
    tflops: TFLOPs
    samples: Samples | None = None


class CollectivePoint(Frozen):
    op: Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
    ranks: int = Field(gt=0, le=MAX_GPUS)
    nbytes: Bytes = Field(gt=0)
    time_us: KernelTimeUs
    algbw_gbps: GBpsOrZero
    busbw_gbps: GBpsOrZero
    samples: Samples | None = None


class KernelPoint(Frozen):
    """A measured non-GEMM kernel (attention, elementwise) keyed by its schedule name."""

    kernel: str
    bytes: Bytes = 0
    flops: Flops = 0.0
    time_us: KernelTimeUs
    samples: Samples | None = None


class HardwareProfile(Frozen):
    name: str
    measured_on: dict[str, str] = {}  # device, backend, torch version, date, host
    gpu: GpuFigures = defaults_of(GpuFigures)
    compute: ComputeTuning = defaults_of(ComputeTuning)
    network: NetworkTuning = defaults_of(NetworkTuning)
    gemm_table: list[GemmPoint] = []
    elementwise_bw_gbps: GBps | None = None
    kernel_table: list[KernelPoint] = []
    collective_table: list[CollectivePoint] = []
    samples: dict[str, int] = {}  # scalar entry (elementwise_bw_gbps, compute.host_dispatch_us, ...) -> kernels behind it


def load_profile(path: str | Path) -> HardwareProfile:
    """Read a profile YAML (unreadable, non-UTF-8 or malformed files raise UserError, sim/core/userio.py).
    Validation errors propagate (scenarios/load.py turns them into UserError)."""
    data = load_yaml(path, field="hardware.profile") or {}
    return HardwareProfile.model_validate(data)


def save_profile(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        yaml.safe_dump(profile.model_dump(mode="json", exclude_defaults=True), fh, sort_keys=False)
