"""Multiply a one-node topology into N nodes joined by a rail-optimized two-level InfiniBand fat tree.

- Rails: NIC r of every node is on rail r (one NIC per GPU, or per GPU group where the node has fewer NICs:
  a GPU's rail is the NIC nearest to it inside the node).
- Leaves: each rail has ceil(N / nodes_per_leaf) leaf switches; a leaf serves NODES_PER_LEAF = 32 nodes,
  i.e. a 64-port switch (e.g. a 64 x 400G NDR switch) at 1:1, 32 ports down and 32 up.
- Spine: one aggregated non-blocking spine device joins all leaves. Each leaf's uplink capacity is its
  downlink capacity / oversubscription (downlinks = the nodes it serves x the NIC rate). ECMP imbalance
  across physical spine switches is not modelled (ideal hashing).
- Routes (structural, O(hops)): same node -> the node's own route; same rail and leaf -> GPU..NIC, leaf,
  NIC..GPU; otherwise up through the spine. Cross-rail traffic goes through the spine from the sender's
  own NIC (no PXN: NCCL rings and trees pair same-rail NICs, so cross-rail flows are rare).
- Latency of an IB link = the traversal of the device it enters (switch_latency_us for a switch) plus
  IB_WIRE_US of cable.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from meshsim.sim.core.errors import UserError
from meshsim.sim.core.limits import MAX_GPUS, MAX_NICS_PER_NODE, check_at_most
from meshsim.sim.core.units import gbit_to_gbps
from meshsim.topologies.fabric_items import IB_WIRE_US, FabricDevices, FabricLinks
from meshsim.topologies.model import Topology

NODES_PER_LEAF = 32  # 64-port leaf at 1:1: 32 ports down, 32 up


@dataclass(frozen=True)
class FabricRouter:
    """Closed-form routes on a fabric built by `multiply` (link indices follow its layout)."""

    node: Topology  # the one-node template; its own (cached) route gives intra-node paths
    node_links: int  # links per node block; node n's link k has index n * node_links + k
    rail_of: tuple[int, ...]  # local GPU -> rail (NIC index)
    up: tuple[tuple[int, ...], ...]  # local GPU -> template links GPU..NIC
    down: tuple[tuple[int, ...], ...]  # local GPU -> template links NIC..GPU
    rails: int
    nodes_per_leaf: int
    leaves_per_rail: int
    ib_base: int  # link 2*(n*rails + r) is NIC(n, r) -> leaf, +1 leaf -> NIC
    uplink_base: int  # link 2*leaf is leaf -> spine, +1 spine -> leaf

    def __call__(self, src: int, dst: int) -> tuple[int, ...]:
        g = self.node.gpus_per_node
        na, i = divmod(src, g)
        nb, j = divmod(dst, g)
        if na == nb:  # the template's route moved to node na's block of links (map: no generator frame per route)
            return tuple(map((na * self.node_links).__add__, self.node.route(i, j)))
        ra, rb = self.rail_of[i], self.rail_of[j]
        leaf_a = ra * self.leaves_per_rail + na // self.nodes_per_leaf
        leaf_b = rb * self.leaves_per_rail + nb // self.nodes_per_leaf
        nic_up = self.ib_base + 2 * (na * self.rails + ra)
        nic_down = self.ib_base + 2 * (nb * self.rails + rb) + 1
        up, down = map((na * self.node_links).__add__, self.up[i]), map((nb * self.node_links).__add__, self.down[j])
        if leaf_a == leaf_b:
            return (*up, nic_up, nic_down, *down)
        return (*up, nic_up, self.uplink_base + 2 * leaf_a, self.uplink_base + 2 * leaf_b + 1, nic_down, *down)


    def many(self, pairs: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        """[self(a, b) for a, b in pairs], each rank's part of the formula (node, local GPU, leaf, its
        GPU..NIC path with the NIC's uplink, the NIC's downlink with its NIC..GPU path, moved to its node)
        worked out once, not once per pair it is in."""
        g, step, ub = self.node.gpus_per_node, self.node_links, self.uplink_base
        ends = {r: self._end(r, g, step) for r in {r for pair in pairs for r in pair}}
        node_route = self.node.route
        out = []
        append = out.append
        for a, b in pairs:
            ea, eb = ends[a], ends[b]
            if ea[0] == eb[0]:
                append(tuple(map((ea[0] * step).__add__, node_route(ea[1], eb[1]))))
            elif ea[2] == eb[2]:
                append(ea[3] + eb[4])
            else:
                append(ea[3] + (ub + 2 * ea[2], ub + 2 * eb[2] + 1) + eb[4])
        return out

    def _end(self, rank: int, g: int, step: int) -> tuple:
        """(node, local GPU, leaf, GPU..NIC path + the NIC's uplink, the NIC's downlink + NIC..GPU path) of `rank`."""
        n, i = divmod(rank, g)
        rail = self.rail_of[i]
        nic = self.ib_base + 2 * (n * self.rails + rail)
        return (n, i, rail * self.leaves_per_rail + n // self.nodes_per_leaf,
                (*map((n * step).__add__, self.up[i]), nic), (nic + 1, *map((n * step).__add__, self.down[i])))


def _nearest_nic(node: Topology, gpu: str, rail_of_nic: dict[str, int], memo: dict) -> tuple[int, tuple[int, ...]]:
    """(rail, path GPU..NIC) of a GPU's nearest NIC: fewest hops, then latency, then NIC index, then the
    widest path. GPUs never forward to a NIC (transit is NVLink to NVLink only), so the path is one link
    out of the GPU plus the best path from the device it enters; that search is shared (memo, per device)."""
    best: tuple | None = None
    for li in node.out_links[gpu]:
        link = node.links[li]
        if link.dst in rail_of_nic:
            label, path = (1, link.latency_us, rail_of_nic[link.dst], -link.bw_gbps), (li,)
        elif node.device_by_name[link.dst].kind == "gpu":
            continue
        else:
            if link.dst not in memo:
                labels = node.device_search(link.dst)[1]
                memo[link.dst] = min(((*labels[n][:2], r, n) for n, r in rail_of_nic.items() if n in labels),
                                     default=None)
            if memo[link.dst] is None:
                continue
            hops, lat, rail, nic = memo[link.dst]
            neg_bw = max(node.device_search(link.dst)[1][nic][2], -link.bw_gbps)
            label, path = (hops + 1, lat + link.latency_us, rail, neg_bw), (li, *node.device_path(link.dst, nic))
        if best is None or label < best[0]:
            best = (label, path)
    if best is None:
        raise ValueError(f"topology {node.name}: {gpu} reaches no NIC")
    return best[0][2], best[1]


def _rails(node: Topology) -> tuple[list[str], list[int], list[tuple[int, ...]], list[tuple[int, ...]]]:
    """NIC names, and per local GPU: its rail (nearest NIC: fewest hops, then latency, then index),
    its path GPU..NIC and NIC..GPU inside the node (one search per NIC and per device a GPU links to)."""
    nics = [d.name for d in node.devices if d.kind == "nic"]
    rail_of_nic = {n: r for r, n in enumerate(nics)}
    rail_of, up, down, memo = [], [], [], {}
    for gpu in node.gpu_names:
        rail, path = _nearest_nic(node, gpu, rail_of_nic, memo)
        rail_of.append(rail)
        up.append(path)
        if gpu not in node.device_search(nics[rail])[0]:
            raise ValueError(f"topology {node.name}: {nics[rail]} has no route back to {gpu}")
        down.append(node.device_path(nics[rail], gpu))
    return nics, rail_of, up, down


def multiply(node: Topology, nodes: int, *, nic_gbitps: float, switch_latency_us: float = 0.5,
             oversubscription: float = 1.0, nodes_per_leaf: int = NODES_PER_LEAF) -> Topology:
    """`nodes` copies of the one-node topology `node` on a rail-optimized fat tree (see module doc). Its
    devices and links are built from the template's structure when first read (fabric_items.py): a
    16,384-GPU fabric costs its routing tables, not ~165,000 records."""
    nics, rail_of, up, down = _rails(node)
    rails, nic_gbps = len(nics), gbit_to_gbps(nic_gbitps)
    leaves_per_rail = math.ceil(nodes / nodes_per_leaf)
    links = FabricLinks(node, nodes, tuple(nics), nic_gbps, switch_latency_us + IB_WIRE_US, oversubscription,
                        nodes_per_leaf, leaves_per_rail)
    devices = FabricDevices(node, nodes, rails, leaves_per_rail)
    router = FabricRouter(node, len(node.links), tuple(rail_of), tuple(up), tuple(down), rails,
                          nodes_per_leaf, leaves_per_rail, links.ib_base, links.uplink_base)
    return Topology(
        name=f"{node.name}x{nodes}", gpu=node.gpu, nodes=nodes, gpus_per_node=node.gpus_per_node,
        devices=devices, links=links, router=router, nic_gbitps=nic_gbitps,
        description=f"{nodes} x [{node.description}], rail-optimized IB fat tree 1:{oversubscription:g}",
        nvlink_gbps_per_gpu=node.nvlink_gbps_per_gpu, nic_gbps_per_gpu=rails * nic_gbps / node.gpus_per_node,
        nvlink_gpu_transit=node.nvlink_gpu_transit,
    )


def scale_nvlink(topo: Topology, nvlink_gbps: float, *, source: str | None = None) -> Topology:
    """What-if: every NVLink link scaled by nvlink_gbps / the topology's NVLink bandwidth per GPU."""
    if topo.nvlink_gbps_per_gpu <= 0:
        raise UserError("topology.nvlink_gbps", nvlink_gbps, "remove it: this topology has no NVLink",
                        source=source, problem=f"{topo.name} has no NVLink")
    ratio = nvlink_gbps / topo.nvlink_gbps_per_gpu
    links = tuple(dataclasses.replace(lk, bw_gbps=lk.bw_gbps * ratio) if lk.kind == "nvlink" else lk
                  for lk in topo.links)
    return dataclasses.replace(topo, links=links, nvlink_gbps_per_gpu=nvlink_gbps, _route_cache={})


def check_fabric_args(nodes: int, nic_gbitps: float | None, switch_latency_us: float, oversubscription: float,
                      nvlink_gbps: float | None, source: str | None) -> None:
    """UserError for out-of-range fabric arguments (named as in the scenario schema)."""
    checks = (
        ("topology.nodes", nodes, isinstance(nodes, int) and nodes >= 1, "a whole number of nodes >= 1"),
        ("topology.fabric.nic_gbitps", nic_gbitps, nic_gbitps is None or nic_gbitps > 0, "a line rate > 0 Gb/s"),
        ("topology.fabric.switch_latency_us", switch_latency_us, switch_latency_us >= 0, "a latency >= 0 us"),
        ("topology.fabric.oversubscription", oversubscription, oversubscription >= 1,
         "a ratio >= 1 (1 = non-blocking; 2 = leaf uplinks carry half the downlink capacity)"),
        ("topology.nvlink_gbps", nvlink_gbps, nvlink_gbps is None or nvlink_gbps > 0, "a bandwidth > 0 GB/s"),
    )
    for name, value, ok, fix in checks:
        if not ok:
            raise UserError(name, value, f"use {fix}", source=source)


def with_fabric(node: Topology, nodes: int, nic_gbitps: float | None, switch_latency_us: float,
                oversubscription: float, nvlink_gbps: float | None, source: str | None = None) -> Topology:
    """Apply the NVLink what-if, then multiply into `nodes` nodes (nodes == 1: the node itself)."""
    if nvlink_gbps is not None:
        node = scale_nvlink(node, nvlink_gbps, source=source)
    rate = nic_gbitps if nic_gbitps is not None else node.nic_gbitps
    check_at_most("topology.nodes", nodes, MAX_GPUS, f"use at most "
                  f"{MAX_GPUS // node.gpus_per_node:,} nodes of {node.gpus_per_node} GPUs", source=source,
                  what=f"GPUs ({nodes:,} nodes x {node.gpus_per_node})", amount=nodes * node.gpus_per_node)
    if nodes == 1:
        if rate != node.nic_gbitps:
            nics = sum(d.kind == "nic" for d in node.devices)
            node = dataclasses.replace(node, nic_gbitps=rate, _route_cache={},
                                       nic_gbps_per_gpu=nics * gbit_to_gbps(rate) / node.gpus_per_node)
        return node
    if rate <= 0 or not any(d.kind == "nic" for d in node.devices):
        raise UserError("topology.nodes", nodes, "use nodes: 1, or give the node devices of kind 'nic' and a "
                        "NIC line rate (nic_gbitps)", source=source, problem=f"{node.name} has no NIC to join nodes")
    nics = sum(d.kind == "nic" for d in node.devices)
    check_at_most("topology.nodes", nodes, MAX_NICS_PER_NODE, f"give the node at most {MAX_NICS_PER_NODE} "
                  "NICs to join several nodes", source=source, what="NICs per node", amount=nics)
    try:
        return multiply(node, nodes, nic_gbitps=rate, switch_latency_us=switch_latency_us,
                        oversubscription=oversubscription)
    except ValueError as exc:  # a GPU without a path to any NIC, or a NIC without a path back
        raise UserError("topology.nodes", nodes, "link every GPU to a NIC (and the NIC back to it), or use "
                        "nodes: 1", source=source, problem=f"Cannot join nodes: {exc}") from None
