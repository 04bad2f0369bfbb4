"""NCCL's protocol bandwidth refinements and channel counts: why small and mid-size collectives are slow.

NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, v2.18-v2.30) does not give the
LL and LL128 protocols a flat fraction of the link bandwidth. On the bus bandwidth B of the ring/tree
(channels x per-channel bandwidth) it applies:

    ring LL:     min(llMaxBw, B / 4)  for all-reduce, reduce or > 1 node;  min(llMaxBw, B / 3) otherwise
    ring LL128:  min(0.92 B, channels x perChMaxRingLL128Bw)
    tree (AR):   min(0.92 B, channels x perChMaxTreeBw), then LL: min(that / 3.8, llMaxBw),
                 LL128: that x 7/9 on one node, x 120/128 across nodes

and then launches fewer channels than it has for a small message (src/enqueue.cc): while
nbytes < channels x threads x threshold, drop a channel. Thresholds (bytes per thread): LL 8 (x ranks for
ring), LL128 8, Simple 64; threads per channel: LL 512, LL128 640, Simple 512 (src/include/device.h).
The busbw of a call is then B x used / channels before the caps (each channel carries B / channels).

llMaxBw (GB/s) by GPU generation and node count (1 / 2 / >= 4 nodes) and the per-channel caps are
tuning.cc's tables. The channel count is not in tuning.cc: NCCL's topology search finds one ring per
NVLink and duplicates them on SM80+ (NCCL_DEBUG=INFO on a DGX A100 prints 24 collective channels); we take
min(32, 2 x NVLinks per GPU), NCCL's MAXCHANNELS being 32 (assumption for H100/B200; overridable).
"""

from __future__ import annotations

import math

from meshsim.topologies.gpus import by_gpu_prefix

# GPU preset prefix -> NCCL's architecture row (Volta SM70, Ampere SM80, Hopper SM90, Blackwell SM100)
GENERATION_BY_GPU = {"v100": "volta", "a100": "ampere", "h100": "hopper", "h200": "hopper", "b200": "blackwell"}
DEFAULT_GENERATION = "ampere"
# tuning.cc llMaxBws: (1 node, 2 nodes, >= 4 nodes)
LL_MAX_BUSBW_GBPS = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
                     "blackwell": (282.0, 90.0, 70.0)}
# tuning.cc perChMaxRingLL128Bws and perChMaxTreeBws (1 node, 2 nodes, >= 4 nodes)
RING_LL128_PER_CHANNEL_GBPS = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                               "hopper": (36.7, 36.7, 36.7), "blackwell": (73.4, 73.4, 73.4)}
TREE_PER_CHANNEL_GBPS = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                         "blackwell": (77.4, 82.8, 72.0)}
RING_LL_FACTOR = {"reducing": 1.0 / 4.0, "other": 1.0 / 3.0}  # tuning.cc ring LL
TREE_LL_DIVISOR = 3.8
TREE_LL128_FACTOR = {"one_node": 7.0 / 9.0, "multi_node": 120.0 / 128.0}
LL128_FACTOR = 0.92
# enqueue.cc channel thresholds (bytes per thread) and threads per channel by protocol
THREAD_THRESHOLD_BYTES = {"ll": 8, "ll128": 8, "simple": 64}
THREADS_PER_CHANNEL = {"ll": 512, "ll128": 640, "simple": 512}
MAX_CHANNELS = 32


def generation(gpu: str) -> str:
    """NCCL's architecture row for a GPU preset name (by prefix; unknown GPUs take Ampere's)."""
    return by_gpu_prefix(GENERATION_BY_GPU, gpu, DEFAULT_GENERATION)


def default_channels(nvlinks_per_gpu: int) -> int:
    """Ring channels NCCL builds: two per NVLink (one ring per link, duplicated on SM80+), at most 32."""
    return max(2, min(MAX_CHANNELS, 2 * nvlinks_per_gpu))


def node_index(nodes: int) -> int:
    """Column of tuning.cc's tables: 1 node, 2 nodes, >= 4 nodes (3 nodes use the 2-node column)."""
    return 0 if nodes <= 1 else 1 if nodes < 4 else 2


def channels_used(nbytes: int, algo: str, protocol: str, ranks: int, channels: int) -> int:
    """enqueue.cc: drop channels while nbytes < channels x threads x threshold (ring LL's threshold x ranks)."""
    threshold = THREAD_THRESHOLD_BYTES[protocol] * (ranks if algo == "ring" and protocol == "ll" else 1)
    per_channel = THREADS_PER_CHANNEL[protocol] * threshold
    return max(1, min(channels, math.ceil(nbytes / per_channel) if nbytes > 0 else 1))


def protocol_busbw_gbps(busbw_gbps: float, *, algo: str, op: str, protocol: str, gen: str, nodes: int,
                        channels: int, used: int) -> float:
    """NCCL's bus bandwidth for (algorithm, protocol) from the ring/tree bus bandwidth `busbw_gbps` of all
    `channels` when only `used` channels run (see module doc). Simple on a ring is busbw x used/channels."""
    col = node_index(nodes)
    bus = busbw_gbps * used / channels
    ll_max = LL_MAX_BUSBW_GBPS[gen][col]
    if algo == "tree":
        bus = min(bus * 0.92, used * TREE_PER_CHANNEL_GBPS[gen][col])
        if protocol == "ll":
            return min(bus / TREE_LL_DIVISOR, ll_max)
        if protocol == "ll128":
            return bus * TREE_LL128_FACTOR["one_node" if nodes <= 1 else "multi_node"]
        return bus
    if protocol == "ll":
        reducing = op in ("all_reduce", "reduce") or nodes > 1
        return min(ll_max, bus * RING_LL_FACTOR["reducing" if reducing else "other"])
    if protocol == "ll128":
        return min(bus * LL128_FACTOR, used * RING_LL128_PER_CHANNEL_GBPS[gen][col])
    return bus
