"""Topologies: presets, fabric, routing (structural vs search), custom YAML errors, the CLI."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from meshsim.sim.cli.topologies import register
from meshsim.sim.core.errors import UserError
from meshsim.topologies import fabric, presets
from meshsim.topologies.model import Topology
from meshsim.topologies.registry import PRESETS, build_topology, load_topology_file

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "custom-topology.yaml"

# Spec figures from the brief / shared/reference/hardware-facts.md:
# preset -> (GPUs per node, NVLink GB/s per GPU per direction, NICs per node, NIC Gb/s, in-switch reduction)
SPEC = {
    "dgx1-v100": (8, 150.0, 4, 100.0, False),
    "dgx2-v100": (16, 150.0, 8, 100.0, False),
    "dgx-a100": (8, 300.0, 8, 200.0, False),
    "dgx-h100": (8, 450.0, 8, 400.0, True),
    "dgx-h200": (8, 450.0, 8, 400.0, True),
    "dgx-b200": (8, 900.0, 8, 400.0, True),
    "gb200-nvl72": (72, 900.0, 72, 400.0, True),
    "dgx-b300": (8, 900.0, 8, 800.0, True),  # ConnectX-8 800G (topologies/gpus.py)
    "gb300-nvl72": (72, 900.0, 72, 800.0, True),
    "pcie-8gpu": (8, 0.0, 2, 200.0, False),
}


def kinds(topo, path):
    return [topo.device_by_name[topo.links[i].dst].kind for i in path]


def nvlink_out_gbps(topo, gpu):
    return sum(topo.links[i].bw_gbps for i in topo.out_links[gpu] if topo.links[i].kind == "nvlink")


def test_spec_covers_every_preset():
    assert set(SPEC) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(SPEC))
def test_preset_figures(name):
    gpus, nvlink, nics, nic_gbitps, nvls = SPEC[name]
    topo = build_topology(name)
    assert topo.num_gpus == gpus and topo.gpus_per_node == gpus and topo.gpu == PRESETS[name].gpu
    assert topo.nvlink_gbps_per_gpu == nvlink
    for gpu in topo.gpu_names:
        assert nvlink_out_gbps(topo, gpu) == pytest.approx(nvlink)
    assert sum(d.kind == "nic" for d in topo.devices) == nics and topo.nic_gbitps == nic_gbitps
    assert topo.nic_gbps_per_gpu == pytest.approx(nics * nic_gbitps / 8 / gpus)
    assert any(d.in_network_reduction for d in topo.devices) is nvls
    for a in range(gpus):  # every pair routable
        for b in range(gpus):
            assert (len(topo.route(a, b)) == 0) == (a == b)


@pytest.mark.parametrize("name", ["dgx2-v100", "dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72", "dgx-b300",
                                  "gb300-nvl72"])
def test_nvswitch_route_is_two_links(name):
    topo = build_topology(name)
    last = topo.num_gpus - 1
    assert kinds(topo, topo.route(0, last)) == ["nvswitch", "gpu"]
    assert topo.path_latency_us(0, last) == pytest.approx(2 * presets.NVSWITCH_HOP_US)
    assert topo.path_bw_gbps(0, last) == SPEC[name][1]


def test_dgx1_cube_mesh():
    topo = build_topology("dgx1-v100")
    units = Counter()
    for link in topo.links:
        if link.kind == "nvlink":
            units[link.src] += link.bw_gbps / 25.0  # one NVLink2 link = 25 GB/s per direction
    assert set(units.values()) == {6.0}
    assert not any(d.kind == "nvswitch" for d in topo.devices)
    pairs = {(lk.src, lk.dst) for lk in topo.links if lk.kind == "nvlink"}
    for quad in (range(4), range(4, 8)):  # two fully connected quads
        for a in quad:
            for b in quad:
                assert a == b or (f"n0.gpu{a}", f"n0.gpu{b}") in pairs
    for a in range(4):  # cross links i <-> i+4 and no other cross-quad link
        assert (f"n0.gpu{a}", f"n0.gpu{a + 4}") in pairs
        assert all((f"n0.gpu{a}", f"n0.gpu{b}") not in pairs for b in range(4, 8) if b != a + 4)
    # non-neighbours: two NVLink hops through an intermediate GPU, never PCIe
    route = topo.route(0, 5)
    assert [topo.links[i].kind for i in route] == ["nvlink", "nvlink"]
    assert kinds(topo, route) == ["gpu", "gpu"]
    assert topo.path_latency_us(0, 5) == pytest.approx(2 * presets.NVLINK_DIRECT_US)


def test_pcie_box_routes():
    topo = build_topology("pcie-8gpu")
    assert kinds(topo, topo.route(0, 3)) == ["pcie_switch", "gpu"]
    assert kinds(topo, topo.route(0, 4)) == ["pcie_switch", "cpu", "pcie_switch", "gpu"]
    assert topo.path_latency_us(0, 4) == pytest.approx(4 * presets.PCIE_HOP_US)
    assert topo.path_bw_gbps(0, 4) == presets.PCIE_GEN4_GBPS


def test_cross_node_routes_and_latency():
    sw_us = 0.7
    topo = build_topology("dgx-h100", 40, switch_latency_us=sw_us)  # 2 leaves per rail (32 + 8 nodes)
    same_leaf = topo.route(3, 8 + 3)
    assert kinds(topo, same_leaf) == ["nic", "ib_switch", "nic", "gpu"]
    expected = 2 * presets.NIC_HOP_US + sw_us + 2 * fabric.IB_WIRE_US
    assert topo.path_latency_us(3, 11) == pytest.approx(expected)
    assert topo.path_bw_gbps(3, 11) == 50.0  # 400 Gb/s / 8
    far = topo.route(3, 33 * 8 + 3)  # node 33 is on the second leaf of rail 3
    assert kinds(topo, far) == ["nic", "ib_switch", "ib_switch", "ib_switch", "nic", "gpu"]
    assert [topo.links[i].dst for i in far][1:4] == ["leaf.r3.0", "spine", "leaf.r3.1"]
    cross_rail = topo.route(3, 8 + 5)  # GPU 3 -> GPU 5 of the next node: its own NIC, up via the spine
    assert [topo.links[i].dst for i in cross_rail] == ["n0.nic3", "leaf.r3.0", "spine", "leaf.r5.0",
                                                       "n1.nic5", "n1.gpu5"]
    assert kinds(topo, topo.route(8, 15)) == ["nvswitch", "gpu"]


def test_dgx1_fabric_shares_nics():
    topo = build_topology("dgx1-v100", 2)
    assert sum(d.kind == "nic" for d in topo.devices) == 8
    for local in (0, 1):  # GPUs 0 and 1 share NIC 0 behind PCIe switch 0
        assert [topo.links[i].dst for i in topo.route(local, 8 + local)][:3] == ["n0.pcie0", "n0.nic0", "leaf.r0.0"]


@pytest.mark.parametrize("oversub", [1.0, 2.0, 3.0])
def test_leaf_uplink_honours_oversubscription(oversub):
    topo = build_topology("dgx-h100", 40, oversubscription=oversub)
    up = {lk.src: lk.bw_gbps for lk in topo.links if lk.dst == "spine"}
    down = {lk.dst: lk.bw_gbps for lk in topo.links if lk.src == "spine"}
    assert len(up) == 8 * 2  # 8 rails x ceil(40 / 32) leaves
    nic_gbps = 400 / 8
    for r in range(8):
        assert up[f"leaf.r{r}.0"] == pytest.approx(32 * nic_gbps / oversub) == down[f"leaf.r{r}.0"]
        assert up[f"leaf.r{r}.1"] == pytest.approx(8 * nic_gbps / oversub)
    nic_links = [lk for lk in topo.links if lk.kind == "ib" and "nic" in lk.src]
    assert len(nic_links) == 40 * 8 and {lk.bw_gbps for lk in nic_links} == {nic_gbps}


@pytest.mark.parametrize(("name", "nodes"), [("dgx-h100", 5), ("dgx2-v100", 5), ("gb200-nvl72", 3)])
def test_structural_router_matches_search(name, nodes):
    node = PRESETS[name].builder()
    topo = fabric.multiply(node, nodes, nic_gbitps=400, nodes_per_leaf=2)  # several leaves per rail
    n = topo.num_gpus
    sources = sorted({0, 1, node.gpus_per_node - 1, n - 1, *random.Random(1).sample(range(n), 6)})
    for a in sources:
        paths = topo.paths_from(topo.gpu_names[a])  # one search per source, all destinations
        for b in range(n):
            assert topo.route(a, b) == paths.get(topo.gpu_names[b], ()), (a, b)
    assert topo.route(1, n - 2) == topo.bfs_route(1, n - 2)


def test_big_fabric_routes_without_searching(monkeypatch):
    """1,024 GPUs: building and routing a ring plus 8,192 random pairs runs no graph search beyond the
    one-node template's (routes are closed-form). Counted, not timed: CI machines are shared."""
    searches: list[str] = []
    original = Topology._bfs_parents

    def counted(self, src, with_labels=False):
        searches.append(f"{self.name}:{src}")
        return original(self, src, with_labels)

    monkeypatch.setattr(Topology, "_bfs_parents", counted)
    topo = build_topology("dgx-h100", 128, switch_latency_us=0.51)  # fresh build (not memoized elsewhere)
    n = topo.num_gpus
    rng = random.Random(0)
    pairs = [(r, (r + 1) % n) for r in range(n)] + [(rng.randrange(n), rng.randrange(n)) for _ in range(8192)]
    for a, b in pairs:
        topo.route(a, b)
    assert n == 1024 and all(not s.startswith(topo.name) for s in searches)
    assert len(searches) <= 2 * len(topo.devices) // 128  # template searches: at most a few per node device


def test_custom_node_of_5000_gpus_scales_with_its_switches(tmp_path, monkeypatch):
    """5,000 GPUs on one switch (quadratic before: a search per GPU for connectivity and per source for
    routes): loading, checking and routing a ring take one search per non-GPU device."""
    gpus = 5000
    devices = [{"name": f"g{i}", "kind": "gpu"} for i in range(gpus)] + [{"name": "sw", "kind": "nvswitch"}]
    links = [{"src": f"g{i}", "dst": "sw", "bw_gbps": 450, "latency_us": 0.5, "kind": "nvlink"} for i in range(gpus)]
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"name": "big", "gpu": "h100-sxm", "gpus_per_node": gpus, "devices": devices,
                                    "links": links}))
    searches: list[str] = []
    original = Topology._bfs_parents

    def counted(self, src, with_labels=False):
        searches.append(src)
        return original(self, src, with_labels)

    monkeypatch.setattr(Topology, "_bfs_parents", counted)
    topo = load_topology_file(str(path))
    for r in range(gpus):
        assert len(topo.route(r, (r + 1) % gpus)) == 2
    assert searches == ["sw"]


def test_registry_memoizes_and_validates():
    assert build_topology("dgx-a100", 4) is build_topology("dgx-a100", nodes=4)
    assert build_topology("dgx-a100", 4) is not build_topology("dgx-a100", 4, oversubscription=2.0)
    with pytest.raises(UserError) as err:
        build_topology("dgx-h10", source="s.yaml")
    assert err.value.field == "topology.preset" and "dgx-h100" in err.value.fix and err.value.source == "s.yaml"
    for kwargs, field in (({"nodes": 0}, "topology.nodes"), ({"oversubscription": 0.5}, "topology.fabric.oversubscription"),
                          ({"nic_gbitps": -1.0}, "topology.fabric.nic_gbitps"), ({"nvlink_gbps": 0.0}, "topology.nvlink_gbps")):
        with pytest.raises(UserError) as err:
            build_topology("dgx-h100", **{"nodes": 2, **kwargs})
        assert err.value.field == field


def test_nvlink_and_nic_overrides():
    topo = build_topology("dgx-h100", 2, nvlink_gbps=900.0, nic_gbitps=800.0)
    assert topo.path_bw_gbps(0, 1) == 900.0 and topo.nvlink_gbps_per_gpu == 900.0
    # 800 Gb/s = 100 GB/s on the wire, but the GPU's PCIe Gen5 x16 link to its NIC caps the route
    assert topo.path_bw_gbps(0, 8) == min(100.0, presets.PCIE_GEN5_GBPS)
    assert build_topology("dgx-h100", 2, nic_gbitps=200.0).path_bw_gbps(0, 8) == 25.0
    dgx1 = build_topology("dgx1-v100", nvlink_gbps=300.0)  # doubles every cube-mesh link
    assert {nvlink_out_gbps(dgx1, g) for g in dgx1.gpu_names} == {300.0}
    assert dgx1.path_bw_gbps(0, 3) == 100.0  # a double link: 2 x 25 x 2
    with pytest.raises(UserError) as err:
        build_topology("pcie-8gpu", nvlink_gbps=100.0)
    assert err.value.field == "topology.nvlink_gbps"


# ----- custom YAML -------------------------------------------------------------------------------------
def test_example_custom_topology():
    topo = load_topology_file(str(EXAMPLE))
    assert topo.num_gpus == 4 and topo.gpu == "a100-80gb"
    assert [topo.links[i].kind for i in topo.route(0, 1)] == ["nvlink"]
    assert kinds(topo, topo.route(0, 2)) == ["pcie_switch", "gpu"]
    assert topo.path_bw_gbps(0, 1) == 100.0 and topo.path_bw_gbps(1, 3) == 32.0
    multi = load_topology_file(str(EXAMPLE), nodes=3)
    assert multi.num_gpus == 12
    assert kinds(multi, multi.route(0, 4)) == ["pcie_switch", "nic", "ib_switch", "nic", "pcie_switch", "gpu"]
    assert multi.path_bw_gbps(0, 4) == 25.0  # the file's 200 Gb/s NIC


def _write(tmp_path, edit) -> str:
    data = yaml.safe_load(EXAMPLE.read_text())
    edit(data)
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


def _link(i, key, value):
    return lambda d: d["links"][i].__setitem__(key, value)


def _drop_links_to(gpu):
    return lambda d: d.__setitem__("links", [lk for lk in d["links"] if gpu not in (lk["src"], lk["dst"])])


CASES = [  # (edit, field, value, words in the fix)
    (_set("gpus_per_nod", 4), "gpus_per_nod", "gpus_per_nod", "gpus_per_node"),
    (lambda d: d["links"][2].update(bw_gbs=32), "links[2].bw_gbs", "bw_gbs", "bw_gbps"),
    (_link(3, "bw_gbps", -5), "links[3].bw_gbps", -5, "a number from 0.001 to 1e+06 GB/s"),
    (_link(0, "bw_gbps", 0), "links[0].bw_gbps", 0, "a number from 0.001 to 1e+06 GB/s"),
    (_link(1, "dst", "gpu9"), "links[1].dst", "gpu9", "devices"),
    (_link(4, "kind", "nvlnk"), "links[4].kind", "nvlnk", "nvlink"),
    (_set("gpus_per_node", 8), "gpus_per_node", 8, "gpus_per_node: 4"),
    (_set("gpu", "a100-80g"), "gpu", "a100-80g", "a100-80gb"),
    (_drop_links_to("gpu3"), "devices[3]", "gpu3", "add links"),
    (lambda d: d["devices"][5].update(name="gpu0"), "devices[5].name", "gpu0", "unique"),
    (lambda d: (d.pop("nic_gbitps"), d.update(nodes=2)), "nic_gbitps", None, "Gb/s"),
    (lambda d: d.pop("gpu"), "gpu", None, "required"),
]


@pytest.mark.parametrize(("edit", "field", "value", "fix"), CASES)
def test_custom_yaml_errors(tmp_path, edit, field, value, fix):
    path = _write(tmp_path, edit)
    with pytest.raises(UserError) as err:
        load_topology_file(path)
    assert (err.value.field, err.value.value, err.value.source) == (field, value, path)
    assert fix in err.value.fix and field in str(err.value)


def test_custom_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(UserError) as err:
        load_topology_file(str(bad))
    assert err.value.field == "line 2" and err.value.source == str(bad) and "YAML syntax" in err.value.problem
    with pytest.raises(UserError) as err:
        load_topology_file(str(tmp_path / "missing.yaml"))
    assert err.value.field == "topology.file"


# ----- CLI ---------------------------------------------------------------------------------------------
def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    app.callback()(lambda: None)  # keep `topologies` a subcommand
    return app


def test_cli_lists_every_preset(tmp_path):
    out = tmp_path / "presets.json"
    result = CliRunner().invoke(_app(), ["topologies", "--json", str(out)])
    assert result.exit_code == 0, result.output
    for name in PRESETS:
        assert name in result.output
    rows = {r["preset"]: r for r in json.loads(out.read_text())}
    assert set(rows) == set(PRESETS)
    for name, (gpus, nvlink, nics, nic_gbitps, nvls) in SPEC.items():
        row = rows[name]
        assert (row["gpus_per_node"], row["nvlink_gbps_per_gpu"], row["nics_per_node"], row["nic_gbitps"],
                row["in_switch_reduction"]) == (gpus, nvlink, nics, nic_gbitps, nvls)


def test_cli_show():
    result = CliRunner().invoke(_app(), ["topologies", "--show", "dgx-h100", "--nodes", "2"])
    assert result.exit_code == 0, result.output
    assert "gpu 16" in result.output and "nvlink 450" in result.output and "4 links" in result.output
    result = CliRunner().invoke(_app(), ["topologies", "--show", str(EXAMPLE)])
    assert result.exit_code == 0 and "box4-nvbridge" in result.output
    result = CliRunner().invoke(_app(), ["topologies", "--show", "dgx-h10"])
    assert isinstance(result.exception, UserError)


def _recursive_hamiltonian(local, near, budget_steps):
    """The recursive search groups._hamiltonian replaced (main at 6554bd4), kept as its reference."""
    start, n = local[0], len(local)
    path, seen, budget = [start], {start}, [budget_steps]

    def dfs() -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if len(path) == n:
            return start in near[path[-1]]
        for nxt in near[path[-1]]:
            if nxt not in seen:
                path.append(nxt)
                seen.add(nxt)
                if dfs():
                    return True
                path.pop()
                seen.discard(nxt)
        return False

    return tuple(path) if dfs() else None


def test_iterative_ring_search_equals_the_recursive_one_and_takes_any_node_size(monkeypatch):
    import random

    from meshsim.sim.cost.collectives import groups

    rng = random.Random(7)
    for trial in range(400):
        n = rng.randint(1, 9)
        local = tuple(range(n))
        near = {a: [b for b in rng.sample(local, n) if b != a and rng.random() < 0.6] for a in local}
        budget = rng.choice([3, 10, 50, groups._SEARCH_BUDGET])
        monkeypatch.setattr(groups, "_SEARCH_BUDGET", budget)
        assert groups._hamiltonian(local, near) == _recursive_hamiltonian(local, near, budget), (trial, near)
    monkeypatch.setattr(groups, "_SEARCH_BUDGET", 20_000)
    big = tuple(range(3000))  # deeper than Python's recursion limit
    ring = groups._hamiltonian(big, {a: [b for b in (a + 1, a - 1, 0) if 0 <= b < 3000 and b != a] for a in big})
    assert ring == big
