"""Pricing a collective as its translated copy in the fabric's first block (sim/results/fabric_blocks.py,
sim/results/costers.py) gives exactly what pricing it directly gives: the same latency, bandwidth part, link
loads (same links, same order, same floats) and report row. A generated differential test over meshes
(nodes with and without a partial last leaf, tp / cp / pp / ep, every group kind, sizes, kernels), the
closed-form link map, and the negative control: a block under the partial leaf prices differently, so the
guard that keeps it out is needed."""

from __future__ import annotations

import random

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.fabric_blocks import FabricBlocks
from meshsim.sim.schedule.ops import Collective

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def random_collective(rng: random.Random, kind: str) -> Collective:
    """A collective of group kind `kind`: an op it can run, a size across the protocol and chunk edges, and
    userbuffers where TP may use it."""
    op = rng.choice(OPS if kind != "stage" else ("all_reduce",))
    nbytes = rng.choice((64, 4096, 1 << 20, 3 * (1 << 24) + 8, 1 << 30))
    kernel = rng.choice(("nccl", "userbuffers")) if kind == "tp" and op != "all_to_all" else "nccl"
    return Collective(op, kind, nbytes, kernel=kernel)


def mesh(nodes: int, tp: int, pp: int, cp: int = 1, ep: int = 1, scenario: str = "llama2-70b-h100-tp8"):
    sc, source = load_scenario(scenario)
    dp = nodes * 8 // (tp * pp * cp)
    overrides = {"topology.nodes": nodes, "parallel.tp": tp, "parallel.sp": tp > 1, "parallel.pp": pp,
                 "parallel.cp": cp, "parallel.dp": "auto", "parallel.global_batch": dp * pp * 2,
                 "parallel.ep": ep}
    return resolve(with_overrides(sc, overrides, source), source)


def same(a, b):
    (lat_a, bw_a, load_a), row_a = a
    (lat_b, bw_b, load_b), row_b = b
    assert (lat_a, bw_a, row_a) == (lat_b, bw_b, row_b)
    assert list(load_a.items()) == list(load_b.items())


def kinds(rs) -> list[str]:
    out = ["tp", "dp", "stage"]
    if rs.cp > 1:
        out.append("cp")
    if rs.ep > 1:
        out += ["ep", "edp"]
    return out


LAYOUTS = [(64, 8, 2, 1, 1), (64, 4, 4, 2, 1), (72, 8, 1, 1, 1), (72, 2, 4, 1, 1), (96, 8, 4, 1, 1),
           (128, 8, 8, 1, 1), (64, 8, 4, 1, 4), (240, 8, 5, 1, 1)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "nodes{}-tp{}-pp{}-cp{}-ep{}".format(*t))
def test_translated_pricing_equals_direct_pricing(layout):
    """Generated: per layout, each group kind at a random rank and at a random rank of a later block, a
    random op, size and kernel; memo (translated where it may) == direct, exactly."""
    nodes, tp, pp, cp, ep = layout
    scenario = "mixtral-8x7b-h100-ep8" if ep > 1 else "llama2-70b-h100-tp8"
    rs = mesh(nodes, tp, pp, cp, ep, scenario)
    rng = random.Random(sum(v * 31 ** i for i, v in enumerate(layout)))
    memo, direct = CollectiveCoster(rs), CollectiveCoster(rs, translate=False)
    blocks = memo.blocks
    later = [rng.randrange(blocks.block, rs.gpus)] if blocks is not None else []
    translated = 0
    for kind in kinds(rs):
        for rank in [rng.randrange(rs.gpus), *later]:
            group = rs.group(kind, rank)
            if len(group) < 2:
                continue
            work = random_collective(rng, kind)
            translated += bool(blocks is not None and blocks.shift(group))
            same(memo.cost(work, group), direct.cost(work, group))
    if blocks is not None and later[0] < blocks.full:
        assert translated  # the later block's groups were priced as copies


def test_every_stage_of_a_pipeline_prices_like_its_copy_in_the_first_block():
    """The case the memo is for: the same collective on each pipeline stage (128 nodes, pp 8: stages of 128
    ranks, blocks of 256 = a leaf's worth: stages 2, 4 and 6 are copies of stage 0, 3, 5 and 7 of stage 1)."""
    rs = mesh(128, 8, 8)
    memo, direct = CollectiveCoster(rs), CollectiveCoster(rs, translate=False)
    assert memo.blocks is not None and memo.blocks.block == 256
    for stage in range(8):
        for kind, op in (("dp", "reduce_scatter"), ("dp", "all_gather"), ("tp", "all_reduce")):
            work = Collective(op, kind, 1 << 26)
            group = rs.group(kind, stage * rs.stage_size)
            assert bool(memo.blocks.shift(group)) == (stage >= 2)
            same(memo.cost(work, group), direct.cost(work, group))


def test_the_link_map_follows_the_fabric_layout():
    rs = mesh(128, 8, 2)
    blocks = FabricBlocks.of(rs)
    topo, router = rs.topology, rs.topology.router
    shift = blocks.block
    for src, dst in ((0, 9), (3, 260), (1, 300), (5, 130), (0, 255)):
        for a, b in zip(topo.route(src, dst), topo.route(src + shift, dst + shift), strict=True):
            assert blocks.link(a, shift) == b
            la, lb = topo.links[a], topo.links[b]
            assert (la.bw_gbps, la.latency_us, la.kind) == (lb.bw_gbps, lb.latency_us, lb.kind)
    assert router.nodes_per_leaf * 8 == 256


def test_a_block_under_the_partial_last_leaf_is_not_translated_and_would_price_differently():
    """Negative control: 240 nodes = 7 leaves of 32 nodes and one of 16 per rail, whose uplink is half as
    wide; pp 5 gives stages of 48 nodes and blocks of 96. Stage 4 (nodes 192-239) spans leaf 6 and the partial
    leaf 7: the guard keeps it from being priced as its copy in the first block, which would differ."""
    rs = mesh(240, 8, 5)
    blocks = FabricBlocks.of(rs)
    assert blocks is not None and (blocks.block, blocks.full) == (768, 1792)
    group = rs.group("dp", 4 * rs.stage_size)
    assert blocks.shift(group) == 0
    forced = CollectiveCoster(rs)
    forced.blocks = FabricBlocks(blocks.block, 3 * blocks.block, blocks.gpus_per_node, blocks.router)
    assert forced.blocks.shift(group) == 2 * blocks.block
    work = Collective("all_reduce", "dp", 1 << 28)
    (lat_f, bw_f, load_f), _ = forced.cost(work, group)
    (lat_d, bw_d, load_d), _ = CollectiveCoster(rs, translate=False).cost(work, group)
    assert (lat_f, bw_f, load_f) != (lat_d, bw_d, load_d)
