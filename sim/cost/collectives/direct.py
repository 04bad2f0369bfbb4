"""Direct all-to-all: every rank sends nbytes/n to every other rank at once (NCCL's grouped send/recv).

One phase of n(n-1) flows of S/n each; its step latency is the slowest pair's hop (most latency, network
before PCIe before NVLink), charged once. Ideal closed form on one switch: L + (n-1)/n S/B.
Cost grows with n^2 flows: fine for TP/EP-sized groups, slow for thousands of ranks.

Ring shift (op "send_recv"): every member i sends nbytes to member i + 1 of the group, in group order, and
receives from i - 1, all at once (one batch_isend_irecv: Transformer Engine's context-parallel KV ring,
flash_attn_p2p_communicate, TE dot_product_attention/context_parallel.py L96-135 at d0067d0). One phase of
n flows of the whole S each (n = 2: the two directions of one pair); its step latency is the slowest
neighbour pair's hop. Ideal closed form on one switch: L + S/B; a ring that leaves a node puts S on the
NIC of each crossing member, so the neighbours across nodes set the time.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives.phases import Flow, Phase, Plan, worst_hop
from meshsim.topologies.model import Topology


def direct_plan(topo: Topology, ranks: Sequence[int]) -> Plan:
    group = sorted(set(ranks))
    n = len(group)
    routes = topo.routes([(a, b) for a in group for b in group if a != b])
    frac = 1.0 / n
    flows = tuple(Flow(route, frac) for route in routes)
    worst = worst_hop(topo, routes)  # the slowest pair's hop: network before PCIe before NVLink, then latency
    multi = topo.node_of(group[0]) != topo.node_of(group[-1])
    return Plan("direct", (Phase(flows, ((worst, 1.0),), 1),), 1, multi)


def shift_plan(topo: Topology, ranks: Sequence[int]) -> Plan:
    """The ring shift of op "send_recv" (module docstring): member i -> member i + 1 mod n, S bytes each."""
    group = list(ranks)
    n = len(group)
    pairs = [(group[i], group[(i + 1) % n]) for i in range(n)]
    routes = topo.routes(pairs)
    flows = tuple(Flow(route, 1.0) for route in routes)
    worst = worst_hop(topo, routes)
    multi = len({topo.node_of(r) for r in group}) > 1
    return Plan("direct", (Phase(flows, ((worst, 1.0),), 1),), 1, multi)
