"""A fabric's devices and links built from its structure on first read (topologies/fabric_items.py) equal the
tuples the link-by-link construction builds (tests/test_fabric_build.reference), item for item in any read
order, by iteration after scattered reads, as columns, as GPU names, through pickling; and the capacity
vector pricing reads from the columns equals the one read link by link."""

from __future__ import annotations

import pickle
import random

import pytest
from test_fabric_build import reference, template

from meshsim.sim.core.units import GB
from meshsim.sim.cost.collectives import cost
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS
from meshsim.topologies import fabric
from meshsim.topologies.fabric_items import FabricDevices, FabricLinks, link_column, link_values
from meshsim.topologies.registry import PRESETS

JOINABLE = [p for p in PRESETS if PRESETS[p].rack or template(p).nic_gbitps > 0]
FIELDS = ("src", "dst", "bw_gbps", "latency_us", "kind")


def _built(preset: str, nodes: int, oversubscription: float = 2.0):
    node = template(preset)
    if not any(d.kind == "nic" for d in node.devices) or node.nic_gbitps <= 0:
        pytest.skip(f"{preset} has no NIC to join nodes")
    topo = fabric.multiply(node, nodes, nic_gbitps=node.nic_gbitps, switch_latency_us=0.7,
                           oversubscription=oversubscription, nodes_per_leaf=4)
    return topo, reference(node, nodes, node.nic_gbitps, 0.7, oversubscription, nodes_per_leaf=4)


@pytest.mark.parametrize("preset", JOINABLE)
@pytest.mark.parametrize("nodes", [2, 5, 9])  # 4 nodes per leaf: full leaves and a partial last one
def test_items_read_in_any_order_equal_the_link_by_link_build(preset, nodes):
    topo, (devices, links) = _built(preset, nodes)
    assert isinstance(topo.links, FabricLinks) and isinstance(topo.devices, FabricDevices)
    rng = random.Random(nodes)
    for seq, ref in ((topo.links, links), (topo.devices, devices)):
        assert len(seq) == len(ref)
        order = list(range(len(ref)))
        rng.shuffle(order)
        for i in order[: len(order) // 3]:  # scattered reads first, some from the end
            assert seq[i] == ref[i] and type(seq[i]) is type(ref[i])
            assert seq[i - len(ref)] == ref[i - len(ref)]
        assert tuple(seq) == ref  # iteration keeps what was read and builds the rest
        assert seq[3:len(ref) - 2:3] == ref[3:len(ref) - 2:3]
        with pytest.raises(IndexError):
            seq[len(ref)]


@pytest.mark.parametrize("preset", JOINABLE)
def test_columns_names_and_pickles_equal_the_long_way(preset):
    topo, (devices, links) = _built(preset, 7)
    for field in FIELDS:
        assert link_column(topo, field) == [getattr(lk, field) for lk in links]
    fn = lambda bw, lat, kind: (bw * 3.0 + lat / 7.0, kind)  # noqa: E731
    want = [fn(lk.bw_gbps, lk.latency_us, lk.kind) for lk in links]
    assert link_values(topo, fn, ("bw_gbps", "latency_us", "kind")) == want
    assert link_values(template(preset), fn, ("bw_gbps", "latency_us", "kind")) == [
        fn(lk.bw_gbps, lk.latency_us, lk.kind) for lk in template(preset).links]  # a plain tuple: link by link
    with pytest.raises(ValueError):
        link_values(topo, str, ("src",))
    assert topo.gpu_names == tuple(d.name for d in devices if d.kind == "gpu")
    again = pickle.loads(pickle.dumps(topo.links))
    assert again == topo.links and tuple(again) == links and hash(again) == hash(links)
    assert pickle.loads(pickle.dumps(topo.devices)) == devices


def test_a_different_fabric_is_not_equal():
    """Negative control: another oversubscription changes the uplinks' capacities, so the links differ."""
    one, _ = _built("dgx-h100", 9, 1.0)
    two, (_, links) = _built("dgx-h100", 9, 2.0)
    assert one.links != two.links and tuple(one.links) != links and one.devices == two.devices
    assert link_column(one, "bw_gbps") != link_column(two, "bw_gbps")


@pytest.mark.parametrize("preset", JOINABLE)
def test_capacity_from_columns_equals_link_by_link(preset):
    topo, (_, links) = _built(preset, 6)
    eff = tuple(sorted(DEFAULT_CONSTANTS.efficiencies(topo.gpu).items()))
    by_kind = dict(eff)
    assert cost._capacity_bps(topo, eff) == [lk.bw_gbps * GB * by_kind[lk.kind] for lk in links]
