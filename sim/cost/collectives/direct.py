"""Direct all-to-all: every rank sends nbytes/n to every other rank at once (NCCL's grouped send/recv).

One phase of n(n-1) flows of S/n each; its step latency is the slowest pair's hop (most latency, network
before PCIe before NVLink), charged once. Ideal closed form on one switch: L + (n-1)/n S/B.
Cost grows with n^2 flows: fine for TP/EP-sized groups, slow for thousands of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives.phases import Flow, Phase, Plan, hop_between
from meshsim.topologies.model import Topology

_CLASS_ORDER = {"nvlink": 0, "pcie": 1, "network": 2}


def direct_plan(topo: Topology, ranks: Sequence[int]) -> Plan:
    group = sorted(set(ranks))
    n = len(group)
    flows = tuple(Flow(topo.route(a, b), 1.0 / n) for a in group for b in group if a != b)
    pairs = [(a, b) for a in group for b in group if a != b]
    worst = max((hop_between(topo, a, b) for a, b in pairs),
                key=lambda h: (_CLASS_ORDER[h.link_class], h.path_s))
    multi = topo.node_of(group[0]) != topo.node_of(group[-1])
    return Plan("direct", (Phase(flows, ((worst, 1.0),), 1),), 1, multi)
