"""NVLS tree: NCCL's all-reduce across NVLink domains (NVIDIA/nccl 5067397c, NCCL_ALGO_NVLS_TREE).

Which algorithm NCCL runs across racks. With MNNVL (a GB200 NVL72 rack is one NVLink clique,
src/mnnvl.cc) NCCL fuses the clique's topology into one "node" (src/graph/topo.cc L1887-1891), so two
racks are nNodes = 2 with 72 local ranks each (src/init.cc L1285-1297). Across nodes NVLS alone is off
without CollNet (src/graph/tuning.cc L504-506: "NVLS && nNodes > 1" needs collnetEnable), NVLS Tree is
on (L501-502 disables it only on one node); its model there is min(NVLink x nvlsEfficiency x 2, the heads'
NIC bandwidth (x 2 for two nodes), perChMaxNVLSTreeBw) per channel (tuning.cc L307-323), so for two racks
of 72 GPUs NCCL's own model gives NVLS tree about the one-rack NVLS busbw and ranks it above ring and tree.

What the kernel does (src/device/all_reduce.h L527-633, RunWorkColl<AllReduce, NVLS_TREE, Simple>): every
GPU scatters its buffer to the rack's NVLS heads (GPUs with a NIC; src/graph/search.cc L754-770 pairs each
head with a NIC, at most NCCL_MAX_NVLS_ARITY = 32, device.h L213); each head reduces its share in the switch
(multimem ld_reduce) and sends it up the inter-node tree over its own NIC; the root's head reduces what its
children send, multicasts the result into its rack and sends it back down; the children's heads receive
and multicast it; every GPU gathers. Channel c follows tree c % 2 (src/graph/connect.cc L310-316): the two
complementary trees of tree.py over the nodes, so in steady state each head's NIC carries its 1/heads share
once each way.

So per GPU: NVLS port traffic as one rack's NVLS all-reduce (S in, S out, nvls.py), and per head S/heads
on the network each way, on tree edges between same-index heads. The kernel is a pipeline of loops, each
moving channels x heads x chunk bytes (nvls_limits.nvls_tree_kernel_s); the chain one chunk follows has
stages: scatter, a reduce-and-send on the way up per tree level, the root's reduce-multicast-send, a
receive-and-multicast on the way down per level, gather - 2 depth + 3 GPU stages - plus one network
transit per tree edge each way (the proxy posts a chunk to the NIC only once the GPU has written it, and
the receiver's proxy signals only once it landed: store and forward, 2 depth stages). A pipeline of
4 depth + 3 stages fills in 4 depth + 2 loops (NVLS in one rack: 3 stages, 2 loops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.groups import by_node, intra_cycle
from meshsim.sim.cost.collectives.nvls import nvls_plan, nvls_switches
from meshsim.sim.cost.collectives.phases import Flow, Hop, Phase, Plan, hop_between
from meshsim.sim.cost.collectives.tree import dtree_parents
from meshsim.topologies.model import Topology

NVLS_MAX_ARITY = 32  # NCCL_MAX_NVLS_ARITY (src/include/device.h L213): heads per NVLink domain at most


def nvls_tree_applies(topo: Topology, op: str, ranks: Sequence[int]) -> bool:
    """All-reduce over >= 2 nodes, each node's ranks (>= 2) on a common NVLS switch, each with a NIC.
    Memoized per (topology, group) like groups.by_node: a size sweep asks once per size, and the answer
    scans every node's switches (16,384 ranks: 2,048 scans)."""
    if op != "all_reduce" or topo.nic_gbitps <= 0:
        return False
    key = tuple(ranks)
    tab = cache.table(topo, "nvls_tree_applies")
    hit = tab.get(key)
    if hit is None:
        nodes = by_node(topo, key)
        hit = cache.remember(tab, key, len(nodes) >= 2 and all(len(g) >= 2 and bool(nvls_switches(topo, g))
                                                                 for g in nodes))
    return hit


def nvls_heads(ranks_in_node: int) -> int:
    """NVLS heads per node: one per GPU with a NIC, at most NCCL_MAX_NVLS_ARITY (search.cc L1126-1128)."""
    return min(NVLS_MAX_ARITY, ranks_in_node)


def tree_depth(nodes: int) -> int:
    """Edges from the deepest leaf to the root of tree.py's binary trees over `nodes` nodes."""
    return max(1, math.ceil(math.log2(nodes))) if nodes >= 2 else 0


def pipeline_fill_loops(nodes: int) -> int:
    """Loops the NVLS-tree pipeline takes to fill: stages - 1 = (2 d + 3 GPU + 2 d network) - 1 (module doc)."""
    return 4 * tree_depth(nodes) + 2


def _head_flows(topo: Topology, heads: Sequence[Sequence[int]]) -> tuple[list[Flow], Hop | None]:
    """Tree edges between same-index heads of parent and child node, both trees, both ways."""
    nh = min(len(h) for h in heads)
    per = 1.0 / (2 * nh)  # each tree carries half of head h's 1/nh share, up and down
    flows: list[Flow] = []
    net_hop: Hop | None = None
    for parents in dtree_parents(len(heads)):
        for child, parent in enumerate(parents):
            if parent is None:
                continue
            for h in range(nh):
                a, b = heads[child][h], heads[parent][h]
                flows += [Flow(topo.route(a, b), per), Flow(topo.route(b, a), per)]
                hop = hop_between(topo, a, b)
                net_hop = hop if net_hop is None or hop.path_s > net_hop.path_s else net_hop
    return flows, net_hop


def nvls_tree_plan(topo: Topology, ranks: Sequence[int]) -> Plan:
    if not nvls_tree_applies(topo, "all_reduce", ranks):
        raise ValueError("nvls_tree needs an all-reduce over >= 2 NVLS domains with >= 2 ranks each")
    nodes = by_node(topo, ranks)
    flows: list[Flow] = []
    step: Hop | None = None
    for members in nodes:
        phase = nvls_plan(topo, "all_reduce", members).phases[0]
        flows += phase.flows
        hop = phase.latency[0][0]
        step = hop if step is None or hop.path_s > step.path_s else step
    heads = [intra_cycle(topo, members)[:nvls_heads(len(members))] for members in nodes]
    net, net_hop = _head_flows(topo, heads)
    assert step is not None and net_hop is not None
    latency = ((step, 1.0), (net_hop, 2.0 * tree_depth(len(nodes))))
    return Plan("nvls_tree", (Phase(tuple(flows + net), latency, 1),), 1, True)
