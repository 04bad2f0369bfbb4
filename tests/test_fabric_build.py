"""The multiplied fabric (topologies/fabric.multiply) built from the node template's structure equals the
link-by-link construction it replaced (kept here as the reference, as it stood at 46da508): the same
devices and links in the same order, so every link index, route and cost is unchanged. Generated over every
preset and node counts with full and partial leaves; plus a custom node whose devices are not named "n0.*"
(the other branch of the naming rule)."""

from __future__ import annotations

import math

import pytest

from meshsim.sim.core.units import gbit_to_gbps
from meshsim.topologies import fabric
from meshsim.topologies.model import Device, Link, Topology
from meshsim.topologies.registry import PRESETS


def _node_name(name: str, n: int) -> str:
    return f"n{n}.{name[3:] if name.startswith('n0.') else name}"


def reference(node: Topology, nodes: int, nic_gbitps: float, switch_latency_us: float = 0.5,
              oversubscription: float = 1.0, nodes_per_leaf: int = fabric.NODES_PER_LEAF):
    """(devices, links) as multiply built them, one name at a time."""
    nics = [d.name for d in node.devices if d.kind == "nic"]
    rails, nic_gbps = len(nics), gbit_to_gbps(nic_gbitps)
    leaves_per_rail = math.ceil(nodes / nodes_per_leaf)
    devices: list[Device] = []
    links: list[Link] = []
    for n in range(nodes):
        devices += [Device(_node_name(d.name, n), d.kind, n, d.in_network_reduction) for d in node.devices]
        links += [Link(_node_name(lk.src, n), _node_name(lk.dst, n), lk.bw_gbps, lk.latency_us, lk.kind)
                  for lk in node.links]
    to_switch_us = switch_latency_us + fabric.IB_WIRE_US
    for n in range(nodes):
        for r, nic in enumerate(nics):
            leaf = f"leaf.r{r}.{n // nodes_per_leaf}"
            nic_name = _node_name(nic, n)
            links += [Link(nic_name, leaf, nic_gbps, to_switch_us, "ib"), Link(leaf, nic_name, nic_gbps, fabric.IB_WIRE_US, "ib")]
    for r in range(rails):
        for k in range(leaves_per_rail):
            leaf = f"leaf.r{r}.{k}"
            served = min(nodes_per_leaf, nodes - k * nodes_per_leaf)
            devices.append(Device(leaf, "ib_switch"))
            bw = served * nic_gbps / oversubscription
            links += [Link(leaf, "spine", bw, to_switch_us, "ib"), Link("spine", leaf, bw, to_switch_us, "ib")]
    devices.append(Device("spine", "ib_switch"))
    return tuple(devices), tuple(links)


def template(name: str) -> Topology:
    info = PRESETS[name]
    return info.builder(8) if info.rack else info.builder()


@pytest.mark.parametrize("preset", [p for p in PRESETS if PRESETS[p].rack or template(p).nic_gbitps > 0])
@pytest.mark.parametrize("nodes", [2, 3, 33, 70])
def test_the_structural_build_equals_the_link_by_link_one(preset, nodes):
    node = template(preset)
    if not any(d.kind == "nic" for d in node.devices) or node.nic_gbitps <= 0:
        pytest.skip(f"{preset} has no NIC to join nodes")
    built = fabric.multiply(node, nodes, nic_gbitps=node.nic_gbitps, switch_latency_us=0.7, oversubscription=2.0)
    devices, links = reference(node, nodes, node.nic_gbitps, 0.7, 2.0)
    assert built.devices == devices
    assert built.links == links
    last = nodes * node.gpus_per_node - 1
    for a, b in ((0, 1), (0, last), (node.gpus_per_node + 1, last - 2)):
        path = built.route(a, b)
        assert path and links[path[0]].src == built.gpu_names[a] and links[path[-1]].dst == built.gpu_names[b]


def test_devices_not_named_n0_get_the_node_prefix():
    """The naming rule's other branch: a template device named without "n0." becomes "n<k>.<name>"."""
    node = Topology(name="odd", gpu="h100-sxm", nodes=1, gpus_per_node=1,
                    devices=(Device("g", "gpu", 0), Device("nic", "nic", 0)),
                    links=(Link("g", "nic", 50.0, 1.0, "pcie"), Link("nic", "g", 50.0, 1.0, "pcie")),
                    nic_gbitps=400.0)
    built = fabric.multiply(node, 3, nic_gbitps=400.0)
    assert (built.devices, built.links) == reference(node, 3, 400.0)
    assert [d.name for d in built.devices[:4]] == ["n0.g", "n0.nic", "n1.g", "n1.nic"]
