"""Golden closed forms on toy topologies built here (ideal protocol, link efficiency 1), contention through
concurrent groups, link loads, and the byte-independence of the evaluation."""

from __future__ import annotations

import pytest

from meshsim.scenarios.schema import NetworkTuning
from meshsim.sim.cost.collectives import cache, collective_cost
from meshsim.sim.cost.collectives.cost import STATS
from meshsim.sim.cost.collectives.ring import ring_orders
from meshsim.topologies.model import Device, Link, Topology

EXACT = NetworkTuning(link_efficiency=1.0)
SIZES = (1024, 3 << 20, 1 << 30)


def pair(a, b, bw, lat, kind):
    return [Link(a, b, bw, lat, kind), Link(b, a, bw, lat, kind)]


def star(n, bw=100.0, lat_us=0.25, nvls=False):
    """n GPUs on one NVSwitch: GPU->GPU latency 2 lat_us, per-GPU bandwidth bw GB/s."""
    devices = [Device(f"n0.gpu{i}", "gpu", 0) for i in range(n)]
    devices.append(Device("n0.sw", "nvswitch", 0, in_network_reduction=nvls))
    links = [lk for i in range(n) for lk in pair(f"n0.gpu{i}", "n0.sw", bw, lat_us, "nvlink")]
    return Topology(f"star{n}", "toy", 1, n, tuple(devices), tuple(links))


def two_nodes(k, nv_bw=100.0, nv_lat=0.25, nic_bw=10.0, ib_lat=0.5, pcie_lat=1.5, shared_nic=False):
    """Two nodes of k GPUs on an NVSwitch each; one NIC per GPU (or one per node), all NICs on one IB
    switch. PCIe links are 1000 GB/s so the NIC's IB link is the network bottleneck."""
    devices, links = [Device("ibsw", "ib_switch")], []
    for n in range(2):
        devices.append(Device(f"n{n}.sw", "nvswitch", n))
        for i in range(k):
            gpu = f"n{n}.gpu{i}"
            devices.append(Device(gpu, "gpu", n))
            links += pair(gpu, f"n{n}.sw", nv_bw, nv_lat, "nvlink")
            nic = f"n{n}.nic{0 if shared_nic else i}"
            if not shared_nic or i == 0:
                devices.append(Device(nic, "nic", n))
                links += pair(nic, "ibsw", nic_bw, ib_lat, "ib")
            links += pair(gpu, nic, 1000.0, pcie_lat, "pcie")
    devices.sort(key=lambda d: (d.kind != "gpu", d.node if d.node is not None else 99, d.name))
    return Topology(f"toy2x{k}", "toy", 2, k, tuple(devices), tuple(links))


def ideal(topo, op, ranks, nbytes, algo, **kw):
    return collective_cost(topo, op, ranks, nbytes, algo=algo, protocol="ideal", tuning=EXACT, **kw)


# ---- one switch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_ring_all_reduce_closed_form(n):
    L, B = 2 * 0.25e-6, 100e9
    for S in SIZES:
        c = ideal(star(n), "all_reduce", range(n), S, "ring")
        assert c.time_s == pytest.approx(2 * (n - 1) * L + 2 * (n - 1) / n * S / B, rel=1e-9)
        assert c.latency_s == pytest.approx(2 * (n - 1) * L, rel=1e-9)
        assert c.latency_s + c.bandwidth_s == pytest.approx(c.time_s, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_ring_gather_scatter_closed_form(n, op):
    L, B = 2 * 0.25e-6, 100e9
    for S in SIZES:
        c = ideal(star(n), op, range(n), S, "ring")
        assert c.time_s == pytest.approx((n - 1) * L + (n - 1) / n * S / B, rel=1e-9)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_broadcast_closed_form(n):
    L, B = 2 * 0.25e-6, 100e9
    c = ideal(star(n), "broadcast", range(n), 1 << 28, "ring")
    assert c.time_s == pytest.approx((n - 1) * L + (1 << 28) / B, rel=1e-9)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_tree_all_reduce_closed_form(n):
    """One node: n rotated chains x 2 trees. Fill 2(n-1) hops; every GPU link carries 4(n-1) edge flows of
    S/(2n), so the bandwidth term is 2(n-1)/n S/B - the ring's (docs/collectives.md)."""
    L, B = 2 * 0.25e-6, 100e9
    for S in SIZES:
        c = ideal(star(n), "all_reduce", range(n), S, "tree")
        assert c.time_s == pytest.approx(2 * (n - 1) * L + 2 * (n - 1) / n * S / B, rel=1e-9)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_nvls_closed_forms(n):
    L, B, S = 2 * 0.25e-6, 100e9, 1 << 26
    topo = star(n, nvls=True)
    assert ideal(topo, "all_reduce", range(n), S, "nvls").time_s == pytest.approx(L + S / B, rel=1e-9)
    for op in ("all_gather", "reduce_scatter"):
        assert ideal(topo, op, range(n), S, "nvls").time_s == pytest.approx(L + (n - 1) / n * S / B, rel=1e-9)
    # busbw of NVLS all-reduce at large sizes approaches 2(n-1)/n B
    big = ideal(topo, "all_reduce", range(n), 1 << 36, "nvls")
    assert big.busbw_gbps == pytest.approx(2 * (n - 1) / n * 100.0, rel=1e-3)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_direct_all_to_all_closed_form(n):
    L, B, S = 2 * 0.25e-6, 100e9, 1 << 24
    c = ideal(star(n), "all_to_all", range(n), S, "direct")
    assert c.time_s == pytest.approx(L + (n - 1) / n * S / B, rel=1e-9)


def test_ring_busbw_reaches_link_bandwidth_independent_of_n():
    """Ideal: the link. Simple: NCCL's 0.8 x the link, less the slice handshakes - 2 per 2 MiB chunk, 3.4 us
    each, on each of the toy GPU's 2 channels (40 GB/s) - which cost the same fraction for every n."""
    simple = 80.0 / (1 + 2 * 3.4e-6 * 40e9 / (2 << 20))
    for protocol, tuning, expect in (("ideal", EXACT, 100.0), ("simple", None, simple)):
        for n in (2, 4, 8, 16):
            c = collective_cost(star(n), "all_reduce", range(n), 1 << 36, algo="ring", protocol=protocol,
                                tuning=tuning)
            assert c.busbw_gbps == pytest.approx(expect, rel=2e-3), (protocol, n)


def test_trivial_groups_cost_nothing():
    assert collective_cost(star(4), "all_reduce", [2], 1 << 20).time_s == 0.0
    assert collective_cost(star(4), "all_reduce", range(4), 0).time_s == 0.0


# ---- two nodes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4])
def test_multi_node_ring_closed_form(k):
    """k rails: every GPU sends over NVLink in k-1 channels and over its NIC in one; step latency is the
    ring's average hop (2k-2 NVLink hops, 2 network hops)."""
    topo, n = two_nodes(k), 2 * k
    Ln, Lx = 2 * 0.25e-6, 2 * 1.5e-6 + 2 * 0.5e-6
    Bn, Bx = 100e9, 10e9
    step_lat = ((2 * k - 2) * Ln + 2 * Lx) / (2 * k)
    s_per_byte = max((k - 1) / (n * k * Bn), 1 / (n * k * Bx))
    for S in SIZES:
        c = ideal(topo, "all_reduce", range(n), S, "ring")
        assert c.time_s == pytest.approx(2 * (n - 1) * (step_lat + S * s_per_byte), rel=1e-9)
    # all k NICs carry the ring: busbw ~ k x NIC bandwidth
    assert ideal(topo, "all_reduce", range(n), 1 << 38, "ring").busbw_gbps == pytest.approx(k * 10.0, rel=1e-3)


def test_multi_node_rings_stay_on_rails():
    topo = two_nodes(4)
    for ring in ring_orders(topo, range(8)):
        crossings = [(a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)
                     if topo.node_of(a) != topo.node_of(b)]
        assert len(crossings) == 2
        assert all(a % 4 == b % 4 for a, b in crossings)


def test_hierarchical_closed_form():
    k, topo = 4, two_nodes(4)
    Ln, Lx = 2 * 0.25e-6, 2 * 1.5e-6 + 2 * 0.5e-6
    Bn, Bx = 100e9, 10e9
    for S in SIZES:
        expect = 2 * (k - 1) * (Ln + S / (k * Bn)) + 2 * (Lx + S / (2 * k * Bx))
        assert ideal(topo, "all_reduce", range(8), S, "hierarchical").time_s == pytest.approx(expect, rel=1e-9)


# ---- contention ----------------------------------------------------------------------------------------
def test_concurrent_groups_sharing_a_nic_take_twice_as_long():
    topo = two_nodes(2, shared_nic=True)
    alone = ideal(topo, "all_reduce", (0, 2), 1 << 30, "ring")
    both = ideal(topo, "all_reduce", (0, 2), 1 << 30, "ring", concurrent_groups=[(1, 3)])
    assert both.bandwidth_s == pytest.approx(2 * alone.bandwidth_s, rel=1e-9)
    assert both.latency_s == pytest.approx(alone.latency_s, rel=1e-12)


def test_concurrent_groups_on_separate_rails_do_not_interact():
    topo = two_nodes(2)
    alone = ideal(topo, "all_reduce", (0, 2), 1 << 30, "ring")
    both = ideal(topo, "all_reduce", (0, 2), 1 << 30, "ring", concurrent_groups=[(1, 3), (0, 2)])
    assert both.time_s == pytest.approx(alone.time_s, rel=1e-12)
    node_local = ideal(topo, "all_reduce", (0, 1), 1 << 30, "ring", concurrent_groups=[(2, 3)])
    assert node_local.time_s == pytest.approx(ideal(topo, "all_reduce", (0, 1), 1 << 30, "ring").time_s)


def test_link_load_is_busy_fraction_of_each_link():
    topo = two_nodes(2)
    c = ideal(topo, "all_reduce", (0, 2), 1 << 30, "ring")
    by_kind = {}
    for li, load in c.link_load.items():
        by_kind.setdefault(topo.links[li].kind, set()).add(round(load, 12))
    assert by_kind["ib"] == {1.0}  # the NIC links are the bottleneck
    assert by_kind["pcie"] == {round(10.0 / 1000.0, 12)}  # GPU<->NIC links: NIC rate / PCIe rate
    assert "nvlink" not in by_kind


# ---- symmetry, never bytes --------------------------------------------------------------------------
def test_a_size_sweep_evaluates_the_plan_once():
    cache.clear()
    topo = two_nodes(4)
    before = dict(STATS)
    for e in range(30):
        collective_cost(topo, "all_reduce", range(8), 1 << e, algo="ring", protocol="simple")
    assert STATS["structures"] - before["structures"] == 1
    # one ring step: 8 ranks x 4 channels flows, independent of the 30 sizes
    assert STATS["flows"] - before["flows"] == 8 * 4


def test_direct_all_to_all_latency_is_the_slowest_pair():
    """Ideal protocol: one step whose latency is the slowest pair's path, over every ordered pair (not only
    pairs with the first rank): on two DGX H100 nodes, 1 -> 8 crosses rails and is slower than 0 -> 8."""
    from meshsim.topologies.registry import build_topology

    topo = build_topology("dgx-h100", 2)
    group = [0, 1, 8]
    slowest_us = max(topo.path_latency_us(a, b) for a in group for b in group if a != b)
    assert slowest_us > max(topo.path_latency_us(0, b) for b in group[1:])  # the case the test is about
    cost = collective_cost(topo, "all_to_all", group, 3 << 20, protocol="ideal")
    assert cost.latency_s == pytest.approx(slowest_us * 1e-6)
