"""NVLS tree across NVLink domains (issue 42 item 2): applicability, NCCL's chunk / channel rules, the
kernel's closed form, and golden busbw on two GB200 NVL72 racks."""

from __future__ import annotations

import math

import pytest

from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.collectives import collective_cost
from meshsim.sim.cost.collectives.choose import algorithms_for
from meshsim.sim.cost.collectives.nvls_limits import NVLS_LOOP_OVERHEAD_US, nvls_port_gbps
from meshsim.sim.cost.collectives.nvls_tree import nvls_tree_applies, pipeline_fill_loops, tree_depth
from meshsim.sim.cost.collectives.nvls_tree_limits import (
    nvls_tree_chunk_bytes,
    nvls_tree_kernel_s,
    nvls_tree_setup,
)
from meshsim.topologies.registry import build_topology

MIB = 1 << 20


@pytest.fixture(scope="module")
def two_racks():
    return build_topology("gb200-nvl72", 2)


def test_applies_only_across_nvls_domains(two_racks) -> None:
    one = build_topology("gb200-nvl72", 1)
    assert "nvls_tree" in algorithms_for(two_racks, "all_reduce", range(144))
    assert "nvls_tree" not in algorithms_for(one, "all_reduce", range(72))  # one node: NVLS (tuning.cc L502)
    assert not nvls_tree_applies(two_racks, "all_gather", range(144))  # all-reduce only
    assert not nvls_tree_applies(two_racks, "all_reduce", [0, 72])  # one rank per node: no NVLS in a node
    a100 = build_topology("dgx-a100", 2)
    assert not nvls_tree_applies(a100, "all_reduce", range(16))  # no NVLS switch
    with pytest.raises(UserError):
        collective_cost(one, "all_reduce", range(72), MIB, algo="nvls_tree")


def test_nccl_setup_and_chunks() -> None:
    # nvls.cc L173-179: 2 nodes, NIC >= 48 GB/s: 32 channels, tree chunk 64 KiB from 16 GPUs per node
    assert nvls_tree_setup("gb200", 2, 50.0, 72) == (32, 64 * 1024)
    assert nvls_tree_setup("gb200", 2, 50.0, 4) == (32, 256 * 1024)
    assert nvls_tree_setup("gb200", 4, 50.0, 72) == (24, 128 * 1024)
    assert nvls_tree_setup("h100-sxm", 2, 50.0, 8) == (16, 128 * 1024)
    assert nvls_tree_setup("h100-sxm", 4, 50.0, 8) == (16, 64 * 1024)
    # enqueue.cc L2282-2285: below 1 x 32 channels x 32 heads x 64 KiB = 64 MiB the chunk halves
    assert nvls_tree_chunk_bytes(64 * MIB, 32, 32, 64 * 1024) == 64 * 1024
    assert nvls_tree_chunk_bytes(64 * MIB - 1, 32, 32, 64 * 1024) == 32 * 1024


def test_pipeline_fill_from_stages() -> None:
    assert [tree_depth(m) for m in (2, 3, 4, 8)] == [1, 2, 2, 3]
    assert pipeline_fill_loops(2) == 6  # 5 GPU stages + 2 network transits - 1


def test_kernel_closed_form() -> None:
    """16 GiB over 2 racks: 256 loops of 32 x 32 x 64 KiB, + 6 fill, each 4.4 us + its port bytes."""
    port = nvls_port_gbps("gb200")
    assert port == pytest.approx(430.0)
    nbytes = 16 * 1024 * MIB
    loops = nbytes // (32 * 32 * 64 * 1024)
    assert loops == 256
    want = (loops + 6) * (NVLS_LOOP_OVERHEAD_US * 1e-6 + nbytes / loops / (port * 1e9))
    assert nvls_tree_kernel_s("gb200", nbytes, 2, 72, 50.0, port) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("mib", "busbw"), [(512, 463.5), (1024, 595.0), (4096, 755.8), (16384, 810.6)])
def test_golden_two_racks(two_racks, mib: int, busbw: float) -> None:
    """Golden busbw of the two-rack curve's sizes (public-measurements-3.md section 3: 494, 596, 743, 810)."""
    cost = collective_cost(two_racks, "all_reduce", range(144), mib * MIB)
    assert cost.algo == "nvls_tree" and cost.protocol == "simple"
    assert cost.busbw_gbps == pytest.approx(busbw, abs=0.1)


def test_busbw_depends_on_racks(two_racks) -> None:
    """Leaving the rack costs the tree's pipeline fill: less busbw at 1 GiB on 2 racks than on one,
    nearly the same at 16 GiB (NCCL's model gives both the one-node NVLS bandwidth)."""
    one = build_topology("gb200-nvl72", 1)
    small = [collective_cost(t, "all_reduce", range(t.num_gpus), 1024 * MIB).busbw_gbps for t in (one, two_racks)]
    large = [collective_cost(t, "all_reduce", range(t.num_gpus), 16384 * MIB).busbw_gbps for t in (one, two_racks)]
    assert small[1] < 0.9 * small[0]  # 595 vs 692
    assert math.isclose(large[1], large[0], rel_tol=0.05)


def test_negative_control_forced_tree_is_slower(two_racks) -> None:
    auto = collective_cost(two_racks, "all_reduce", range(144), 4096 * MIB)
    tree = collective_cost(two_racks, "all_reduce", range(144), 4096 * MIB, algo="tree")
    assert tree.busbw_gbps < 0.85 * auto.busbw_gbps
