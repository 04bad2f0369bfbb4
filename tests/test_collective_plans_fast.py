"""The plan builders' shortcuts against the long way they replace, on generated groups over every kind of
topology (NVSwitch nodes on the IB fabric, the switchless DGX-1 mesh, PCIe, NVL72 racks, several rails):

- worst_hop(routes) is max(path_hop(r) for r in routes) by (class order, path_s), the first of equal ones;
- direct_plan / shift_plan equal the builders written the long way (every pair's hop via hop_between),
  Plan for Plan (dataclass equality: the same routes, fractions, hops and floats).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.cost.collectives.direct import direct_plan, shift_plan
from meshsim.sim.cost.collectives.phases import Flow, Phase, Plan, hop_between, path_hop, worst_hop
from meshsim.topologies.registry import build_topology

CLASS_ORDER = {"nvlink": 0, "pcie": 1, "network": 2}
TOPOLOGIES = {  # (preset, nodes, gpus_per_node)
    "h100x4": ("dgx-h100", 4, None),
    "a100x2": ("dgx-a100", 2, None),
    "dgx1x2": ("dgx1-v100", 2, None),
    "pcie": ("pcie-8gpu", 1, None),
    "pciex2": ("pcie-8gpu", 2, None),
    "nvl72x2": ("gb200-nvl72", 2, 16),
    "gb300": ("gb300-nvl72", 1, None),
}


def topo_of(name):
    preset, nodes, per = TOPOLOGIES[name]
    return build_topology(preset, nodes, gpus_per_node=per)


@st.composite
def groups(draw, min_size=2):
    name = draw(st.sampled_from(sorted(TOPOLOGIES)))
    topo = topo_of(name)
    ranks = draw(st.lists(st.integers(0, topo.num_gpus - 1), min_size=min_size, max_size=12, unique=True))
    return topo, ranks


def reference_direct_plan(topo, ranks):
    """direct_plan as it was written before worst_hop: every pair's hop through hop_between."""
    group = sorted(set(ranks))
    n = len(group)
    flows = tuple(Flow(topo.route(a, b), 1.0 / n) for a in group for b in group if a != b)
    pairs = [(a, b) for a in group for b in group if a != b]
    worst = max((hop_between(topo, a, b) for a, b in pairs), key=lambda h: (CLASS_ORDER[h.link_class], h.path_s))
    multi = topo.node_of(group[0]) != topo.node_of(group[-1])
    return Plan("direct", (Phase(flows, ((worst, 1.0),), 1),), 1, multi)


def reference_shift_plan(topo, ranks):
    group = list(ranks)
    n = len(group)
    pairs = [(group[i], group[(i + 1) % n]) for i in range(n)]
    flows = tuple(Flow(topo.route(a, b), 1.0) for a, b in pairs)
    worst = max((hop_between(topo, a, b) for a, b in pairs), key=lambda h: (CLASS_ORDER[h.link_class], h.path_s))
    multi = len({topo.node_of(r) for r in group}) > 1
    return Plan("direct", (Phase(flows, ((worst, 1.0),), 1),), 1, multi)


@settings(max_examples=150, deadline=None)
@given(groups())
def test_worst_hop_is_the_first_maximal_path_hop(case):
    topo, ranks = case
    routes = [topo.route(a, b) for a in ranks for b in ranks if a != b]
    expected = max((path_hop(topo, r) for r in routes), key=lambda h: (CLASS_ORDER[h.link_class], h.path_s))
    got = worst_hop(topo, routes)
    assert got == expected and got.path_s.hex() == expected.path_s.hex()


@settings(max_examples=150, deadline=None)
@given(groups())
def test_direct_and_shift_plans_equal_the_long_way(case):
    topo, ranks = case
    assert direct_plan(topo, ranks) == reference_direct_plan(topo, ranks)
    assert shift_plan(topo, ranks) == reference_shift_plan(topo, ranks)


def test_worst_hop_prefers_the_network_class_over_a_longer_nvlink_path():
    """Negative control on the key: class first, latency second (a cross-node pair wins over any
    intra-node pair whatever their latencies)."""
    topo = topo_of("h100x4")
    hop = worst_hop(topo, [topo.route(0, 1), topo.route(0, 8), topo.route(1, 2)])
    assert hop.link_class == "network" and hop == hop_between(topo, 0, 8)
    with pytest.raises(ValueError):
        worst_hop(topo, [])


FABRICS = [("dgx-h100", 3, None), ("dgx-a100", 2, None), ("dgx1-v100", 2, None), ("pcie-8gpu", 2, None),
           ("gb200-nvl72", 2, 16), ("gb300-nvl72", 2, None), ("dgx-b200", 33, None), ("dgx-h100", 1, None)]


@pytest.mark.parametrize("preset,nodes,per", FABRICS)
def test_fabric_layout_shortcuts_equal_the_long_way(preset, nodes, per):
    """sharing._node_links and nvls.switch_ports read a fabric's layout (node n's link k is
    n x node_links + k); on every preset, single node and multiplied (33 nodes: two leaves per rail), they
    equal the answers read from the topology's own devices and out-links."""
    from meshsim.sim.cost.collectives import cache, nvls, sharing

    topo = build_topology(preset, nodes, gpus_per_node=per)
    cache.clear()
    assert sharing._node_links(topo) == sharing.node_links_of_devices(topo)
    for r in range(topo.num_gpus):
        assert nvls.switch_ports(topo, r) == nvls.ports_of_devices(topo, r)


@settings(max_examples=60, deadline=None)
@given(groups())
def test_nvls_plan_and_switches_equal_the_long_way(case):
    """nvls_switches / nvls_plan through switch_ports equal them through the topology's out-links."""
    from meshsim.sim.cost.collectives import nvls

    topo, ranks = case
    long_way = [sorted(set.intersection(*(set(nvls.ports_of_devices(topo, r)) for r in ranks)))]
    assert [nvls.nvls_switches(topo, ranks)] == long_way
    if long_way[0]:
        plan = nvls.nvls_plan(topo, "all_reduce", ranks)
        ups = [f.links[0] for f in plan.phases[0].flows[::2]]
        assert ups == [nvls._link(topo, topo.gpu_names[r], sw) for r in ranks for sw in long_way[0]]
        downs = [f.links[0] for f in plan.phases[0].flows[1::2]]
        assert downs == [nvls._link(topo, sw, topo.gpu_names[r]) for r in ranks for sw in long_way[0]]


@st.composite
def node_local_cases(draw):
    per_node = draw(st.sampled_from((2, 4, 8)))
    nodes = draw(st.integers(2, 6))
    local = draw(st.lists(st.integers(0, per_node - 1), min_size=1, max_size=per_node, unique=True))
    home = draw(st.integers(0, nodes - 1))
    ranks = tuple(home * per_node + lo for lo in local)
    copies = [tuple(m * per_node + lo for lo in local) for m in range(nodes) if m != home]  # true replicas
    others = draw(st.lists(st.lists(st.integers(0, nodes * per_node - 1), min_size=1, max_size=per_node,
                                    unique=True).map(tuple), max_size=5))  # anything: shuffled, spanning nodes
    near = [tuple(reversed(c)) for c in copies[:1]] + [(*c[:-1], c[-1] + per_node) for c in copies[1:2]]
    concurrent = draw(st.permutations(copies + near + others))
    return per_node, nodes, ranks, tuple(concurrent)


@settings(max_examples=200, deadline=None)
@given(node_local_cases())
def test_node_local_sharing_equals_the_long_way(case):
    """The replica test by tuple equality (group == its node's base + the local ranks) drops exactly the
    copies the per-rank test drops, on replicas, near-replicas (same locals reordered, one rank on another
    node) and groups spanning nodes."""
    from meshsim.sim.cost.collectives import cache, sharing

    per_node, nodes, ranks, concurrent = case
    stand_in = type("Stand", (), {"gpus_per_node": per_node})()  # all either function reads of a topology
    got = sharing.node_local_sharing(stand_in, ranks, concurrent)
    assert got == sharing.node_local_sharing_long_way(stand_in, ranks, concurrent)
    assert got is sharing.node_local_sharing(stand_in, ranks, concurrent)  # memoized
    cache.clear()


def test_groups_hash_once_and_key_memos_as_the_plain_tuple():
    """cost.Groups (collective_costs' normalised concurrent groups) is the plain tuple for every memo: equal,
    the same hash, interchangeable as a dict key; a structure priced through it is the one priced through
    the plain tuple (the memo entry is shared)."""
    from meshsim.sim.cost.collectives import cache
    from meshsim.sim.cost.collectives.cost import Groups, structure

    plain = tuple(tuple(range(i * 8, i * 8 + 8)) for i in range(1, 4))
    groups = Groups(plain)
    assert groups == plain and hash(groups) == hash(plain) and {plain: 1}[groups] == 1
    topo = build_topology("dgx-h100", 4)
    cache.clear()
    a = structure(topo, "ring", "all_reduce", range(8), groups)
    assert structure(topo, "ring", "all_reduce", range(8), plain) is a
    cache.clear()
    assert structure(topo, "ring", "all_reduce", range(8), plain) == a
