"""How many channels - one CTA, so one SM, each - a NCCL collective kernel runs on.

- Ring, tree, hierarchical, direct: the communicator's ring channels, of which a small call launches fewer
  (enqueue.cc: nccl_limits.channels_used). On one node two per NVLink, at most 32
  (nccl_limits.default_channels). Across nodes NCCL's topology search builds one ring channel per NIC the
  node-local ranks use, at the NIC's speed (src/graph/search.cc, speedArrayInter); ncclTopoDupChannels
  duplicates them when a channel runs at >= 25 GB/s (NDR 400 Gb/s NICs: 48 GB/s; not HDR's 25 GB/s,
  searched at 24), and ncclTopoPostset doubles them again (src/graph/connect.cc, "Duplication should be
  complete now"), at most MAXCHANNELS: 4 per NDR NIC, 2 per HDR NIC (v2.18-2.20). A DP group of one GPU
  per node thus runs 4 (H100) or 2 (A100) channels, not a node's 32 or 24. NcclConstants.channels
  overrides both.
- NVLS: NCCL_NVLS_NCHANNELS (16 on SM90, 24 on SM100; nvls_limits.py; NcclConstants.nvls_channels overrides).

`kernel_channels` is what a running collective takes from a concurrent GEMM (one SM per channel: NCCL
launches one CTA per channel, src/enqueue.cc). It is exposed for the compute model's interference term and
not used by the step engine here.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.groups import by_node
from meshsim.sim.cost.collectives.nccl_limits import MAX_CHANNELS, channels_used, default_channels
from meshsim.sim.cost.collectives.nvls_limits import nvls_channels
from meshsim.sim.cost.collectives.nvls_tree_limits import nvls_tree_call_channels
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


NET_DUP_MIN_GBPS = 25.0  # search.cc ncclTopoDupChannels: duplicate when a channel's bandwidth is >= 25 GB/s
NET_SEARCH_GBPS = (48.0, 45.0, 42.0, 40.0, 30.0, 28.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 10.0, 6.0, 3.0)  # speeds tried


def network_channels(topo: Topology, local_ranks: int) -> int:
    """Ring channels of a multi-node communicator with `local_ranks` GPUs per node (module doc)."""
    nic_gbps = topo.nic_gbitps / 8.0
    nics_per_gpu = topo.nic_gbps_per_gpu / nic_gbps if nic_gbps > 0 else 0.0
    nics = max(1, min(local_ranks, round(local_ranks * nics_per_gpu)))
    speed = next((s for s in NET_SEARCH_GBPS if s <= nic_gbps), NET_SEARCH_GBPS[-1])
    per_nic = (2 if speed >= NET_DUP_MIN_GBPS else 1) * 2
    return max(2, min(MAX_CHANNELS, nics * per_nic))


def group_channels(topo: Topology, ranks: Sequence[int], constants: NcclConstants = DEFAULT_CONSTANTS) -> int:
    """NCCL's ring channels for a communicator over `ranks`: one node's NVLink rings, or across nodes the
    network channels of its node-local ranks (module doc); constants.channels overrides."""
    if constants.channels is not None:
        return constants.channels
    nodes = by_node(topo, ranks)
    if len(nodes) < 2 or topo.nic_gbitps <= 0:
        return ring_channels(topo, constants)
    return network_channels(topo, max(len(g) for g in nodes))


def kernel_channels(topo: Topology, algo: str, protocol: str, nbytes: int, ranks: int | Sequence[int],
                    constants: NcclConstants = DEFAULT_CONSTANTS) -> int:
    """Channels (CTAs, SMs) the kernel of one call runs on; 0 for an empty call (algo "none"). `ranks`: the
    group (or its size, taken as one node's)."""
    group = range(ranks) if isinstance(ranks, int) else ranks
    if algo == "none" or nbytes <= 0 or len(group) < 2:
        return 0
    if algo == "nvls":
        return nvls_channels(topo.gpu, constants.nvls_channels)
    if algo == "nvls_tree":
        return nvls_tree_call_channels(topo, group)
    channels = group_channels(topo, group, constants)
    if protocol == IDEAL:
        return channels
    return channels_used(nbytes, "tree" if algo == "tree" else family(algo), protocol, len(group), channels)
