"""Pricing a collective or a pipeline transfer as its copy moved back whole nodes and stages inside one leaf of
the fabric (sim/results/costers.leaf_move) gives exactly what pricing it directly gives: the same latency,
bandwidth part, link loads (same links, same order, same floats) and report row. Generated over meshes whose
stages are smaller than a leaf (several stages per leaf, a partial last leaf, tp / pp / cp / ep, every group
kind at every stage, ops, sizes, kernels), with the copy's own link map checked link for link; and the
negative control: the same move across a leaf boundary would price differently, so the one-leaf rule is
needed."""

from __future__ import annotations

import random

import pytest
from test_fabric_blocks import kinds, mesh, random_collective, same

from meshsim.sim.results.costers import CollectiveCoster, P2PCoster, leaf_move, leaf_offsets, moved_loads
from meshsim.sim.schedule.ops import Collective

LAYOUTS = [(64, 8, 8, 1, 1), (48, 4, 4, 1, 1), (40, 8, 5, 1, 1), (64, 4, 8, 2, 1), (64, 8, 8, 1, 4),
           (20, 8, 5, 1, 1)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "nodes{}-tp{}-pp{}-cp{}-ep{}".format(*t))
def test_leaf_moved_pricing_equals_direct_pricing(layout):
    nodes, tp, pp, cp, ep = layout
    rs = mesh(nodes, tp, pp, cp, ep, "mixtral-8x7b-h100-ep8" if ep > 1 else "llama2-70b-h100-tp8")
    rng = random.Random(sum(v * 37 ** i for i, v in enumerate(layout)))
    memo, direct = CollectiveCoster(rs), CollectiveCoster(rs, translate=False)
    moved = 0
    for stage in range(pp):
        for kind in kinds(rs):
            group = rs.group(kind, stage * rs.stage_size + rng.randrange(rs.stage_size))
            if len(group) < 2:
                continue
            work = random_collective(rng, kind)
            moved += memo._move(kind, group) is not None
            same(memo.cost(work, group), direct.cost(work, group))
    if rs.stage_size % 8 == 0 and 32 * 8 // rs.stage_size >= 2 and pp >= 2:
        assert moved  # later stages of a leaf were priced as copies


@pytest.mark.parametrize("layout", LAYOUTS[:4], ids=lambda t: "nodes{}-tp{}-pp{}-cp{}-ep{}".format(*t))
def test_leaf_moved_transfers_equal_direct_ones(layout):
    nodes, tp, pp, cp, ep = layout
    rs = mesh(nodes, tp, pp, cp, ep)
    rng = random.Random(sum(layout))
    memo, direct = P2PCoster(rs), P2PCoster(rs, translate=False)
    size, moved = rs.stage_size, 0
    for a in range(pp):
        for b in {(a + 1) % pp, (a - 1) % pp} - {a}:
            pos = rng.randrange(size)
            src, dst = a * size + pos, b * size + pos
            moved += memo.move(src, dst) is not None
            nbytes = rng.choice((4096, 1 << 20, 3 * (1 << 24) + 8))
            (lat_m, bw_m, load_m), (lat_d, bw_d, load_d) = memo(src, dst, nbytes), direct(src, dst, nbytes)
            assert (lat_m, bw_m) == (lat_d, bw_d) and list(load_m.items()) == list(load_d.items())
    if 32 * 8 // size >= 3:
        assert moved  # three stages or more per leaf: later neighbours priced as copies


def test_the_leaf_link_map_follows_the_fabric_layout():
    rs = mesh(64, 8, 8)
    topo, router = rs.topology, rs.topology.router
    shift = rs.stage_size
    assert leaf_move(topo, [rs.group("dp", shift)], rs.stage_size) == shift
    for src, dst in ((0, 9), (3, 70), (1, 100), (5, 60), (0, 127), (17, 40)):
        a_links, b_links = topo.route(src, dst), topo.route(src + shift, dst + shift)
        moved = moved_loads(router, dict.fromkeys(a_links, 1.0), leaf_offsets(router, shift))
        assert list(moved) == list(b_links)
        for a, b in zip(a_links, b_links, strict=True):
            la, lb = topo.links[a], topo.links[b]
            assert (la.bw_gbps, la.latency_us, la.kind) == (lb.bw_gbps, lb.latency_us, lb.kind)


def test_a_move_across_a_leaf_is_refused_and_would_price_differently():
    """Negative control: 40 nodes = a leaf of 32 and a leaf of 8 (uplinks a quarter as wide); pp 5 gives stages
    of 8 nodes, stage 4 the whole second leaf. Its DP groups (two ranks per node, on two rails: all-to-all
    crosses rails through the spine) are not copies of stage 0's, so no move is made; forced through, the
    move would give other link loads (other uplinks, of other capacities)."""
    rs = mesh(40, 4, 5)
    topo, router = rs.topology, rs.topology.router
    group = rs.group("dp", 4 * rs.stage_size)
    memo = CollectiveCoster(rs)
    assert memo._move("dp", group) is None
    assert leaf_move(topo, [group, *memo._concurrent("dp", group)], rs.stage_size) == 0
    shift = 4 * rs.stage_size
    work = Collective("all_to_all", "dp", 1 << 28)
    (lat_m, bw_m, load_m), _ = memo.cost(work, tuple(r - shift for r in group))
    (lat_d, bw_d, load_d), _ = CollectiveCoster(rs, translate=False).cost(work, group)
    forced = moved_loads(router, load_m, leaf_offsets(router, shift))
    assert forced != load_d
    assert sorted(v for li, v in load_m.items() if li >= router.uplink_base) != \
        sorted(v for li, v in load_d.items() if li >= router.uplink_base)  # the narrower uplinks load more
