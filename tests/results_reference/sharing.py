"""sharing._footprint as first written, one link at a time (tests/test_price_sharing.py compares the two)."""

from __future__ import annotations

from meshsim.sim.cost.collectives.sharing import _local_links
from meshsim.topologies.fabric import FabricRouter
from meshsim.topologies.model import Topology


def footprint_long_way(topo: Topology, router: FabricRouter, ranks: tuple[int, ...]) -> frozenset[int]:
    """_footprint as first written, one link at a time."""
    per_node = router.node.gpus_per_node
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(r // per_node, []).append(r % per_node)
    multi = len(by_node) > 1
    nodes_of: dict[tuple[int, ...], list[int]] = {}
    for n, local in by_node.items():
        nodes_of.setdefault(tuple(sorted(local)), []).append(n)
    links: set[int] = set()
    step, rails, per_leaf = router.node_links, router.rails, router.nodes_per_leaf
    for local, nodes in nodes_of.items():
        template = _local_links(topo, router, local, multi)
        links.update(n * step + k for n in nodes for k in template)
        if multi:
            for rail in {router.rail_of[i] for i in local}:
                nics = [router.ib_base + 2 * (n * rails + rail) for n in nodes]
                ups = [router.uplink_base + 2 * (rail * router.leaves_per_rail + n // per_leaf) for n in nodes]
                links.update(nics, [li + 1 for li in nics], ups, [li + 1 for li in ups])
    return frozenset(links)
