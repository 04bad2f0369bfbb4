"""NCCL-style multi-channel rings: all-reduce, all-gather, reduce-scatter, broadcast.

Ring construction (the rings NCCL builds on rail-optimized DGX-class nodes):
- One node: the node's ranks in `intra_cycle` order (shortest-route neighbours), and the same cycle
  reversed as a second channel (NCCL runs rings both ways; on an NVSwitch this changes nothing, on a
  switchless NVLink mesh it uses both directions of every link).
- k ranks on each of several nodes: k channels, one per rail. Channel c visits each node's cycle rotated
  to start at position c; odd-numbered nodes are walked backwards ("snake"), so a ring leaves node j from
  the GPU whose NIC is on the same rail as the GPU it enters in node j+1: every inter-node hop stays on
  one rail (through the rail's leaf switch). With an odd node count the closing hop crosses rails.
- Uneven ranks per node: one ring in ascending rank order.

Each channel carries 1/channels of the data. Steps: all-reduce 2(n-1) (reduce-scatter then all-gather),
all-gather / reduce-scatter n-1, each moving nbytes/n per channel-share; ring steps are identical phases,
evaluated once. Step latency = the channel's average hop latency (NCCL charges each step of a chunk's trip
around the ring at the latency of the hop it crosses). Broadcast is a pipelined chain from the root:
latency = the chain's n-1 hops once, every flow carrying all of its channel's bytes.

Ideal closed forms (one switch, path latency L, per-GPU bandwidth B):
all-reduce 2(n-1) L + 2(n-1)/n S/B; all-gather, reduce-scatter (n-1) L + (n-1)/n S/B; broadcast (n-1) L + S/B.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives.groups import by_node, intra_cycle, ranks_per_node
from meshsim.sim.cost.collectives.phases import Flow, Hop, Phase, Plan, hop_between
from meshsim.topologies.model import Topology

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def ring_orders(topo: Topology, ranks: Sequence[int]) -> list[list[int]]:
    """The rings (channels) over the group, each a list of ranks (see the module doc)."""
    nodes = by_node(topo, ranks)
    if len(nodes) == 1:
        cycle = intra_cycle(topo, nodes[0])
        return [cycle, [cycle[0], *cycle[:0:-1]]] if len(cycle) > 2 else [cycle]
    k = ranks_per_node(topo, ranks)
    if k is None:
        return [sorted(set(ranks))]
    cycles = [intra_cycle(topo, members) for members in nodes]
    rings = []
    for c in range(k):
        ring: list[int] = []
        for j, cycle in enumerate(cycles):
            rotated = cycle[c:] + cycle[:c]
            ring += rotated if j % 2 == 0 else rotated[::-1]
        rings.append(ring)
    return rings


def _edges(order: Sequence[int], closed: bool) -> list[tuple[int, int]]:
    pairs = list(zip(order[:-1], order[1:], strict=True))
    return pairs + [(order[-1], order[0])] if closed else pairs


def latency_of(topo: Topology, pairs: Sequence[tuple[int, int]], weight: float) -> tuple[tuple[Hop, float], ...]:
    """Hops of these (src, dst) pairs, each with `weight`, identical hops merged."""
    acc: dict[Hop, float] = {}
    for a, b in pairs:
        hop = hop_between(topo, a, b)
        acc[hop] = acc.get(hop, 0.0) + weight
    return tuple(acc.items())


def ring_phase(topo: Topology, rings: Sequence[Sequence[int]], frac: float, repeat: int) -> Phase:
    """One ring step over all channels: every rank sends frac x nbytes / channels to its successor."""
    n, per = len(rings[0]), frac / len(rings)
    flows = tuple(Flow(topo.route(a, b), per) for ring in rings for a, b in _edges(ring, True))
    return Phase(flows, latency_of(topo, _edges(rings[0], True), 1.0 / n), repeat)


def ring_plan(topo: Topology, op: str, ranks: Sequence[int]) -> Plan:
    rings = ring_orders(topo, ranks)
    n = len(rings[0])
    multi = len(by_node(topo, ranks)) > 1
    if op == "all_reduce":
        return Plan("ring", (ring_phase(topo, rings, 1.0 / n, 2 * (n - 1)),), 1, multi)
    if op in ("all_gather", "reduce_scatter"):
        return Plan("ring", (ring_phase(topo, rings, 1.0 / n, n - 1),), 1, multi)
    if op == "broadcast":
        return Plan("ring", (_chain_phase(topo, rings, ranks[0]),), 1, multi)
    raise ValueError(f"ring has no plan for {op}")


def _chain_phase(topo: Topology, rings: Sequence[Sequence[int]], root: int) -> Phase:
    """Pipelined broadcast: each channel's ring opened at the root into a chain of n-1 hops."""
    chains = []
    for ring in rings:
        i = list(ring).index(root)
        chains.append(list(ring[i:]) + list(ring[:i]))
    per = 1.0 / len(chains)
    flows = tuple(Flow(topo.route(a, b), per) for chain in chains for a, b in _edges(chain, False))
    return Phase(flows, latency_of(topo, _edges(chains[0], False), 1.0), 1)
