"""Which concurrent copies of a collective can slow it down: those whose links connect to its own.

Max-min fair sharing (maxmin.py) decomposes over connected components: flows that share no link,
directly or through a chain of other flows, do not change each other's rates. So a concurrent copy is
dropped, before its plan is built, when it provably shares no link with the own group's component:

- Node-local groups: every topology is one node description replicated (presets, and custom nodes
  multiplied with the IB fabric, topologies/fabric.py), so a copy of the group on another node, with the
  same local ranks, uses that node's replica of the group's own links. When the group's own plan stays
  inside its node (an NVLink / NVSwitch / PCIe domain), such a copy can only interact with it through a
  group that also touches that other node; copies on nodes no kept group touches are dropped.
- Groups across the rail-optimized fabric (a topology with a FabricRouter; ring, tree, direct and
  hierarchical plans, whose flows all follow `route(a, b)` between two members): a copy's links are a
  subset of its footprint, the closed-form union of every route between its members (inside a node: the
  node's routes among its local members; across nodes: each member's GPU..NIC and NIC..GPU path, its
  NIC links, and its rail leaf's up- and downlink). Copies whose footprints are disjoint from the own
  plan's links and from the footprints of the copies kept (to a fixed point) are dropped: a DP ring on
  rail 0 is priced without the seven copies on rails 1-7.

Both are exact: the own component's flows, demands and capacities are unchanged, and so are their rates.
Pricing a TP collective on 16,384 GPUs costs what it costs on one node, and a DP collective what one
rail costs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.phases import Plan
from meshsim.topologies.fabric import FabricRouter
from meshsim.topologies.model import Topology

ROUTED_ALGOS = ("ring", "tree", "direct", "hierarchical")  # plans whose flows are member-to-member routes
ENABLED = True  # tests switch the pruning off to check that it changes nothing


def _node_links(topo: Topology) -> list[int | None]:
    """Per link: the node both its endpoints belong to, or None (fabric, or between nodes); memoized. On a
    fabric (fabric.multiply) from its layout: links [n x node_links, (n + 1) x node_links) join devices of
    node n (its copies of the template's, all with node n), the links from ib_base on touch a leaf switch
    (node None); node_links_of_devices is the long way, which tests compare it with."""
    tab = cache.table(topo, "node_links")
    hit = tab.get(0)
    if hit is None:
        router = topo.router
        if isinstance(router, FabricRouter) and router.ib_base == topo.nodes * router.node_links:
            step = router.node_links
            hit = [n for n in range(topo.nodes) for _ in range(step)]
            hit += [None] * (len(topo.links) - router.ib_base)
        else:
            hit = node_links_of_devices(topo)
        cache.remember(tab, 0, hit)
    return hit


def node_links_of_devices(topo: Topology) -> list[int | None]:
    """_node_links from every link's two devices."""
    node_of = {d.name: d.node for d in topo.devices}
    return [node_of[lk.src] if node_of[lk.src] is not None and node_of[lk.src] == node_of[lk.dst] else None
            for lk in topo.links]


def stays_in_node(topo: Topology, plan: Plan, node: int) -> bool:
    """Every link of every flow of `plan` joins two devices of `node`."""
    of = _node_links(topo)
    return all(of[li] == node for phase in plan.phases for flow in phase.flows for li in flow.links)


def plan_links(plan: Plan) -> set[int]:
    return {li for phase in plan.phases for flow in phase.flows for li in flow.links}


def _local_links(topo: Topology, router: FabricRouter, local: tuple[int, ...], multi_node: bool) -> tuple[int, ...]:
    """Template links of one node used by routes among `local` GPUs, plus their NIC paths if `multi_node`."""
    tab = cache.table(topo, "local_links")
    key = (local, multi_node)
    hit = tab.get(key)
    if hit is None:
        links = {k for i in local for j in local if i != j for k in router.node.route(i, j)}
        if multi_node:
            links.update(k for i in local for k in (*router.up[i], *router.down[i]))
        hit = cache.remember(tab, key, tuple(sorted(links)))
    return hit


def footprint(topo: Topology, router: FabricRouter, ranks: tuple[int, ...]) -> frozenset[int]:
    """A superset of the links of every route between two of `ranks` on the fabric (module doc); memoized."""
    tab = cache.table(topo, "footprint")
    hit = tab.get(ranks)
    if hit is None:
        hit = cache.remember(tab, ranks, _footprint(topo, router, ranks))
    return hit


def _footprint(topo: Topology, router: FabricRouter, ranks: tuple[int, ...]) -> frozenset[int]:
    """footprint's links: per set of local ranks, the nodes holding exactly those; each such node's copy of
    the template links among them (n x node_links + k), and across nodes each node's NIC links and its
    rail leaf's up- and downlink, as index arrays (a DP group over 2,048 nodes: one array, not 2,048 loops)."""
    parts = []
    nodes_of = _nodes_by_local_set(ranks, router.node.gpus_per_node)
    multi = sum(len(nodes) for nodes in nodes_of.values()) > 1
    step, rails, per_leaf = router.node_links, router.rails, router.nodes_per_leaf
    for local, at in nodes_of.items():
        template = np.array(_local_links(topo, router, local, multi), dtype=np.int64)
        parts.append((at[:, None] * step + template[None, :]).ravel())
        if multi:
            for rail in {router.rail_of[i] for i in local}:
                nics = router.ib_base + 2 * (at * rails + rail)
                ups = router.uplink_base + 2 * (rail * router.leaves_per_rail + at // per_leaf)
                parts += [nics, nics + 1, ups, ups + 1]
    return frozenset(np.concatenate(parts).tolist()) if parts else frozenset()


def _nodes_by_local_set(ranks: tuple[int, ...], per_node: int) -> dict[tuple[int, ...], np.ndarray]:
    """Sorted local ranks -> the nodes (an array) holding exactly those of the group. One rank per node (a DP
    group): grouped by local rank with arrays; else node by node."""
    node, local = np.divmod(np.array(ranks, dtype=np.int64), per_node)
    if len(set(node.tolist())) == len(ranks):  # (np.unique would import numpy.ma: ~10 ms of start-up)
        return {(lo,): node[local == lo] for lo in sorted(set(local.tolist()))}
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(r // per_node, []).append(r % per_node)
    nodes_of: dict[tuple[int, ...], list[int]] = {}
    for n, locals_ in by_node.items():
        nodes_of.setdefault(tuple(sorted(locals_)), []).append(n)
    return {lo: np.array(nodes, dtype=np.int64) for lo, nodes in nodes_of.items()}


def _fabric_sharing(topo: Topology, own: Plan, concurrent: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The copies connected to the own plan's links through footprints (a fixed point; order kept)."""
    kept_links = plan_links(own)  # a new set, grown below
    prints = [footprint(topo, topo.router, tuple(g)) for g in concurrent]
    kept = [False] * len(concurrent)
    grew = True
    while grew:
        grew = False
        for i, fp in enumerate(prints):
            if not kept[i] and not kept_links.isdisjoint(fp):
                kept[i], grew = True, True
                kept_links |= fp
    return tuple(g for g, k in zip(concurrent, kept, strict=True) if k)


def sharing_groups(topo: Topology, own: Plan, ranks: Sequence[int],
                   concurrent: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The concurrent groups in the own group's link-sharing component (module doc); order kept. Memoized
    per (own plan, concurrent groups): each op prices several (algorithm, protocol) pairs on one plan."""
    concurrent = concurrent if isinstance(concurrent, tuple) else tuple(concurrent)  # cost.Groups kept whole
    if not ENABLED or not concurrent:
        return concurrent
    tab = cache.table(topo, "sharing")
    key = (id(own), tuple(ranks), concurrent)
    hit = tab.get(key)
    if hit is None or hit[0] is not own:  # the plan is kept with the entry, so its id cannot be reused
        hit = cache.remember(tab, key, (own, _sharing_groups(topo, own, ranks, concurrent)))
    return hit[1]


def _sharing_groups(topo: Topology, own: Plan, ranks: Sequence[int],
                    concurrent: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    per_node = topo.gpus_per_node
    nodes = {r // per_node for r in ranks}
    if len(nodes) != 1 or not stays_in_node(topo, own, next(iter(nodes))):
        if isinstance(topo.router, FabricRouter) and own.algo in ROUTED_ALGOS:
            return _fabric_sharing(topo, own, concurrent)
        return concurrent if isinstance(concurrent, tuple) else tuple(concurrent)
    return node_local_sharing(topo, tuple(ranks), concurrent if isinstance(concurrent, tuple) else tuple(concurrent))


def node_local_sharing(topo: Topology, ranks: tuple[int, ...],
                       concurrent: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """The concurrent groups of a group whose plan stays in its node, less the copies on other nodes that no
    kept group touches (module doc). It reads only the ranks, so it is memoized per (group, concurrent
    groups), shared by every algorithm whose plan stays in the node. A group is a replica on node m when
    group == (m x per_node + l for l in local): rank r is on node m at local l iff r = m x per_node + l
    (0 <= l < per_node), the test of node_local_sharing_long_way."""
    tab = cache.table(topo, "node_local_sharing")
    key = (ranks, concurrent)
    hit = tab.get(key)
    if hit is None:
        per_node = topo.gpus_per_node
        node = ranks[0] // per_node
        local = tuple(r % per_node for r in ranks)
        replica: dict[int, int] = {}  # candidate index -> its node
        touched: set[int] = {node}
        for i, group in enumerate(concurrent):
            first = group[0] // per_node
            base = first * per_node
            if first != node and group == tuple(map(base.__add__, local)):
                replica[i] = first
            else:
                touched.update(r // per_node for r in group)
        hit = cache.remember(tab, key, tuple(g for i, g in enumerate(concurrent)
                                             if i not in replica or replica[i] in touched))
    return hit


def node_local_sharing_long_way(topo: Topology, ranks: Sequence[int],
                                concurrent: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """node_local_sharing as first written (the reference tests compare it with): per rank, node and local."""
    per_node = topo.gpus_per_node
    node = ranks[0] // per_node
    local = tuple(r % per_node for r in ranks)
    replica: dict[int, int] = {}
    touched: set[int] = {node}
    for i, group in enumerate(concurrent):
        first = group[0] // per_node
        if first != node and all(r // per_node == first for r in group) and \
                tuple(r % per_node for r in group) == local:
            replica[i] = first
        else:
            touched.update(r // per_node for r in group)
    return tuple(g for i, g in enumerate(concurrent) if i not in replica or replica[i] in touched)
