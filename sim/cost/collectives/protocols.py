"""NCCL's protocol and link constants: base latency, per-step latency, bandwidth factors, link efficiency.

Source of every figure: /work/shared/reference/modeling-facts.md, which summarises NCCL's own cost model
(NVIDIA/nccl src/graph/tuning.cc and topo.h, v2.30). docs/collectives.md explains how they are used.

- A collective call costs `base_us[family][protocol]` once per NCCL launch, plus per algorithm step the
  per-step hardware latency `hw_us[family][link_class][protocol]` of the link class the step crosses.
- Payload bandwidth is the max-min fair flow rate x NCCL's protocol refinement (nccl_limits.py: ring LL
  1/4 or 1/3 capped at llMaxBw, LL128 0.92 capped per channel, tree 0.92 capped per channel, fewer
  channels for small messages; tuning.cc / enqueue.cc), or, with `protocol_limits=False`, the flat
  `bw_factor[protocol]` (LL 0.5, LL128 0.92, Simple 1.0) x algorithm factor (tree all-reduce 0.92). NVLS
  is bounded by its kernel's loop over chunks either way (nvls_limits.py).
- Ring Simple: NCCL's per-step NVLink latency is paid once per slice of every loop (SIMPLE_CHUNK_BYTES,
  SIMPLE_SLICES_PER_CHUNK), plus a fitted pipeline fill per step (SIMPLE_FILL_BYTES_PER_CHANNEL).
- Link capacity = peak x link efficiency: NCCL's effective NVLink bandwidth per 25 GB/s NVLink link
  (20.0 on A100/SM80, 20.6 on H100/SM90, 40.1 per 50 GB/s link on B200/SM100), PCIe 12 GB/s of a Gen3
  x16's 16, a NIC 12 GB/s of a 100 Gb/s line rate (12.5 GB/s).

The "ideal" protocol has no base latency, no per-step overhead and factor 1 (and no algorithm factor):
with link efficiency 1 it turns the model into the textbook closed forms (tests use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from meshsim.topologies.gpus import by_gpu_prefix

PROTOCOLS = ("ll", "ll128", "simple")  # NCCL protocols, in auto-choice tie-break order
IDEAL = "ideal"
LINK_CLASSES = ("nvlink", "pcie", "network")


def _ro(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


# Base latency per launch (us), tuning.cc: Ring 6.6/14.0/8.4, Tree 6.8/14.0/8.4, NVLS 0 (Simple only).
BASE_US = {
    "ring": {"ll": 6.6, "ll128": 14.0, "simple": 8.4},
    "tree": {"ll": 6.8, "ll128": 14.0, "simple": 8.4},
    "nvls": {"simple": 0.0},
}
# Per-step hardware latency (us), tuning.cc. Tree over PCIe is not in the reference: the ring figures are
# used. NVLS: one "step" per call (into the switch and back out), 12 us, fitted with the NVLS kernel's loop
# model on the 8 x H100 nccl-tests curve (nvls_limits.py; tuning.cc charges 23-25 us). NVLS tree's network
# step (each tree level, up and down): tuning.cc's NET NVLSTree Simple 20.9 us (NVIDIA/nccl 5067397c L173).
HW_US = {
    "ring": {"nvlink": {"ll": 0.6, "ll128": 1.9, "simple": 3.4},
             "pcie": {"ll": 1.0, "ll128": 2.5, "simple": 5.7},
             "network": {"ll": 2.7, "ll128": 4.0, "simple": 14.0}},
    "tree": {"nvlink": {"ll": 0.6, "ll128": 1.25, "simple": 4.0},
             "pcie": {"ll": 1.0, "ll128": 2.5, "simple": 5.7},
             "network": {"ll": 5.0, "ll128": 8.5, "simple": 14.0}},
    "nvls": {"nvlink": {"simple": 12.0}, "network": {"simple": 20.9}},
}
BW_FACTOR = {"ll": 0.5, "ll128": 0.92, "simple": 1.0, IDEAL: 1.0}  # tuning.cc protocol factors
# Tree all-reduce (tuning.cc). NVLS has no flat factor: tuning.cc's 0.85 (Hopper) stands for what bounds NVLS
# below its links, which nvls_limits.py models as its kernel's loop over chunks (FLUX's H800 NVLS all-gather and
# reduce-scatter at 96 MiB run at 0.95 of the link figure, which a flat 0.85 cannot give).
ALGO_BW_FACTOR = {"tree": 0.92}
# Simple/LL128 pipeline fill: a ring/tree step cannot start until the previous step's slice has arrived,
# so besides NCCL's per-step latency each step costs the transfer of up to SIMPLE_FILL_BYTES_PER_CHANNEL on
# each channel at the channel's bandwidth (busbw / channels), at most one step's data per channel:
#     fill_s = steps x channels x min(SIMPLE_FILL_BYTES_PER_CHANNEL, nbytes / (ranks x channels)) / busbw.
# Fitted to the public nccl-tests all_reduce_perf curves (reference/public-measurements.md section 5): the
# 8 x A100 curve from 16 MiB to 256 MiB (2.4 MB per step over its 24 channels); NCCL's own model has no
# such term. Per channel, not per GPU: the export parts (A800 / H800, 8 NVLinks, 16 channels) fill less.
SIMPLE_FILL_BYTES_PER_CHANNEL = 100e3
# NCCL's Simple ring geometry (src/include/collectives.h, device.h, v2.18-v2.30): the Simple buffer is
# 4 MiB in NCCL_STEPS = 8 steps of 512 KiB; a ring all-reduce / all-gather / reduce-scatter chunk is
# ALLREDUCE_CHUNKSTEPS = 4 steps (2 MiB) moved in slices of SLICESTEPS = 2 steps (2 slices per chunk).
# One loop of the kernel moves channels x ranks x chunk bytes; a smaller call shrinks the chunk, a larger
# one runs more loops. Each slice is a flag handshake between neighbours, so on NVLink the per-step
# latency is paid per slice: slices x loops times per step (cost.simple_slice_rounds).
SIMPLE_CHUNK_BYTES = 2 * 1024 * 1024
SIMPLE_SLICES_PER_CHUNK = 2
# Multi-node ring all-reduce with Simple: NCCL multiplies the latency by 1.4 on SM80+ (tuning.cc).
RING_SIMPLE_INTERNODE_LAT_FACTOR = 1.4

# Link efficiency = NCCL's effective bandwidth / peak (topo.h). NVLink per GPU generation, by GPU preset
# prefix; V100 (SM70) is not in the reference and takes the A100 figure (assumption).
NVLINK_EFFICIENCY = {"h100": 20.6 / 25.0, "h200": 20.6 / 25.0, "a100": 20.0 / 25.0, "b200": 40.1 / 50.0}
NVLINK_EFFICIENCY_DEFAULT = 20.0 / 25.0
PCIE_EFFICIENCY = 12.0 / 16.0  # NCCL's 12 GB/s for PCIe Gen3 x16 (16 GB/s per direction)
NETWORK_EFFICIENCY = 12.0 / 12.5  # NCCL's 12 GB/s for a 100 Gb/s NIC (line rate 12.5 GB/s)
INTERNAL_EFFICIENCY = 1.0  # CPU-socket links: no NCCL figure, taken at peak


def family(algo: str) -> str:
    """Which NCCL latency table an algorithm uses: hierarchical and direct are made of ring-like steps,
    NVLS tree shares NVLS's (its NVLink step; its network steps have their own row)."""
    if algo == "nvls_tree":
        return "nvls"
    return algo if algo in ("tree", "nvls") else "ring"


def protocols_for(algo: str) -> tuple[str, ...]:
    """NCCL protocols an algorithm supports: NVLS and NVLS tree only Simple (tuning.cc L301), the others
    LL, LL128 and Simple."""
    return ("simple",) if family(algo) == "nvls" else PROTOCOLS


@dataclass(frozen=True)
class NcclConstants:
    """All protocol/link constants in one overridable object (defaults: NCCL v2.30 tuning.cc/topo.h).

    `link_efficiency`, when set, replaces the per-kind efficiencies for every link kind.
    """

    base_us: Any = field(default_factory=lambda: _ro(BASE_US))
    hw_us: Any = field(default_factory=lambda: _ro(HW_US))
    bw_factor: Any = field(default_factory=lambda: _ro(BW_FACTOR))
    algo_bw_factor: Any = field(default_factory=lambda: _ro(ALGO_BW_FACTOR))
    ring_simple_internode_lat_factor: float = RING_SIMPLE_INTERNODE_LAT_FACTOR
    simple_fill_bytes_per_channel: float = SIMPLE_FILL_BYTES_PER_CHANNEL
    simple_chunk_bytes: int = SIMPLE_CHUNK_BYTES
    simple_slices_per_chunk: int = SIMPLE_SLICES_PER_CHUNK
    nvlink_efficiency: float | None = None  # None: by GPU generation (NVLINK_EFFICIENCY)
    pcie_efficiency: float = PCIE_EFFICIENCY
    network_efficiency: float = NETWORK_EFFICIENCY
    internal_efficiency: float = INTERNAL_EFFICIENCY
    link_efficiency: float | None = None
    protocol_limits: bool = True  # NCCL's LL/LL128/tree caps and small-message channel counts (nccl_limits.py)
    channels: int | None = None  # ring channels; None: nccl_limits.default_channels(NVLinks per GPU)
    nvls_channels: int | None = None  # None: nvls_limits.NVLS_CHANNELS (NCCL_NVLS_NCHANNELS)
    nvls_channel_gbps: float | None = None  # None: nvls_limits.NVLS_CHANNEL_GBPS by generation
    nvls_loop_overhead_us: float | None = None  # None: nvls_limits.NVLS_LOOP_OVERHEAD_US

    def with_tuning(self, tuning: Any) -> NcclConstants:
        """Apply a scenarios.schema.NetworkTuning (only link_efficiency is a constant there)."""
        if tuning is None or getattr(tuning, "link_efficiency", None) is None:
            return self
        return replace(self, link_efficiency=tuning.link_efficiency)

    def efficiencies(self, gpu: str) -> dict[str, float]:
        """Link kind -> achievable fraction of peak, for a topology whose GPU preset is `gpu`."""
        if self.link_efficiency is not None:
            return dict.fromkeys(("nvlink", "pcie", "ib", "internal"), self.link_efficiency)
        nvlink = self.nvlink_efficiency
        if nvlink is None:
            nvlink = by_gpu_prefix(NVLINK_EFFICIENCY, gpu, NVLINK_EFFICIENCY_DEFAULT)
        return {"nvlink": nvlink, "pcie": self.pcie_efficiency, "ib": self.network_efficiency,
                "internal": self.internal_efficiency}

    def base_s(self, algo: str, protocol: str) -> float:
        """Per-launch base latency (s); 0 for the ideal protocol."""
        return 0.0 if protocol == IDEAL else self.base_us[family(algo)][protocol] * 1e-6

    def hw_s(self, algo: str, link_class: str, protocol: str) -> float:
        """NCCL's per-step latency (s) for a step over `link_class`; 0 for the ideal protocol."""
        if protocol == IDEAL:
            return 0.0
        table = self.hw_us[family(algo)]
        return table.get(link_class, table["nvlink"])[protocol] * 1e-6

    def bw_scale(self, algo: str, op: str, protocol: str) -> float:
        """Protocol factor x algorithm factor (tree applies to all-reduce only; ideal: 1)."""
        if protocol == IDEAL:
            return 1.0
        algo_factor = self.algo_bw_factor.get(algo, 1.0) if (algo != "tree" or op == "all_reduce") else 1.0
        return self.bw_factor[protocol] * algo_factor


DEFAULT_CONSTANTS = NcclConstants()
