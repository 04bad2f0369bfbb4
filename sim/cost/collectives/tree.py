"""NCCL's double binary tree all-reduce: a chain inside each node, two complementary binary trees across
nodes, each tree carrying half of the data; reduce up and broadcast down, pipelined.

Construction (after NCCL's ncclGetBtree/ncclGetDtree, written from the idea, not the code):
- Tree 0 over node indices 0..m-1: node r != 0 has parent (r ^ b) | (b << 1) with b the lowest set bit of
  r, or r ^ b when that is >= m; node 0 is the root. Depth ceil(log2 m).
- Tree 1 is the same tree on relabelled nodes - mirrored (r -> m-1-r) for even m, shifted by one for odd
  m - so that tree 0's leaves are tree 1's inner nodes and the load per node evens out.
- Channels: with k ranks per node, k channels; channel c's chain in every node is the node's cycle
  rotated to start at position c, and its first GPU (the "head") joins the inter-node trees. Heads of one
  channel sit on the same rail, so inter-node tree edges stay on one rail. One node: n channels (every
  rank is head once), which balances the chain ends.

Pipelining enters analytically: in steady state every edge streams its share concurrently (up and down),
so the bandwidth term is nbytes x max(frac / rate) over all edges (frac = 1 / (2 x channels)); the
pipeline fill is the longest leaf-to-root path, up then down: 2((k-1) intra hops + depth inter hops),
NCCL's tree latency. Ideal closed form on one switch: 2(n-1) L + 2(n-1)/n S/B.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives.groups import by_node, intra_cycle, ranks_per_node
from meshsim.sim.cost.collectives.phases import Flow, Hop, Phase, Plan, hop_between
from meshsim.topologies.model import Topology


def btree_parent(r: int, m: int) -> int | None:
    """Parent of node r in NCCL-style binary tree 0 over m nodes (None for the root 0)."""
    if r == 0:
        return None
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    return up if up < m else r ^ bit


def dtree_parents(m: int) -> tuple[list[int | None], list[int | None]]:
    """Parents of every node in the two complementary trees."""
    tree0 = [btree_parent(r, m) for r in range(m)]
    fwd = [m - 1 - r for r in range(m)] if m % 2 == 0 else [(r - 1) % m for r in range(m)]
    inv = {v: r for r, v in enumerate(fwd)}
    tree1 = []
    for r in range(m):
        p = btree_parent(fwd[r], m)
        tree1.append(None if p is None else inv[p])
    return tree0, tree1


def _gpu_parents(chains: Sequence[Sequence[int]], node_parent: Sequence[int | None]) -> dict[int, int]:
    """GPU -> parent GPU: up the chain inside a node, node head -> parent node's head."""
    parent = {}
    for j, chain in enumerate(chains):
        for a, b in zip(chain[1:], chain[:-1], strict=True):
            parent[a] = b
        if node_parent[j] is not None:
            parent[chain[0]] = chains[node_parent[j]][0]
    return parent


def tree_plan(topo: Topology, ranks: Sequence[int]) -> Plan:
    nodes = by_node(topo, ranks)
    cycles = [intra_cycle(topo, members) for members in nodes]
    k = ranks_per_node(topo, ranks)
    channels = k if k is not None else 1
    trees = dtree_parents(len(nodes))
    per = 1.0 / (2 * channels)
    flows: list[Flow] = []
    fill: tuple[tuple[Hop, float], ...] = ()
    for c in range(channels):
        chains = [cycle[c:] + cycle[:c] for cycle in cycles]
        for t, node_parent in enumerate(trees):
            parent = _gpu_parents(chains, node_parent)
            for child, par in parent.items():
                flows += [Flow(topo.route(child, par), per), Flow(topo.route(par, child), per)]
            if c == 0 and t == 0:
                fill = _fill_latency(topo, parent)
    return Plan("tree", (Phase(tuple(flows), fill, 1),), 1, len(nodes) > 1)


def _fill_latency(topo: Topology, parent: dict[int, int]) -> tuple[tuple[Hop, float], ...]:
    """Hops of the deepest leaf-to-root path (most hops, then most latency), up and back down."""
    best: tuple[int, float, list[tuple[int, int]]] = (0, 0.0, [])
    for start in parent:
        path, g = [], start
        while g in parent:
            path.append((g, parent[g]))
            g = parent[g]
        lat = sum(hop_between(topo, a, b).path_s for a, b in path)
        if (len(path), lat) > best[:2]:
            best = (len(path), lat, path)
    acc: dict[Hop, float] = {}
    for a, b in best[2]:
        for hop in (hop_between(topo, a, b), hop_between(topo, b, a)):
            acc[hop] = acc.get(hop, 0.0) + 1.0
    return tuple(acc.items())
