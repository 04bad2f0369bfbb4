"""How many channels - one CTA, so one SM, each - a NCCL collective kernel runs on.

- Ring, tree, hierarchical, direct: the communicator's ring channels (nccl_limits.default_channels: two per
  NVLink, at most 32; NcclConstants.channels overrides), of which a small call launches fewer (enqueue.cc:
  nccl_limits.channels_used).
- NVLS: NCCL_NVLS_NCHANNELS (16 on SM90, 24 on SM100; nvls_limits.py; NcclConstants.nvls_channels overrides).

`kernel_channels` is what a running collective takes from a concurrent GEMM (one SM per channel: NCCL
launches one CTA per channel, src/enqueue.cc). It is exposed for the compute model's interference term and
not used by the step engine here.
"""

from __future__ import annotations

from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.nccl_limits import channels_used, default_channels
from meshsim.sim.cost.collectives.nvls_limits import nvls_channels
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, IDEAL, NcclConstants, family
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Topology


def nvlinks_per_gpu(topo: Topology) -> int:
    """NVLink links per GPU: the topology's NVLink bandwidth per GPU over the preset's per-link rate (an
    export part cut to 400 GB/s, A800 / H800, has 8 links of 25 GB/s), else the GPU preset's count; 0 on a
    topology without NVLink links (a PCIe box: NCCL's 2 channels)."""
    spec = GPUS.get(topo.gpu)
    if spec is None or not _has_nvlink(topo):
        return 0
    if spec.nvlink_links > 0 and spec.nvlink_gbps > 0 and topo.nvlink_gbps_per_gpu > 0:
        return max(1, round(topo.nvlink_gbps_per_gpu / (spec.nvlink_gbps / spec.nvlink_links)))
    return spec.nvlink_links


def _has_nvlink(topo: Topology) -> bool:
    tab = cache.table(topo, "has_nvlink")
    if None not in tab:
        cache.remember(tab, None, any(link.kind == "nvlink" for link in topo.links))
    return tab[None]


def ring_channels(topo: Topology, constants: NcclConstants = DEFAULT_CONSTANTS) -> int:
    """NCCL's channel count on this topology (constants.channels, else two per NVLink, at most 32)."""
    if constants.channels is not None:
        return constants.channels
    return default_channels(nvlinks_per_gpu(topo))


def kernel_channels(topo: Topology, algo: str, protocol: str, nbytes: int, ranks: int,
                    constants: NcclConstants = DEFAULT_CONSTANTS) -> int:
    """Channels (CTAs, SMs) the kernel of one call runs on; 0 for an empty call (algo "none")."""
    if algo == "none" or nbytes <= 0 or ranks < 2:
        return 0
    if algo == "nvls":
        return nvls_channels(topo.gpu, constants.nvls_channels)
    channels = ring_channels(topo, constants)
    if protocol == IDEAL:
        return channels
    return channels_used(nbytes, "tree" if algo == "tree" else family(algo), protocol, ranks, channels)
