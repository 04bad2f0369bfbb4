"""NVLS tree's own limit: its kernel's pipeline of loops (nvls_tree.py says what the kernel does).

NVIDIA/nccl 5067397c, src/transport/nvls.cc L155-199 (ncclNvlsTuning, ncclNvlsTreeSm100Tuning): on more
than one node SM100 runs NVLS_NCHANNELS_SM100 = 32 channels; with two nodes and NICs of >= 48 GB/s it
keeps 32 channels and caps the tree chunk at 64 KiB from 16 GPUs per node (256 KiB at <= 4); with more
nodes it runs 24 channels (NICs of 48-96 GB/s). Hopper keeps NVLS_NCHANNELS_SM90 = 16, 128 KiB chunks,
64 KiB from 4 nodes (L227-230). src/enqueue.cc L2276-2285 shrinks the chunk below 32 / 16 / 4 / 1 x
channels x heads x chunk. A loop moves channels x heads x chunk bytes (all_reduce.h L535: loopCount =
nHeads x chunkCount per channel).

    loops     = ceil(nbytes / (channels x heads x chunk(nbytes)))
    kernel_s  = (loops + fill) x (loop_overhead + nbytes / loops / port_rate)
    time      = latency + max(link time (the plan's NVLink and NIC flows), kernel_s)

fill = 4 depth + 2 loops (nvls_tree.pipeline_fill_loops: 6 for two racks); port_rate = the GPU's NVLS
port traffic (nvls_limits.nvls_port_gbps), the one-node kernel's rate: NCCL's own model gives the tree
the one-node NVLS bandwidth per channel (tuning.cc L307-323: min(NVLink x nvlsEfficiency x 2, NIC x 2,
perChMaxNVLSTreeBw)), and the NICs of 32 heads (1,600 GB/s per direction) never bind against NVLink.
The loop overhead is NVLS's (nvls_limits.NVLS_LOOP_OVERHEAD_US).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshsim.sim.core.units import GB
from meshsim.sim.cost.collectives.groups import by_node
from meshsim.sim.cost.collectives.nvls_limits import (
    NVLS_CHANNELS,
    NVLS_LOOP_OVERHEAD_US,
    NVLS_MAX_CHUNK_BYTES,
    nvls_generation,
    nvls_port_gbps,
    shrunk_chunk_bytes,
)
from meshsim.sim.cost.collectives.nvls_tree import nvls_heads, pipeline_fill_loops
from meshsim.sim.cost.collectives.phases import PlanCost
from meshsim.sim.cost.collectives.protocols import NcclConstants
from meshsim.topologies.model import Topology

NVLS_TREE_CHUNK_STEPS = ((32, 256 * 1024), (16, 128 * 1024), (4, 64 * 1024), (1, 32 * 1024))  # enqueue.cc


def nvls_tree_setup(gpu: str, nodes: int, nic_gbps: float, ppn: int) -> tuple[int, int]:
    """(channels, largest chunk bytes) of an NVLS-tree call (nvls.cc L164-199, L227-230)."""
    if nvls_generation(gpu) != "blackwell":
        return NVLS_CHANNELS["hopper"], 64 * 1024 if nodes >= 4 else NVLS_MAX_CHUNK_BYTES
    if nodes == 2 and nic_gbps >= 48.0:
        if ppn <= 4:
            return 32, 256 * 1024
        return 32, 64 * 1024 if ppn >= 16 else NVLS_MAX_CHUNK_BYTES
    if nic_gbps >= 96.0:
        return (24, 256 * 1024) if ppn <= 8 else (32, 128 * 1024 if ppn < 32 else 64 * 1024)
    if nic_gbps >= 48.0:
        return 24, NVLS_MAX_CHUNK_BYTES
    return 32, 64 * 1024 if nodes >= 4 else NVLS_MAX_CHUNK_BYTES


def nvls_tree_chunk_bytes(nbytes: int, channels: int, heads: int, largest: int) -> int:
    """enqueue.cc L2276-2285: the chunk shrinks below 32 / 16 / 4 / 1 x channels x heads x chunk."""
    return shrunk_chunk_bytes(nbytes, channels * heads, largest, NVLS_TREE_CHUNK_STEPS)


def nvls_tree_kernel_s(gpu: str, nbytes: int, nodes: int, ppn: int, nic_gbps: float, port_gbps: float,
                       loop_overhead_us: float | None = None) -> float:
    """The kernel's time for an all-reduce of nbytes over `nodes` nodes of `ppn` ranks (module doc)."""
    if nbytes <= 0 or nodes < 2:
        return 0.0
    channels, largest = nvls_tree_setup(gpu, nodes, nic_gbps, ppn)
    heads = nvls_heads(ppn)
    loops = math.ceil(nbytes / (channels * heads * nvls_tree_chunk_bytes(nbytes, channels, heads, largest)))
    overhead_s = (NVLS_LOOP_OVERHEAD_US if loop_overhead_us is None else loop_overhead_us) * 1e-6
    return (loops + pipeline_fill_loops(nodes)) * (overhead_s + nbytes / loops / (port_gbps * GB))


def nvls_tree_call_channels(topo: Topology, ranks: Sequence[int]) -> int:
    """CTAs an NVLS-tree call runs on (nvls.cc: channels by generation, nodes, NIC rate, GPUs per node)."""
    nodes = by_node(topo, ranks)
    nic_gbps = topo.nic_gbitps / 8.0
    return nvls_tree_setup(topo.gpu, len(nodes), nic_gbps, max(len(g) for g in nodes))[0]


def nvls_tree_scale(topo: Topology, pc: PlanCost, ranks: Sequence[int], nbytes: int,
                    constants: NcclConstants) -> float:
    """link time / max(link time, kernel time): the bandwidth part's slowdown below the plan's links."""
    nodes = by_node(topo, ranks)
    port = nvls_port_gbps(topo.gpu, constants.nvls_channels, constants.nvls_channel_gbps)
    kernel_s = nvls_tree_kernel_s(topo.gpu, nbytes, len(nodes), max(len(g) for g in nodes),
                                  topo.nic_gbitps / 8.0, port, constants.nvls_loop_overhead_us)
    link_s = nbytes * pc.s_per_byte
    return link_s / kernel_s if kernel_s > link_s else 1.0
