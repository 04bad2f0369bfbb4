"""Two-level all-reduce: intra-node reduce-scatter, inter-node all-reduce on every rail in parallel,
intra-node all-gather (three NCCL launches, the way Megatron/Horovod-style hierarchical reductions run).

Applicable to all-reduce when the group has k >= 2 ranks on each of m >= 2 nodes. With S = nbytes:
1. reduce-scatter inside every node (ring, k-1 steps of S/k): rank i of a node ends with shard i summed
   over the node;
2. all-reduce of each S/k shard across the m nodes among the ranks holding the same shard - one ring per
   local position, all rails at once (2(m-1) steps of S/(k m));
3. all-gather inside every node (k-1 steps of S/k).
Ideal closed form (NVLink bandwidth B_n and latency L_n inside a node, network B_x and L_x between):
2(k-1) L_n + 2(k-1)/k S/B_n + 2(m-1) L_x + 2(m-1)/(k m) S/B_x.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives.groups import by_node, intra_cycle, ranks_per_node
from meshsim.sim.cost.collectives.phases import Phase, Plan
from meshsim.sim.cost.collectives.ring import ring_orders, ring_phase
from meshsim.topologies.model import Topology


def hierarchical_applies(topo: Topology, ranks: Sequence[int]) -> bool:
    k = ranks_per_node(topo, ranks)
    return k is not None and k >= 2 and len(by_node(topo, ranks)) >= 2


def _parallel(topo: Topology, groups: Sequence[Sequence[int]], frac: float, repeat: int) -> Phase:
    """One ring phase per group, run concurrently; latency from the first group's ring."""
    phases = [ring_phase(topo, ring_orders(topo, g), frac, repeat) for g in groups]
    flows = tuple(f for p in phases for f in p.flows)
    return Phase(flows, phases[0].latency, repeat)


def hierarchical_plan(topo: Topology, ranks: Sequence[int]) -> Plan:
    if not hierarchical_applies(topo, ranks):
        raise ValueError("hierarchical needs >= 2 ranks on each of >= 2 nodes")
    nodes = by_node(topo, ranks)
    cycles = [intra_cycle(topo, members) for members in nodes]
    k, m = len(cycles[0]), len(cycles)
    rails = [[cycle[p] for cycle in cycles] for p in range(k)]
    intra = _parallel(topo, nodes, 1.0 / k, k - 1)
    inter = _parallel(topo, rails, 1.0 / (k * m), 2 * (m - 1))
    return Plan("hierarchical", (intra, inter, intra), 3, True)
