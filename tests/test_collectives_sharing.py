"""Pruning of concurrent copies (sim/cost/collectives/sharing.py) is exact: the footprint really covers a
copy's links, and the priced collective, its link loads and a whole simulated step are identical with the
pruning switched off."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from meshsim.scenarios.library import builtin_scenarios
from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.cost.collectives import cache, collective_cost, sharing
from meshsim.sim.cost.collectives.cost import build_plan
from meshsim.sim.results.simulate import simulate
from meshsim.topologies.registry import build_topology


def _group(first: int, size: int, stride: int) -> tuple[int, ...]:
    return tuple(first + k * stride for k in range(size))


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx1-v100", "pcie-8gpu"])
@pytest.mark.parametrize("algo", sharing.ROUTED_ALGOS)
def test_footprint_covers_every_link_of_a_plan(preset, algo):
    """Soundness: a plan's links lie inside its group's footprint (groups with 1 and 2 ranks per node,
    over several leaves)."""
    topo = build_topology(preset, 70)  # 3 leaves per rail
    for group in (_group(3, 70, 8), _group(0, 140, 4)):
        if algo == "hierarchical" and len(group) == 70:
            continue  # needs >= 2 ranks per node
        if algo == "direct":
            group = group[::10]
        plan = build_plan(topo, algo, "all_reduce", group)
        assert sharing.plan_links(plan) <= sharing.footprint(topo, topo.router, tuple(group))


def test_dp_copies_on_other_rails_are_dropped_and_dp_copies_on_a_shared_nic_kept():
    topo = build_topology("dgx-h100", 64)
    own = _group(0, 64, 8)
    copies = tuple(_group(i, 64, 8) for i in range(1, 8))
    plan = build_plan(topo, "ring", "all_reduce", own)
    assert sharing.sharing_groups(topo, plan, own, copies) == ()
    pcie = build_topology("pcie-8gpu", 16)  # 2 NICs for 8 GPUs: copies on local ranks 1-3 share rail 0
    own, copies = _group(0, 16, 8), tuple(_group(i, 16, 8) for i in range(1, 8))
    kept = sharing.sharing_groups(pcie, build_plan(pcie, "ring", "all_reduce", own), own, copies)
    assert kept and len(kept) < len(copies)


def _priced(monkeypatch, enabled, topo, group, copies, algo):
    monkeypatch.setattr(sharing, "ENABLED", enabled)
    cache.clear()
    return collective_cost(topo, "all_reduce", group, 1 << 28, algo=algo, concurrent_groups=copies)


@pytest.mark.parametrize("preset", ["dgx-h100", "pcie-8gpu"])
@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_pruned_price_equals_the_unpruned_one(monkeypatch, preset, algo):
    topo = build_topology(preset, 96)
    group, copies = _group(0, 96, 8), tuple(_group(i, 96, 8) for i in range(1, 8))
    pruned = _priced(monkeypatch, True, topo, group, copies, algo)
    whole = _priced(monkeypatch, False, topo, group, copies, algo)
    assert dataclasses.replace(pruned, link_load={}) == dataclasses.replace(whole, link_load={})
    own = sharing.footprint(topo, topo.router, tuple(group))
    assert {li: whole.link_load[li] for li in pruned.link_load} == pruned.link_load
    assert own.isdisjoint(set(whole.link_load) - set(pruned.link_load))  # only dropped copies' links go
    cache.clear()


@pytest.mark.parametrize("name,nodes", [("llama2-70b-h100-tp8", 96), ("llama2-70b-h100-pp4", 64),
                                        ("gpt3-175b-a100-16node", 16)])
def test_a_step_is_identical_without_pruning(monkeypatch, name, nodes, tmp_path):
    """Negative control for the arbiter: the link loads it sees lose the dropped copies' links, which
    changes no rate (they only duplicate the kept constraints), so the step is bit-identical."""
    rs = load_and_resolve(str(_with_nodes(name, nodes, tmp_path)))
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(sharing, "ENABLED", enabled)
        cache.clear()
        r = simulate(rs, full=True)
        results.append((r.step_time_s, r.breakdown_s))
    assert results[0] == results[1]
    cache.clear()


def _with_nodes(name, nodes, tmp_path):
    """The library scenario on `nodes` nodes with 4 micro-batches per replica."""
    data = yaml.safe_load(Path(builtin_scenarios()[name]).read_text())
    par = data["parallel"]
    dp = nodes * 8 // (par["tp"] * par.get("pp", 1))
    data["topology"]["nodes"] = nodes
    par["global_batch"] = par.get("micro_batch", 1) * dp * 4
    data.pop("sweep", None)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
