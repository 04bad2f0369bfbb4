"""collective_costs' shortcuts against the long way they replace (cost.py as at 2379e44, kept below as the
reference): per call, the group's shape (channels, nodes) and each algorithm's evaluated plan made once
instead of per (size, pair); the link loads made for the winning pair only; the concurrent groups
normalised with a first-rank test before the set test. Generated over topologies of every kind (NVSwitch
nodes on the IB fabric, DGX-1 mesh, PCIe, NVL72 racks), groups, concurrent groups aimed at the
normalisation's edge (the own group permuted, a superset, a group sharing only its first rank), sizes
with 0 among them, forced and automatic (algorithm, protocol) choices. Every field is compared, and the
link loads item by item in order. Plus the coster's translation shortcuts (sim/results/costers.py): the
link map read once per range equals fabric_blocks.link per link, and the memoized shift equals its
computation on every group of a scenario."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_fabric_blocks import kinds, mesh

from meshsim.sim.core.units import GB
from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.channels import group_channels
from meshsim.sim.cost.collectives.choose import candidates
from meshsim.sim.cost.collectives.cost import (
    CollectiveCost,
    Groups,
    _check_bytes,
    _check_group,
    _normalise_groups,
    bandwidth_scale,
    busbw_factor,
    collective_costs,
    latency_s,
    link_load,
    structure,
)
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, family
from meshsim.sim.results.costers import CollectiveCoster, block_offsets, moved_loads
from meshsim.topologies.registry import build_topology

TOPOLOGIES = {  # (preset, nodes, gpus_per_node)
    "h100x4": ("dgx-h100", 4, None),
    "a100x3": ("dgx-a100", 3, None),
    "dgx1x2": ("dgx1-v100", 2, None),
    "pciex2": ("pcie-8gpu", 2, None),
    "nvl72x2": ("gb200-nvl72", 2, 16),
}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")
CHOICES = (("auto", "auto"), ("ring", "auto"), ("tree", "ll"), ("auto", "simple"), ("nvls", "auto"))


def reference_normalise(ranks, groups):
    mine = set(ranks)
    return tuple(tuple(g) for g in groups if len(g) >= 2 and set(g) != mine)


def reference_priced(topo, op, ranks, nbytes, algo, protocol, concurrent, constants, with_load):
    """priced() as it was: its structure, bandwidth scale and channels looked up per (size, pair)."""
    pc = structure(topo, algo, op, ranks, concurrent, constants)
    scale = bandwidth_scale(topo, pc, op, protocol, nbytes, ranks, constants)
    lat = latency_s(pc, op, protocol, constants, len(ranks), nbytes, group_channels(topo, ranks, constants))
    bw = nbytes * pc.s_per_byte / scale
    time = lat + bw
    algbw = nbytes / time / GB if time > 0 else 0.0
    load = scale if family(algo) == "nvls" else constants.bw_scale(algo, op, protocol) / constants.bw_factor[protocol]
    return CollectiveCost(op, algo, protocol, nbytes, len(ranks), time, lat, bw, algbw,
                          algbw * busbw_factor(op, len(ranks)), link_load(topo, pc, load) if with_load else {})


def reference_costs(topo, op, ranks, sizes, algo, protocol, concurrent_groups, link_loads):
    ranks = tuple(int(r) for r in ranks)
    _check_group(topo, op, ranks)
    for nbytes in sizes:
        _check_bytes(nbytes)
    if len(ranks) < 2:
        return [CollectiveCost(op, "none", "none", n, len(ranks), 0.0, 0.0, 0.0, 0.0, 0.0, {}) for n in sizes]
    pairs = candidates(topo, op, ranks, algo, protocol, None) if any(sizes) else ()
    consts = DEFAULT_CONSTANTS.with_tuning(None)
    concurrent = reference_normalise(ranks, concurrent_groups)
    out = []
    for nbytes in sizes:
        if nbytes == 0:
            out.append(CollectiveCost(op, "none", "none", nbytes, len(ranks), 0.0, 0.0, 0.0, 0.0, 0.0, {}))
            continue
        best = None
        for a, p in pairs:
            cost = reference_priced(topo, op, ranks, nbytes, a, p, concurrent, consts, link_loads)
            if best is None or cost.time_s < best.time_s:
                best = cost
        out.append(replace(best, link_load=dict(best.link_load) if link_loads else {}))
    return out


@st.composite
def calls(draw):
    name = draw(st.sampled_from(sorted(TOPOLOGIES)))
    preset, nodes, per = TOPOLOGIES[name]
    topo = build_topology(preset, nodes, gpus_per_node=per)
    n = topo.num_gpus
    ranks = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10, unique=True))
    others = draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=10, unique=True), max_size=5))
    rng = random.Random(draw(st.integers(0, 1 << 30)))
    edge = [sorted(ranks, key=lambda _: rng.random()),  # the own group permuted: dropped
            [*ranks, next(r for r in range(n) if r not in ranks)] if len(ranks) < n else list(ranks),  # a superset
            [ranks[0], *(r for r in range(n) if r not in ranks)][:len(ranks)]]  # only the first rank shared
    concurrent = [g for g in others + edge if draw(st.booleans())]
    sizes = draw(st.lists(st.sampled_from((0, 1, 512, 65536, 3 << 20, 1 << 28)), min_size=1, max_size=4))
    op = draw(st.sampled_from(OPS))
    algo, protocol = draw(st.sampled_from(CHOICES))
    return topo, op, ranks, sizes, algo, protocol, concurrent, draw(st.booleans())


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # a forced pair that cannot serve the op: both paths must refuse it alike
        return type(exc), str(exc)


@settings(max_examples=150, deadline=None)
@given(calls())
def test_collective_costs_equal_the_per_pair_long_way(call):
    topo, op, ranks, sizes, algo, protocol, concurrent, loads = call
    cache.clear()
    want = _outcome(lambda: reference_costs(topo, op, ranks, sizes, algo, protocol, concurrent, loads))
    cache.clear()
    got = _outcome(lambda: collective_costs(topo, op, ranks, sizes, algo=algo, protocol=protocol,
                                            concurrent_groups=concurrent, link_loads=loads))
    event("refused" if isinstance(want, tuple) else "priced")
    if isinstance(want, tuple):
        assert got == want
        return
    assert got == want  # every field but the link loads (compare=False)
    for g, w in zip(got, want, strict=True):
        assert (g.algo, g.protocol, g.time_s, g.latency_s, g.bandwidth_s) == (w.algo, w.protocol, w.time_s,
                                                                              w.latency_s, w.bandwidth_s)
        assert type(g.link_load) is dict and list(g.link_load.items()) == list(w.link_load.items())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True),
       st.lists(st.lists(st.integers(0, 15), min_size=0, max_size=7), max_size=8), st.randoms())
def test_normalised_groups_equal_the_set_test(ranks, others, rng):
    groups = [*others, sorted(ranks, key=lambda _: rng.random()), [*ranks, ranks[0]], [ranks[0], 99]]
    got = _normalise_groups(ranks, groups)
    assert type(got) is Groups and got == reference_normalise(ranks, groups)
    assert hash(got) == hash(tuple(got))


@pytest.mark.parametrize("layout", [(64, 8, 2), (64, 4, 4), (128, 8, 8), (240, 8, 5)],
                         ids=lambda t: "nodes{}-tp{}-pp{}".format(*t))
def test_coster_translation_shortcuts_equal_their_long_way(layout):
    rs = mesh(*layout)
    coster = CollectiveCoster(rs)
    blocks = coster.blocks
    assert blocks is not None
    links = range(len(rs.topology.links))
    for k in range(1, blocks.full // blocks.block):
        shift = k * blocks.block
        load = {li: li * 0.5 for li in links if blocks.link(li, shift) < len(links)}
        want = {blocks.link(li, shift): v for li, v in load.items()}  # the coster's dict as it was made
        assert list(moved_loads(blocks.router, load, block_offsets(blocks, shift)).items()) == list(want.items())
    for kind in kinds(rs):
        for rank in range(0, rs.gpus, 3):
            group = rs.group(kind, rank)
            if len(group) > 1:
                assert coster._move(kind, group) == coster._move_of(kind, group) == coster._move(kind, group)
