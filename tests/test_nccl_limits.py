"""NCCL's protocol refinements (tuning.cc) and small-message channel counts (enqueue.cc): closed forms on
the DGX A100 / H100 and GB200 presets, with negative controls (nccl_limits.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.sim.cost.collectives import collective_cost
from meshsim.sim.cost.collectives.channels import group_channels, ring_channels
from meshsim.sim.cost.collectives.nccl_limits import channels_used, generation, protocol_busbw_gbps
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS
from meshsim.topologies.registry import build_topology

MIB = 1 << 20


@pytest.fixture(scope="module")
def a100():
    return build_topology("dgx-a100", 1)


def test_generation_and_channels(a100):
    assert [generation(g) for g in ("v100-sxm2", "a100-40gb", "h200", "b200", "mystery")] == \
        ["volta", "ampere", "hopper", "blackwell", "ampere"]
    assert ring_channels(a100, DEFAULT_CONSTANTS) == 24  # 12 NVLinks x 2
    assert ring_channels(build_topology("dgx-h100", 1), DEFAULT_CONSTANTS) == 32  # 18 x 2, capped at 32
    assert ring_channels(a100, replace(DEFAULT_CONSTANTS, channels=4)) == 4


def test_multi_node_rings_have_channels_per_nic_not_per_nvlink():
    """search.cc / connect.cc: one search channel per NIC the node-local ranks use, duplicated when it runs at
    >= 25 GB/s (NDR 50 GB/s: yes; HDR 25 GB/s, searched at 24: no), doubled once more: H100 4 per NIC, A100
    2; one node keeps its NVLink rings; the override wins. A DP ring of one GPU per node over 48 DGX H100
    then fills 4 channels per step, not 32: its reduce-scatter step latency is NCCL's 14 us + 4 x 100 kB at
    its 48 GB/s NIC (the fill), not 14 us + 32 x 100 kB."""
    h100, a100 = build_topology("dgx-h100", 48), build_topology("dgx-a100", 16)
    rail = list(range(0, 48 * 8, 8))
    assert group_channels(h100, rail) == 4 and group_channels(h100, range(16)) == 32
    assert group_channels(a100, range(0, 128, 8)) == 2 and group_channels(a100, range(128)) == 16
    assert group_channels(a100, range(8)) == 24 and group_channels(h100, range(8)) == 32
    assert group_channels(h100, rail, replace(DEFAULT_CONSTANTS, channels=6)) == 6
    big = 512 * MIB  # per channel and step 512 MiB / (48 x 4) = 2.8 MB > 100 kB: the full fill
    rs = collective_cost(h100, "reduce_scatter", rail, big, algo="ring", protocol="simple")
    assert rs.latency_s == pytest.approx(8.4e-6 + 47 * (14e-6 + 4 * 100e3 / 48e9), rel=1e-6)  # NIC 50 x 0.96


def test_ring_ll_all_reduce_on_a100_is_a_quarter_capped_at_ll_max(a100):
    """8 x A100: bus 12 x 20 = 240 GB/s; ring LL all-reduce min(87.7, 240/4) = 60 GB/s, so
    t = 6.6 + 14 x 0.6 us + S x (14/8) / 60 GB/s."""
    c = collective_cost(a100, "all_reduce", range(8), MIB, algo="ring", protocol="ll")
    assert c.time_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6 + MIB * 14 / 8 / 60e9, rel=1e-6)
    assert c.busbw_gbps == pytest.approx(MIB / c.time_s * 14 / 8 / 1e9)


def test_ll_cap_binds_and_all_gather_uses_a_third():
    assert protocol_busbw_gbps(400.0, algo="ring", op="all_reduce", protocol="ll", gen="ampere", nodes=1,
                               channels=24, used=24) == pytest.approx(87.7)
    assert protocol_busbw_gbps(240.0, algo="ring", op="all_gather", protocol="ll", gen="ampere", nodes=1,
                               channels=24, used=24) == pytest.approx(80.0)
    # across nodes the reducing factor 1/4 applies to every op, and Ampere's 2-node cap is 22.5
    assert protocol_busbw_gbps(240.0, algo="ring", op="all_gather", protocol="ll", gen="ampere", nodes=2,
                               channels=24, used=24) == pytest.approx(22.5)


def test_ll128_per_channel_cap_and_tree_factors():
    # 40 GB/s per channel: 4 channels x 20 GB/s binds before 0.92 x 960 x 4/24
    assert protocol_busbw_gbps(960.0, algo="ring", op="all_reduce", protocol="ll128", gen="ampere", nodes=1,
                               channels=24, used=4) == pytest.approx(80.0)
    assert protocol_busbw_gbps(240.0, algo="ring", op="all_reduce", protocol="ll128", gen="ampere", nodes=1,
                               channels=24, used=4) == pytest.approx(0.92 * 40)
    assert protocol_busbw_gbps(240.0, algo="ring", op="all_reduce", protocol="ll128", gen="ampere", nodes=1,
                               channels=24, used=24) == pytest.approx(0.92 * 240)
    tree = protocol_busbw_gbps(240.0, algo="tree", op="all_reduce", protocol="simple", gen="ampere", nodes=1,
                               channels=24, used=24)
    assert tree == pytest.approx(0.92 * 240)
    assert protocol_busbw_gbps(240.0, algo="tree", op="all_reduce", protocol="ll128", gen="ampere", nodes=1,
                               channels=24, used=24) == pytest.approx(tree * 7 / 9)
    assert protocol_busbw_gbps(240.0, algo="tree", op="all_reduce", protocol="ll", gen="ampere", nodes=1,
                               channels=24, used=24) == pytest.approx(tree / 3.8)


def test_small_messages_use_fewer_channels(a100):
    """Ring LL on 8 ranks: 512 threads x 8 B x 8 ranks = 32 KiB per channel; Simple: 512 x 64 B = 32 KiB."""
    assert channels_used(64 << 10, "ring", "ll", 8, 24) == 2
    assert channels_used(64 << 10, "ring", "simple", 8, 24) == 2
    assert channels_used(64 << 10, "ring", "ll128", 8, 24) == 13  # 640 x 8 B = 5 KiB per channel
    assert channels_used(MIB, "ring", "ll", 8, 24) == 24
    assert channels_used(0, "ring", "ll", 8, 24) == 1
    # 64 KiB ring Simple all-reduce: bus 240 x 2/24 = 20 GB/s; the flat model keeps 240 (negative control)
    few = collective_cost(a100, "all_reduce", range(8), 64 << 10, algo="ring", protocol="simple")
    flat = collective_cost(a100, "all_reduce", range(8), 64 << 10, algo="ring", protocol="simple",
                           constants=replace(DEFAULT_CONSTANTS, protocol_limits=False))
    assert few.bandwidth_s == pytest.approx((64 << 10) * 14 / 8 / 20e9, rel=1e-6)
    assert few.bandwidth_s == pytest.approx(12 * flat.bandwidth_s, rel=1e-6)
