"""NCCL's kernel geometry in the collective model: Simple slices and loops (protocols.SIMPLE_CHUNK_BYTES),
the per-channel fill, channels on the 400 GB/s export parts, NVLS's channel bound (nvls_limits.py) and the
channels a kernel occupies (channels.kernel_channels). Closed forms on the DGX presets, negative controls."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.sim.cost.collectives import collective_cost, kernel_channels, ring_channels
from meshsim.sim.cost.collectives.nvls_limits import nvls_chunk_bytes, nvls_kernel_s
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, SIMPLE_FILL_BYTES_PER_CHANNEL
from meshsim.topologies.registry import build_topology

MIB = 1 << 20
A100_LOOP = 24 * 8 * 2 * MIB  # channels x ranks x Simple chunk: 384 MiB


@pytest.fixture(scope="module")
def a100():
    return build_topology("dgx-a100", 1)


@pytest.fixture(scope="module")
def h100():
    return build_topology("dgx-h100", 1)


def _ring_simple_us(nbytes: int, loops: int, channels: int = 24, busbw_gbps: float = 240.0) -> float:
    """8-rank ring Simple all-reduce latency (us): base + 14 x 3.4 us x 2 slices x loops + the fill."""
    fill_per_channel = min(SIMPLE_FILL_BYTES_PER_CHANNEL, nbytes / (8 * channels))
    return 8.4 + 14 * 3.4 * 2 * loops + 14 * channels * fill_per_channel / (busbw_gbps * 1e3)


@pytest.mark.parametrize("nbytes, loops", [(64 * MIB, 1), (A100_LOOP, 1), (A100_LOOP + 8, 2), (8 << 30, 22)])
def test_simple_pays_nccl_step_latency_per_slice_of_every_loop(a100, nbytes, loops):
    c = collective_cost(a100, "all_reduce", range(8), nbytes, algo="ring", protocol="simple")
    assert c.latency_s == pytest.approx(_ring_simple_us(nbytes, loops) * 1e-6, rel=1e-6)
    assert c.bandwidth_s == pytest.approx(nbytes * 14 / 8 / 240e9, rel=1e-6)


def test_one_more_loop_costs_exactly_its_slices(a100):
    below = collective_cost(a100, "all_reduce", range(8), A100_LOOP, algo="ring", protocol="simple")
    above = collective_cost(a100, "all_reduce", range(8), A100_LOOP + 8, algo="ring", protocol="simple")
    assert above.latency_s - below.latency_s == pytest.approx(14 * 3.4 * 2 * 1e-6, rel=1e-6)


def test_slices_apply_to_ring_simple_only(a100):
    """LL128 and tree keep NCCL's one latency per step at any size (negative controls); so does Simple when
    the chunk is unbounded and a chunk is one slice (NCCL's own model)."""
    big = 8 << 30
    ll128 = collective_cost(a100, "all_reduce", range(8), big, algo="ring", protocol="ll128")
    assert ll128.latency_s == pytest.approx((14 + 14 * 1.9 + 14 * 24 * 100e3 / 240e3) * 1e-6, rel=1e-6)
    tree_at = {s: collective_cost(a100, "all_reduce", range(8), s, algo="tree", protocol="simple").latency_s
               for s in (A100_LOOP, 8 * A100_LOOP)}
    assert tree_at[A100_LOOP] == pytest.approx(tree_at[8 * A100_LOOP], rel=1e-12)
    nccl_like = replace(DEFAULT_CONSTANTS, simple_slices_per_chunk=1, simple_chunk_bytes=1 << 50)
    ring = collective_cost(a100, "all_reduce", range(8), big, algo="ring", protocol="simple", constants=nccl_like)
    assert ring.latency_s == pytest.approx((8.4 + 14 * 3.4 + 14 * 24 * 100e3 / 240e3) * 1e-6, rel=1e-6)


def test_gathers_count_slices_over_the_total_size(a100):
    """All-gather: 7 steps; a loop moves 24 channels x 8 ranks x 2 MiB of the gathered total."""
    c = collective_cost(a100, "all_gather", range(8), 2 * A100_LOOP, algo="ring", protocol="simple")
    fill = 7 * 24 * 100e3 / 240e3
    assert c.latency_s == pytest.approx((8.4 + 7 * 3.4 * 2 * 2 + fill) * 1e-6, rel=1e-6)


def test_export_parts_have_eight_nvlinks_and_sixteen_channels(a100, h100):
    a800 = build_topology("dgx-a100", 1, nvlink_gbps=200.0)
    h800 = build_topology("dgx-h100", 1, nvlink_gbps=200.0)
    assert (ring_channels(a100), ring_channels(h100), ring_channels(a800), ring_channels(h800)) == (24, 32, 16, 16)
    assert ring_channels(a800, replace(DEFAULT_CONSTANTS, channels=6)) == 6
    # A800 all-gather 96 MiB: one loop (16 x 8 x 2 MiB = 256 MiB), fill 16 channels x 100 kB at 8 x 20 GB/s
    c = collective_cost(a800, "all_gather", range(8), 96 * MIB, algo="ring", protocol="simple")
    assert c.latency_s == pytest.approx((8.4 + 7 * 3.4 * 2 + 7 * 16 * 100e3 / 160e3) * 1e-6, rel=1e-6)


def test_nvls_chunk_follows_enqueue_cc():
    """NCCL's NVLS chunk on 16 channels x 8 heads: 128 KiB from 1 GiB, 64 KiB from 64 MiB, 32 KiB from 8 MiB,
    16 KiB below; on 2 heads the thresholds are 4x lower."""
    sizes = {4 * MIB: 16 << 10, 8 * MIB - 1: 16 << 10, 8 * MIB: 32 << 10, 64 * MIB - 1: 32 << 10,
             64 * MIB: 64 << 10, (1 << 30) - 1: 64 << 10, 1 << 30: 128 << 10}
    assert {s: nvls_chunk_bytes(s, 16, 8) for s in sizes} == sizes
    assert nvls_chunk_bytes(256 * MIB, 16, 2) == 128 << 10 and nvls_chunk_bytes(256 * MIB - 1, 16, 2) == 64 << 10


def test_nvls_is_its_kernels_loop_pipeline_unless_the_links_bind(h100):
    """DGX H100 NVLS all-reduce of 16 MiB: 32 KiB chunks, 4 loops of 16 x 8 x 32 KiB, each 4.4 us + its
    16 MiB / 4 at 16 x 18.75 GB/s, two more loops to fill the three-stage pipeline, + the 12 us step:
    122 us, busbw 240 (links alone: 649). All-gather moves (n-1)/n of the bytes through the busier port.
    Negative controls: no loop overhead and a huge per-channel rate give the link time back; on 2 GPUs the
    ring wins large all-reduces (NVLS's 2 heads loop 4x as often)."""
    s = 16 * MIB
    nvls = collective_cost(h100, "all_reduce", range(8), s, algo="nvls")
    per_loop = 4.4e-6 + s / 4 / 300e9
    assert nvls.latency_s == pytest.approx(12e-6, rel=1e-9)
    assert nvls.bandwidth_s == pytest.approx(6 * per_loop, rel=1e-9)
    assert nvls_kernel_s("h100-sxm", "all_reduce", s, 8) == pytest.approx(6 * per_loop, rel=1e-12)
    link_bound = 2 * 7 / 8 * 18 * 20.6
    assert max(nvls.link_load.values()) == pytest.approx(s * 14 / 8 / (link_bound * 1e9) / (6 * per_loop), rel=2e-3)
    ag = collective_cost(h100, "all_gather", range(8), s, algo="nvls")
    assert ag.bandwidth_s == pytest.approx(6 * (4.4e-6 + s * 7 / 8 / 4 / 300e9), rel=1e-9)
    free = collective_cost(h100, "all_reduce", range(8), s, algo="nvls",
                           constants=replace(DEFAULT_CONSTANTS, nvls_channel_gbps=1e6, nvls_loop_overhead_us=0.0))
    assert free.bandwidth_s == pytest.approx(s * 14 / 8 / (link_bound * 1e9), rel=2e-3)
    assert collective_cost(h100, "all_reduce", range(2), 1 << 34).algo != "nvls"


def test_nvls_still_wins_where_nccl_uses_it(h100):
    """Large all-reduces on one DGX H100 run NVLS (~480 GB/s > the ring's ~357); tiny ones a ring/tree LL;
    H800's 96 MiB all-gather runs NVLS at the link rate, 12 us + S x 7/8 / (8 x 20.6 GB/s): its links
    (164.8 GB/s of busbw) bind before the kernel's 14 loops of 4.4 us + 8 MiB x 7/8 / 300 GB/s."""
    assert collective_cost(h100, "all_reduce", range(8), 1 << 30).algo == "nvls"
    assert collective_cost(h100, "all_reduce", range(8), 4 << 10).algo != "nvls"
    h800 = build_topology("dgx-h100", 1, nvlink_gbps=200.0)
    ag = collective_cost(h800, "all_gather", range(8), 96 * MIB)
    assert ag.algo == "nvls"
    assert ag.time_s == pytest.approx(12e-6 + 96 * MIB * 7 / 8 / (8 * 20.6e9), rel=2e-3)


def test_kernel_channels(a100, h100):
    """One CTA per channel: NVLS 16 (NCCL_NVLS_NCHANNELS), ring Simple all of the ring's channels, a small
    LL call fewer (enqueue.cc: 512 threads x 8 B x 8 ranks = 32 KiB per channel), nothing for no call."""
    assert kernel_channels(h100, "nvls", "simple", 1 << 30, 8) == 16
    assert kernel_channels(h100, "nvls", "simple", 1 << 30, 8, replace(DEFAULT_CONSTANTS, nvls_channels=8)) == 8
    assert kernel_channels(a100, "ring", "simple", 1 << 30, 8) == 24
    assert kernel_channels(a100, "ring", "ll", 64 << 10, 8) == 2
    assert kernel_channels(a100, "none", "none", 0, 1) == 0
    c = collective_cost(h100, "all_reduce", range(8), 1 << 30)
    assert kernel_channels(h100, c.algo, c.protocol, c.nbytes, c.ranks) == 16


def test_slices_apply_inside_nodes_not_to_network_steps():
    """No fill, so latency = base + rounds x intra-node steps + network steps. PCIe box (2 channels, loop
    2 x 8 x 2 MiB): one more loop doubles the step part. Two DGX A100 (16 network channels, 2 per HDR NIC;
    loop 16 x 16 x 2 MiB): 30 steps, 14 of the ring's 16 hops on NVLink; one more loop adds 2 x 30 x 14/16 x
    3.4 us, x 1.4 (multi-node Simple)."""
    no_fill = replace(DEFAULT_CONSTANTS, simple_fill_bytes_per_channel=0.0)
    pcie = build_topology("pcie-8gpu", 1)
    assert ring_channels(pcie) == 2
    loop = 2 * 8 * 2 * MIB
    one, two = (collective_cost(pcie, "all_reduce", range(8), s, algo="ring", protocol="simple",
                                constants=no_fill).latency_s - 8.4e-6 for s in (loop, loop + 8))
    assert two == pytest.approx(2 * one, rel=1e-9)
    a100x2 = build_topology("dgx-a100", 2)
    loop = 16 * 16 * 2 * MIB
    one, two = (collective_cost(a100x2, "all_reduce", range(16), s, algo="ring", protocol="simple",
                                constants=no_fill).latency_s for s in (loop, loop + 8))
    assert two - one == pytest.approx(1.4 * 2 * 30 * 14 / 16 * 3.4e-6, rel=1e-9)
