"""The bulk route shortcuts against the long way they replace (issue 40, DeepSeek-V3's EP all-to-all prices
4,032 routes per 64-rank group):

- Topology.routes(pairs) is [route(a, b) for a, b in pairs], element for element, on fresh topologies (every
  route a miss, filled by FabricRouter.many on a fabric) and warm ones (hits), with repeated pairs, a == b
  pairs and a pair out of range (the same error as route's);
- FabricRouter.many is FabricRouter.__call__ per pair, and __call__ is the closed form written the long way
  (generator tuples, as first written), on fabrics with several leaves per rail (pairs under one leaf and
  across the spine), several GPUs per rail (DGX-1) and one NIC per GPU;
- worst_hop, which skips the latency sum of a route whose class cannot win, is the first maximal path_hop
  on route lists built so that a lower-class route comes after a higher one (the skip's edge) and equal
  keys tie (the first wins).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.cost.collectives.phases import path_hop, worst_hop
from meshsim.topologies.fabric import FabricRouter
from meshsim.topologies.registry import build_topology

CLASS_ORDER = {"nvlink": 0, "pcie": 1, "network": 2}
FABRICS = {  # (preset, nodes, gpus_per_node): 40 nodes = two leaves per rail (32 nodes per leaf)
    "h100x40": ("dgx-h100", 40, None),
    "a100x3": ("dgx-a100", 3, None),
    "dgx1x33": ("dgx1-v100", 33, None),
    "pciex2": ("pcie-8gpu", 2, None),
    "nvl72x2": ("gb200-nvl72", 2, 16),
    "h100x1": ("dgx-h100", 1, None),
}
_BUILT: dict = {}


def fresh(name):
    """The fabric with an empty route cache (a copy: the registry's memoized one is left warm)."""
    if name not in _BUILT:
        preset, nodes, per = FABRICS[name]
        _BUILT[name] = build_topology(preset, nodes, gpus_per_node=per)
    return dataclasses.replace(_BUILT[name], _route_cache={})


def long_way(r: FabricRouter, src: int, dst: int) -> tuple[int, ...]:
    """FabricRouter.__call__ as first written (generator tuples and a `mid` tuple)."""
    g = r.node.gpus_per_node
    na, i = divmod(src, g)
    nb, j = divmod(dst, g)
    if na == nb:
        off = na * r.node_links
        return tuple(off + k for k in r.node.route(i, j))
    ra, rb = r.rail_of[i], r.rail_of[j]
    leaf_a = ra * r.leaves_per_rail + na // r.nodes_per_leaf
    leaf_b = rb * r.leaves_per_rail + nb // r.nodes_per_leaf
    nic_up = r.ib_base + 2 * (na * r.rails + ra)
    nic_down = r.ib_base + 2 * (nb * r.rails + rb) + 1
    if leaf_a == leaf_b:
        mid: tuple[int, ...] = (nic_up, nic_down)
    else:
        mid = (nic_up, r.uplink_base + 2 * leaf_a, r.uplink_base + 2 * leaf_b + 1, nic_down)
    off_a, off_b = na * r.node_links, nb * r.node_links
    return tuple(off_a + k for k in r.up[i]) + mid + tuple(off_b + k for k in r.down[j])


@st.composite
def pair_lists(draw):
    name = draw(st.sampled_from(sorted(FABRICS)))
    n = fresh(name).num_gpus
    rank = st.integers(0, n - 1)
    pairs = draw(st.lists(st.tuples(rank, rank), min_size=0, max_size=60))
    if pairs and draw(st.booleans()):  # repeated pairs
        pairs += draw(st.lists(st.sampled_from(pairs), max_size=10))
    return name, pairs


@settings(max_examples=200, deadline=None)
@given(pair_lists(), st.booleans())
def test_routes_equal_route_per_pair(case, warm):
    name, pairs = case
    topo, ref = fresh(name), fresh(name)
    if warm:  # some pairs already cached
        for a, b in pairs[::2]:
            topo.route(a, b)
    got = topo.routes(pairs)
    assert got == [ref.route(a, b) for a, b in pairs]
    assert all(type(p) is tuple for p in got)
    assert topo.routes(pairs) == got  # and again, every pair now a hit
    for (a, b), path in zip(pairs, got, strict=True):
        assert topo.route(a, b) == path  # what routes() cached is what route() gives


@settings(max_examples=200, deadline=None)
@given(pair_lists())
def test_fabric_many_and_call_equal_the_long_way(case):
    name, pairs = case
    r = fresh(name).router
    if not isinstance(r, FabricRouter):  # one node: no fabric, routes() goes the search's way
        assert name == "h100x1"
        return
    assert r.many(pairs) == [long_way(r, a, b) for a, b in pairs] == [r(a, b) for a, b in pairs]


def test_fabric_pairs_cover_both_leaf_cases():
    """Negative control on the generated cases' reach: the 40-node fabric has pairs under one leaf and pairs
    across the spine (4-link and 2-link middles), and they differ."""
    topo = fresh("h100x40")
    r = topo.router
    same_leaf, across = r.many([(0, 8), (0, 8 * 33)])
    assert len(across) == len(same_leaf) + 2 and across[:len(r.up[0])] == same_leaf[:len(r.up[0])]


def test_routes_out_of_range_raises_as_route_does():
    topo = fresh("a100x3")
    with pytest.raises(ValueError, match="outside"):
        topo.routes([(0, 1), (0, topo.num_gpus)])


@st.composite
def route_lists(draw):
    name = draw(st.sampled_from(sorted(FABRICS)))
    topo = fresh(name)
    rank = st.integers(0, topo.num_gpus - 1)
    pairs = draw(st.lists(st.tuples(rank, rank), min_size=1, max_size=40))
    routes = topo.routes(pairs)
    order = draw(st.sampled_from(["as drawn", "highest class first", "lowest class first"]))
    if order != "as drawn":  # a lower class after a higher one: the skipped sums
        key = lambda r: CLASS_ORDER[path_hop(topo, r).link_class]  # noqa: E731
        routes.sort(key=key, reverse=order == "highest class first")
    return topo, routes + draw(st.lists(st.sampled_from(routes), max_size=5))  # equal keys: the first wins


@settings(max_examples=300, deadline=None)
@given(route_lists())
def test_worst_hop_is_the_first_maximal_path_hop(case):
    topo, routes = case
    expected = max((path_hop(topo, r) for r in routes), key=lambda h: (CLASS_ORDER[h.link_class], h.path_s))
    got = worst_hop(topo, routes)
    assert got == expected and got.path_s.hex() == expected.path_s.hex()
