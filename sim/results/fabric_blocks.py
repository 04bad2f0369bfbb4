"""Blocks of a rail-optimized fabric that repeat each other exactly, so a collective in one is priced as its
copy in the first (sim/results/costers.py).

A fabric built by topologies/fabric.multiply is N copies of one node, NIC r of node n on leaf
r * L + n // P of rail r (P = nodes_per_leaf, L leaves per rail), each leaf's uplink of capacity
served_nodes x NIC rate / oversubscription, one spine. Translating every rank by d = k x B, where B is a
multiple of both P x gpus_per_node (a leaf's worth of ranks) and the pipeline stage size, maps the node
template to itself, NIC (n, r) to (n + d', r) and leaf (r, j) to (r, j + d' / P) (d' = d / gpus_per_node
nodes), so every route maps to a route of the same links' bandwidths, latencies and kinds, link for link,
in the same order: the link index map below is increasing (node links, then NIC links, then uplinks, each
shifted by a constant). Two conditions make it an automorphism of what the cost sees:
- both blocks lie under full leaves only (the last leaf of a fabric whose node count is not a multiple of
  P serves fewer nodes, so its uplink is narrower);
- the concurrent groups are the translated ones (checked by the coster: it compares them).
The pure cost function reads ranks only through routes, node and local indices and orderings, so the
priced copy gives the same floats; tests/test_fabric_blocks.py checks memo == direct over generated meshes,
with a partial last leaf as the negative control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.topologies.fabric import FabricRouter


@dataclass(frozen=True)
class FabricBlocks:
    """Rank blocks [k B, (k + 1) B) under full leaves, and how link indices move between them."""

    block: int  # ranks per block (B)
    full: int  # ranks under full leaves: [0, full) (a multiple of B's leaf part)
    gpus_per_node: int
    router: FabricRouter

    @classmethod
    def of(cls, rs: ResolvedScenario) -> FabricBlocks | None:
        """The scenario's blocks, or None when its topology is not a multiplied fabric or has one block."""
        topo = rs.topology
        router = topo.router
        if not isinstance(router, FabricRouter):
            return None
        leaf_ranks = router.nodes_per_leaf * topo.gpus_per_node
        block = math.lcm(rs.stage_size, leaf_ranks)
        full = (topo.nodes // router.nodes_per_leaf) * leaf_ranks
        return cls(block, full, topo.gpus_per_node, router) if 2 * block <= full else None

    def shift(self, ranks: tuple[int, ...]) -> int:
        """k B when every rank lies in one block k >= 1 under full leaves, else 0 (not translated)."""
        lo = ranks[0] - ranks[0] % self.block
        if lo == 0 or lo + self.block > self.full:
            return 0
        hi = lo + self.block
        return lo if all(lo <= r < hi for r in ranks) else 0

    def link(self, index: int, shift: int) -> int:
        """The index of link `index` of the first block moved `shift` ranks on (fabric.multiply's layout)."""
        router = self.router
        nodes = shift // self.gpus_per_node
        if index < router.ib_base:
            return index + nodes * router.node_links
        if index < router.uplink_base:
            return index + 2 * router.rails * nodes
        return index + 2 * (nodes // router.nodes_per_leaf)
