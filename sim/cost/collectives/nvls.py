"""NVLS (NVLink SHARP): reduction and multicast inside the NVSwitch.

Applicable when every rank of the group is directly linked to the same switch(es) with
`in_network_reduction` (an NVSwitch gen3+ NVLink domain); the data is split evenly across those switches.
Per GPU, streamed concurrently through the switch (one pipelined phase):
- all-reduce: each GPU sends its whole buffer S into the switch once (the switch reduces) and receives
  the reduced S once. Ideal time L + S/B, so busbw = 2(n-1)/n x B: up to twice a ring's.
- all-gather: each GPU multicasts its S/n shard once and receives the other (n-1)/n S: L + (n-1)/n S/B.
- reduce-scatter: each GPU sends the (n-1)/n S destined to others, receives its reduced S/n: same time.
L = GPU->switch + switch->GPU latency (one NVLS step); NCCL's 25 us NVLS latency covers that step.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.phases import Flow, Hop, Phase, Plan, path_hop
from meshsim.topologies.fabric import FabricRouter
from meshsim.topologies.model import Topology

NVLS_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def nvls_switches(topo: Topology, ranks: Sequence[int]) -> list[str]:
    """Names of the in-network-reduction switches every rank of the group links to directly."""
    common: set[str] | None = None
    for r in ranks:
        mine = switch_ports(topo, r).keys()
        common = set(mine) if common is None else common & mine
        if not common:
            return []
    return sorted(common or ())


def switch_ports(topo: Topology, rank: int) -> dict[str, tuple[int, int | None]]:
    """Switch name -> (the first link from GPU `rank` to it, its first link back or None) of each in-network-reduction
    NVSwitch the GPU links to directly, in the order of the GPU's out-links. On a fabric (fabric.multiply)
    from the one-node template's ports: node n's link k is n x node_links + k, its devices the node's copies
    (ports_of_devices is the long way, over the whole topology's out-links; tests compare the two)."""
    router = topo.router
    if not isinstance(router, FabricRouter):
        return ports_of_devices(topo, rank)
    n, local = divmod(rank, router.node.gpus_per_node)
    tab = cache.table(router.node, "nvls_ports")
    ports = tab.get(local)
    if ports is None:
        ports = cache.remember(tab, local, tuple(ports_of_devices(router.node, local).values()))
    off = n * router.node_links
    return {topo.links[off + up].dst: (off + up, None if down is None else off + down) for up, down in ports}


def ports_of_devices(topo: Topology, rank: int) -> dict[str, tuple[int, int | None]]:
    """switch_ports from the topology's own out-links and devices."""
    gpu = topo.gpu_names[rank]
    out: dict[str, tuple[int, int | None]] = {}
    for li in topo.out_links[gpu]:
        sw = topo.links[li].dst
        dev = topo.device_by_name[sw]
        if dev.in_network_reduction and dev.kind == "nvswitch" and sw not in out:
            out[sw] = (li, next((lj for lj in topo.out_links[sw] if topo.links[lj].dst == gpu), None))
    return out


def port_fractions(op: str, n: int) -> tuple[float, float]:
    """(into the switch, out of it) per GPU, as fractions of nbytes (module doc)."""
    return {"all_reduce": (1.0, 1.0), "all_gather": (1.0 / n, (n - 1) / n),
            "reduce_scatter": ((n - 1) / n, 1.0 / n)}[op]


def topology_has_nvls(topo: Topology) -> bool:
    return any(d.in_network_reduction and d.kind == "nvswitch" for d in topo.devices)


def _link(topo: Topology, src: str, dst: str) -> int:
    return next(li for li in topo.out_links[src] if topo.links[li].dst == dst)


def nvls_plan(topo: Topology, op: str, ranks: Sequence[int]) -> Plan:
    switches = nvls_switches(topo, ranks)
    if not switches or op not in NVLS_OPS:
        raise ValueError(f"nvls does not apply to {op} on ranks {list(ranks)[:4]}...")
    n, ns = len(ranks), len(switches)
    up_frac, down_frac = port_fractions(op, n)
    flows: list[Flow] = []
    step: Hop | None = None
    for r in ranks:
        ports = switch_ports(topo, r)
        for sw in switches:
            up, down = ports[sw]
            if down is None:  # no link back from the switch: the error the search for it raises
                down = _link(topo, sw, topo.gpu_names[r])
            flows += [Flow((up,), up_frac / ns), Flow((down,), down_frac / ns)]
            hop = path_hop(topo, (up, down))
            step = hop if step is None or hop.path_s > step.path_s else step
    assert step is not None
    return Plan("nvls", (Phase(tuple(flows), ((step, 1.0),), 1),), 1, False)
