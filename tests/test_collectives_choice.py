"""Applicable algorithms, overrides, the auto choice at the crossing of predicted times, busbw factors,
and NCCL's latency formulas on the DGX presets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.scenarios.schema import NetworkTuning
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.collectives import algorithms_for, busbw_factor, collective_cost
from meshsim.sim.cost.collectives.choose import candidates
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, SIMPLE_FILL_BYTES_PER_CHANNEL
from meshsim.topologies.registry import build_topology


@pytest.fixture(scope="module")
def h100():
    return build_topology("dgx-h100", 1)


@pytest.fixture(scope="module")
def h100x2():
    return build_topology("dgx-h100", 2)


def test_busbw_factor_follows_nccl_tests():
    for n in (2, 3, 8, 1024):
        assert busbw_factor("all_reduce", n) == 2 * (n - 1) / n
        for op in ("all_gather", "reduce_scatter", "all_to_all"):
            assert busbw_factor(op, n) == (n - 1) / n
        assert busbw_factor("broadcast", n) == 1.0


def test_applicable_algorithms(h100, h100x2):
    assert algorithms_for(h100, "all_reduce", range(8)) == ["ring", "tree", "nvls"]
    assert algorithms_for(h100x2, "all_reduce", range(16)) == ["ring", "tree", "nvls_tree", "hierarchical"]
    assert algorithms_for(h100x2, "all_gather", range(8, 16)) == ["ring", "nvls"]
    assert algorithms_for(h100, "broadcast", range(8)) == ["ring"]
    assert algorithms_for(h100, "all_to_all", range(8)) == ["direct"]
    assert "nvls" not in algorithms_for(build_topology("dgx-a100", 1), "all_reduce", range(8))


@pytest.mark.parametrize("case", [
    ("dgx-a100", 1, "all_reduce", 8, "nvls", "auto"),  # switch without in-network reduction
    ("dgx-h100", 2, "all_reduce", 16, "nvls", "auto"),  # NVLS across nodes
    ("dgx-h100", 1, "all_gather", 8, "tree", "auto"),  # tree is all-reduce only
    ("dgx-h100", 1, "all_reduce", 8, "hierarchical", "auto"),  # one node
    ("dgx-h100", 1, "all_reduce", 8, "nvls", "ll"),  # NVLS is Simple only
    ("dgx-h100", 1, "all_reduce", 8, "rings", "auto"),  # unknown algorithm
    ("dgx-h100", 1, "all_reduce", 8, "auto", "ll256"),  # unknown protocol
    ("dgx-h100", 1, "allreduce", 8, "auto", "auto"),  # unknown op
])
def test_unsupported_overrides_are_user_errors(case):
    preset, nodes, op, n, algo, protocol = case
    with pytest.raises(UserError):
        collective_cost(build_topology(preset, nodes), op, range(n), 1 << 20, algo=algo, protocol=protocol)


def test_bad_ranks_and_sizes_are_user_errors(h100):
    for ranks, nbytes in (([0, 8], 1), ([0, 0], 1), ([], 1), ([0, 1], -5)):
        with pytest.raises(UserError):
            collective_cost(h100, "all_reduce", ranks, nbytes)


def test_scenario_preference_falls_back_where_it_does_not_apply(h100):
    tree = NetworkTuning(algo="tree")
    assert collective_cost(h100, "all_reduce", range(8), 1 << 20, tuning=tree).algo == "tree"
    assert collective_cost(h100, "all_gather", range(8), 1 << 20, tuning=tree).algo in ("ring", "nvls")
    with pytest.raises(UserError):
        collective_cost(build_topology("dgx-a100", 1), "all_reduce", range(8), 1 << 20,
                        tuning=NetworkTuning(algo="nvls"))
    simple = NetworkTuning(protocol="simple")
    assert collective_cost(h100, "all_reduce", range(8), 1024, tuning=simple).protocol == "simple"


def _times(topo, op, ranks, nbytes):
    return {pair: collective_cost(topo, op, ranks, nbytes, algo=pair[0], protocol=pair[1]).time_s
            for pair in candidates(topo, op, ranks)}


def _auto(topo, op, ranks, nbytes):
    c = collective_cost(topo, op, ranks, nbytes)
    return (c.algo, c.protocol), c.time_s


@pytest.mark.parametrize("preset,nodes,ranks", [("dgx-h100", 1, 8), ("dgx-h100", 2, 16), ("dgx-a100", 4, 32)])
def test_auto_switches_exactly_where_predicted_times_cross(preset, nodes, ranks):
    topo, op, group = build_topology(preset, nodes), "all_reduce", list(range(ranks))
    grid = [1 << e for e in range(0, 35)]
    choice = [_auto(topo, op, group, s)[0] for s in grid]
    switches = [(lo, hi) for lo, hi, a, b in zip(grid, grid[1:], choice, choice[1:], strict=False) if a != b]
    assert switches, "expected the choice to change somewhere between 1 B and 16 GB"
    for lo, hi in switches:
        first = _auto(topo, op, group, lo)[0]
        while hi - lo > 1:  # bisection on the byte count
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _auto(topo, op, group, mid)[0] == first else (lo, mid)
        second = _auto(topo, op, group, hi)[0]
        below, above = _times(topo, op, group, lo), _times(topo, op, group, hi)
        # the two lines cross between lo and hi (an exact tie goes to the earlier candidate in NCCL's order)
        assert below[first] <= below[second] and above[second] <= above[first]
        assert below[first] < below[second] or above[second] < above[first]
        assert below[first] == min(below.values()) and above[second] == min(above.values())


def test_nccl_latency_formulas_on_dgx_h100(h100, h100x2):
    """Tree all-reduce latency = base + 2((ppn-1) intraLat + log2(nNodes) interLat) when the physical path
    is shorter than NCCL's per-step figure (modeling-facts.md); ring Simple is NCCL's base + 14 x 3.4 us
    once the slice rounds and the fill are switched off."""
    c = collective_cost(h100x2, "all_reduce", range(16), 1, algo="tree", protocol="ll")
    assert c.latency_s == pytest.approx((6.8 + 2 * (7 * 0.6 + 1 * 5.0)) * 1e-6, rel=1e-9)
    nccl_only = replace(DEFAULT_CONSTANTS, simple_fill_bytes_per_channel=0.0, simple_slices_per_chunk=1)
    ring = collective_cost(h100, "all_reduce", range(8), 1, algo="ring", protocol="simple", constants=nccl_only)
    assert ring.latency_s == pytest.approx((8.4 + 14 * 3.4) * 1e-6, rel=1e-9)
    nvls = collective_cost(h100, "all_reduce", range(8), 1, algo="nvls")
    assert nvls.latency_s == pytest.approx(12e-6, rel=1e-9)  # its one step (nvls_limits.py)


def test_simple_pipeline_fill_is_steps_times_channel_fill_at_busbw(h100):
    """Ring all-reduce on 8 GPUs, 32 channels: 14 steps, each also paying 32 x SIMPLE_FILL_BYTES_PER_CHANNEL
    at the ring's bus bandwidth (18 x 20.6 GB/s) once a channel's step data (nbytes / (8 x 32)) exceeds it;
    below, one step's data; LL pays none; doubling the fill bytes doubles the term. One slice, one loop."""
    one_round = replace(DEFAULT_CONSTANTS, simple_slices_per_chunk=1, simple_chunk_bytes=1 << 40)
    big = 1 << 30
    ring = collective_cost(h100, "all_reduce", range(8), big, algo="ring", protocol="simple", constants=one_round)
    nccl = (8.4 + 14 * 3.4) * 1e-6
    assert ring.latency_s - nccl == pytest.approx(14 * 32 * SIMPLE_FILL_BYTES_PER_CHANNEL / (18 * 20.6e9), rel=2e-3)
    small = collective_cost(h100, "all_reduce", range(8), 8 << 10, algo="ring", protocol="simple",
                            constants=one_round)
    assert small.latency_s - nccl == pytest.approx(14 * (8 << 10) / 8 / (18 * 20.6e9), rel=2e-3)
    double = replace(one_round, simple_fill_bytes_per_channel=2 * SIMPLE_FILL_BYTES_PER_CHANNEL)
    ring2 = collective_cost(h100, "all_reduce", range(8), big, algo="ring", protocol="simple", constants=double)
    assert ring2.latency_s - nccl == pytest.approx(2 * (ring.latency_s - nccl), rel=1e-9)
    ll = collective_cost(h100, "all_reduce", range(8), big, algo="ring", protocol="ll")
    assert ll.latency_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6, rel=1e-9)


def test_nccl_bandwidth_on_dgx_h100(h100):
    """Ring Simple at 64 GiB = 128 loops of 32 channels x 8 ranks x 2 MiB: NCCL's 14 x 3.4 us paid per slice
    (2 per chunk, every loop) + the fill, on top of S x 14/8 at NCCL's 18 x 20.6 GB/s. NVLS is held to
    its kernel's loop (nvls_limits.py: 300 GB/s of algbw, less 4.4 us per loop of 16 x 8 x 128 KiB; below
    2(n-1)/n of the links, 649); ring LL all-reduce a quarter
    of Simple's (NCCL's 1/4, under Hopper's 141 GB/s cap), half with the flat factors (protocol_limits off)."""
    big = 1 << 36
    ring = collective_cost(h100, "all_reduce", range(8), big, algo="ring", protocol="simple")
    latency_us = 8.4 + 14 * 3.4 * 2 * 128 + 14 * 32 * SIMPLE_FILL_BYTES_PER_CHANNEL / (18 * 20.6e3)
    assert ring.time_s == pytest.approx(latency_us * 1e-6 + big * 14 / 8 / (18 * 20.6e9), rel=1e-6)
    assert 0.95 * 18 * 20.6 < ring.busbw_gbps < 0.97 * 18 * 20.6  # the slices cost 3.6% at the plateau
    nvls = collective_cost(h100, "all_reduce", range(8), big, algo="nvls")
    loops = big // (16 * 8 * 128 * 1024)
    assert nvls.time_s == pytest.approx(12e-6 + (loops + 2) * (4.4e-6 + big / loops / 300e9), rel=1e-9)
    ll = collective_cost(h100, "all_reduce", range(8), big, algo="ring", protocol="ll")
    assert ll.bandwidth_s == pytest.approx(4 * ring.bandwidth_s, rel=1e-9)
    flat = replace(DEFAULT_CONSTANTS, protocol_limits=False)
    ll_flat = collective_cost(h100, "all_reduce", range(8), big, algo="ring", protocol="ll", constants=flat)
    assert ll_flat.bandwidth_s == pytest.approx(2 * ring.bandwidth_s, rel=1e-9)
