"""Which concurrent copies of a collective can slow it down: those whose links connect to its own.

Max-min fair sharing (maxmin.py) decomposes over connected components: flows that share no link,
directly or through a chain of other flows, do not change each other's rates. Every topology is one
node description replicated (presets, and custom nodes multiplied with the IB fabric, topologies/fabric.py),
so a copy of the group on another node, with the same local ranks, uses that node's replica of the
group's own links. When the group's own plan stays inside its node (an NVLink / NVSwitch / PCIe domain),
such a copy can only interact with it through a group that also touches that other node; copies on nodes
no kept group touches are dropped without building their plans. The result is exact, and pricing a TP
collective on 16,384 GPUs costs what it costs on one node.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.phases import Plan
from meshsim.topologies.model import Topology


def _node_links(topo: Topology) -> list[int | None]:
    """Per link: the node both its endpoints belong to, or None (fabric, or between nodes)."""
    tab = cache.table(topo, "node_links")
    hit = tab.get(0)
    if hit is None:
        node_of = {d.name: d.node for d in topo.devices}
        hit = cache.remember(tab, 0, [node_of[lk.src] if node_of[lk.src] is not None and node_of[lk.src] == node_of[lk.dst]
                                      else None for lk in topo.links])
    return hit


def stays_in_node(topo: Topology, plan: Plan, node: int) -> bool:
    """Every link of every flow of `plan` joins two devices of `node`."""
    of = _node_links(topo)
    return all(of[li] == node for phase in plan.phases for flow in phase.flows for li in flow.links)


def sharing_groups(topo: Topology, own: Plan, ranks: Sequence[int],
                   concurrent: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The concurrent groups in the own group's link-sharing component (module doc); order kept."""
    per_node = topo.gpus_per_node
    nodes = {r // per_node for r in ranks}
    if len(nodes) != 1 or not concurrent:
        return tuple(concurrent)
    node = nodes.pop()
    if not stays_in_node(topo, own, node):
        return tuple(concurrent)
    local = tuple(r % per_node for r in ranks)
    replica: dict[int, int] = {}  # candidate index -> its node
    touched: set[int] = {node}
    for i, group in enumerate(concurrent):
        first = group[0] // per_node
        if first != node and all(r // per_node == first for r in group) and \
                tuple(r % per_node for r in group) == local:
            replica[i] = first
        else:
            touched.update(r // per_node for r in group)
    return tuple(g for i, g in enumerate(concurrent) if i not in replica or replica[i] in touched)
