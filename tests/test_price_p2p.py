"""Pricing a pipeline transfer as its copy whole fabric blocks back (sim/results/costers.P2PCoster) gives
exactly what pricing it directly gives: the same latency, bandwidth part and link loads (same links, same
order, same floats). Generated over meshes with full and partial last leaves, every pair of stages (the
neighbours both ways and the interleaved schedule's wrap-around), several positions and sizes; and the
negative control: stages under the partial leaf price differently, so the guard that keeps them direct is
needed."""

from __future__ import annotations

import random

import pytest
from test_fabric_blocks import mesh

from meshsim.sim.results.costers import P2PCoster
from meshsim.sim.results.fabric_blocks import FabricBlocks

LAYOUTS = [(64, 8, 2), (64, 4, 4), (128, 8, 8), (96, 8, 4), (240, 8, 5), (72, 2, 4)]


def same(a, b):
    lat_a, bw_a, load_a = a
    lat_b, bw_b, load_b = b
    assert (lat_a, bw_a) == (lat_b, bw_b)
    assert list(load_a.items()) == list(load_b.items())


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "nodes{}-tp{}-pp{}".format(*t))
def test_translated_transfers_equal_direct_ones(layout):
    rs = mesh(*layout)
    rng = random.Random(sum(layout))
    memo, direct = P2PCoster(rs), P2PCoster(rs, translate=False)
    size, pp = rs.stage_size, layout[2]
    moved = 0
    for a in range(pp):
        for b in {(a + 1) % pp, (a - 1) % pp} - {a}:
            for pos in {0, rng.randrange(size), size - 1}:
                nbytes = rng.choice((4096, 1 << 20, 3 * (1 << 24) + 8))
                src, dst = a * size + pos, b * size + pos
                moved += memo.move(src, dst) is not None
                same(memo(src, dst, nbytes), direct(src, dst, nbytes))
    blocks = FabricBlocks.of(rs)
    if blocks is not None and pp * size >= 3 * blocks.block:
        assert moved  # some transfers were priced as copies


def test_transfers_under_the_partial_leaf_would_price_differently():
    """240 nodes: 7 full leaves and a half one per rail; pp 5: stages of 384 ranks, blocks of 768. Stages 3 -> 4
    end under the partial leaf, so they are priced directly; forced through as a copy they would differ."""
    rs = mesh(240, 8, 5)
    memo = P2PCoster(rs)
    blocks = memo.blocks
    src, dst = 3 * rs.stage_size + 5, 4 * rs.stage_size + 5
    assert blocks is not None and memo.move(src, dst) is None
    forced = P2PCoster(rs)
    forced.blocks = FabricBlocks(blocks.block, 3 * blocks.block, blocks.gpus_per_node, blocks.router)
    assert forced.move(src, dst)[0] == blocks.block
    (_, _, got), (_, _, want) = forced(src, dst, 1 << 26), P2PCoster(rs, translate=False)(src, dst, 1 << 26)
    assert list(got) == list(want)  # the same links: the map is right, the capacities are not
    assert any(got[li] != want[li] for li in want if li >= blocks.router.uplink_base)  # the half leaf's uplinks
