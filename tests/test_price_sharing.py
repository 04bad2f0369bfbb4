"""sharing._footprint (index arrays per set of local ranks) equals footprint_long_way (one link at a time)
on generated groups over fabrics of every multi-node preset: node-local groups, groups across nodes with
equal and with different local ranks per node, one rank, several rails, partial last leaves."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from results_reference.sharing import footprint_long_way

from meshsim.sim.cost.collectives.sharing import _footprint
from meshsim.topologies import fabric
from meshsim.topologies.registry import PRESETS

JOINABLE = sorted(p for p in PRESETS if not PRESETS[p].rack and PRESETS[p].builder().nic_gbitps > 0)


@st.composite
def fabric_groups(draw):
    preset = draw(st.sampled_from(JOINABLE))
    node = PRESETS[preset].builder()
    nodes = draw(st.integers(2, 11))
    topo = fabric.multiply(node, nodes, nic_gbitps=node.nic_gbitps, nodes_per_leaf=draw(st.sampled_from((2, 4, 32))))
    per = node.gpus_per_node
    if draw(st.booleans()):  # a DP-like group: the same local ranks on several nodes
        local = draw(st.lists(st.integers(0, per - 1), min_size=1, max_size=per, unique=True))
        at = draw(st.lists(st.integers(0, nodes - 1), min_size=1, max_size=nodes, unique=True))
        ranks = [n * per + lo for n in at for lo in local]
    else:
        ranks = draw(st.lists(st.integers(0, topo.num_gpus - 1), min_size=1, max_size=24, unique=True))
    return topo, tuple(ranks)


@settings(max_examples=200, deadline=None)
@given(fabric_groups())
def test_footprint_from_arrays_equals_the_long_way(case):
    topo, ranks = case
    got = _footprint(topo, topo.router, ranks)
    assert got == footprint_long_way(topo, topo.router, ranks)
    assert all(type(li) is int for li in got)
