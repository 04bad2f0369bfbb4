"""Inputs that used to end in a traceback, exit 0 or unbounded work (issue 44), each one line on stderr and
exit status 2: a list or mapping as a YAML key (scenario, topology file, profile, top level), a sweep whose
every configuration fails for one input error, `sweep --json /dev/full`, a results file whose settings are
of the wrong type; and `collective`'s 905-size sweep, now a success. (The CP op bound: test_op_bound.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from meshsim.sim.cli.main import main

TINY = {
    "name": "tiny", "model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024},
    "topology": {"preset": "dgx-h100"}, "parallel": {"gpus": 2, "tp": 2, "micro_batch": 2, "global_batch": 4},
}
NODE = """name: two-gpu
gpu: h100-sxm
gpus_per_node: 2
devices: [{name: g0, kind: gpu}, {name: g1, kind: gpu}, {name: sw, kind: nvswitch}]
links:
  - {src: g0, dst: sw, bw_gbps: 450, latency_us: 0.5, kind: nvlink}
  - {src: g1, dst: sw, bw_gbps: 450, latency_us: 0.5, kind: nvlink}
"""


def one_line_exit_2(args: list, capsys, *needles: str) -> str:
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write_scenario(tmp_path: Path, **sections) -> Path:
    data = json.loads(json.dumps(TINY))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ----- 1: a list or a mapping as a YAML key ----------------------------------------------------------
def _scenario_list_key(tmp_path: Path) -> tuple[list, str]:
    (tmp_path / "s.yaml").write_text("name: x\nmodel:\n  ? [a, b]\n  : 1\n")
    return ["run", tmp_path / "s.yaml"], "s.yaml: line 3 = '? [a, b]'"


def _top_level_mapping_key(tmp_path: Path) -> tuple[list, str]:
    (tmp_path / "s.yaml").write_text("? {a: 1}\n: 2\n")
    return ["run", tmp_path / "s.yaml"], "a mapping used as a key"


def _flow_list_key(tmp_path: Path) -> tuple[list, str]:
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TINY) + "run: {[x]: 1}\n")
    return ["run", tmp_path / "s.yaml"], "a list used as a key"


def _topology_file_key(tmp_path: Path) -> tuple[list, str]:
    (tmp_path / "node.yaml").write_text(NODE + "? [a]\n: 1\n")
    return ["run", write_scenario(tmp_path, topology={"file": "node.yaml", "preset": None})], "node.yaml: line"


def _profile_key(tmp_path: Path) -> tuple[list, str]:
    (tmp_path / "p.yaml").write_text("name: p\ngpu:\n  ? {peak: 1}\n  : 2\n")
    return ["run", write_scenario(tmp_path, hardware={"profile": "p.yaml"})], "p.yaml: line 3"


def _profile_flag_key(tmp_path: Path) -> tuple[list, str]:
    (tmp_path / "p.yaml").write_text("name: p\n? [gemm_table]\n: []\n")
    return ["run", write_scenario(tmp_path), "--profile", tmp_path / "p.yaml"], "p.yaml: line 2"


@pytest.mark.parametrize("case", [_scenario_list_key, _top_level_mapping_key, _flow_list_key, _topology_file_key,
                                  _profile_key, _profile_flag_key])
def test_a_list_or_mapping_as_a_yaml_key_is_one_line(case, tmp_path, capsys):
    args, needle = case(tmp_path)
    one_line_exit_2([*args, "--outputs", "none"], capsys, needle, "used as a key")


def test_plain_keys_of_other_types_still_reach_the_schema(tmp_path, capsys):
    """Negative control: a number or null as a key is a plain value, left to the schema's checks."""
    (tmp_path / "s.yaml").write_text("1: 2\nnull: 3\n")
    one_line_exit_2(["run", tmp_path / "s.yaml"], capsys, "name = (missing)")


# ----- 3: a sweep that cannot run anything -----------------------------------------------------------
def test_a_sweep_whose_every_point_fails_the_same_way_stops_with_that_line(tmp_path, capsys):
    """A hardware profile whose gemm_table is a string: run and sweep both name it, exit 2."""
    (tmp_path / "p.yaml").write_text("name: p\ngemm_table: abc\n")
    moe = {"moe": {"experts": 8, "top_k": 2, "ffn_hidden": 256}}
    path = write_scenario(tmp_path, model=moe, hardware={"profile": "p.yaml"}, parallel={"gpus": 8, "tp": 1, "micro_batch": 1, "global_batch": 8})
    one_line_exit_2(["run", path, "--outputs", "none"], capsys, "p.yaml", "gemm_table = 'abc'", "Expected a list")
    one_line_exit_2(["sweep", path, "--ep", "2,4", "--jobs", "1", "--no-progress"], capsys,
                    "all 2 configurations for one reason", "p.yaml: gemm_table = 'abc'", "Expected a list")


def test_a_sweep_in_which_nothing_runs_exits_2_with_every_reason_whole(capsys, monkeypatch):
    """Issue 43: `sweep llama3-8b-h200 --tp 3,5` at 80 columns: each reason printed whole (wrapped, not cut),
    then one error line."""
    monkeypatch.setenv("COLUMNS", "80")
    code = main(["sweep", "llama3-8b-h200", "--tp", "3,5", "--jobs", "1", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == [
        "error: none of the 4 configurations could run: each is skipped for the reason printed above; change "
        "the axes or the scenario"]
    text = " ".join(out.split())
    for tp in (3, 5):
        assert f"and {tp} does not divide it. use tp in {{1, 2, 4, 8}}" in text
    assert "…" not in out and "cut at" not in out


# ----- 4: sweep --json /dev/full ----------------------------------------------------------------------
def test_sweep_json_to_a_device_is_refused_before_any_work(capsys, monkeypatch):
    import meshsim.sim.cli.sweep as sweep_cli

    monkeypatch.setattr(sweep_cli, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    one_line_exit_2(["sweep", "tiny-2gpu", "--tp", "1,2", "--json", "/dev/full", "--no-progress"], capsys,
                    "--json = '/dev/full'", "not a regular file")


def test_sweep_json_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    import meshsim.sim.cli.sweep as sweep_cli

    class Full:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sweep_cli, "open_own_for_writing", lambda path, flag: Full())
    one_line_exit_2(["sweep", "tiny-2gpu", "--tp", "1,2", "--jobs", "1", "--json", tmp_path / "s.json",
                     "--no-progress"], capsys, "No space left on device", "--json")


# ----- 5: compare's results files; collective's size sweep --------------------------------------------
@pytest.fixture(scope="module")
def results_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("results")
    assert main(["run", "tiny-2gpu", "--outputs", "results", "--out", str(out)]) == 0
    return out / "results.json"


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("gpus", "2", "gpus = '2' is not a whole number"), ("tp", [2], "tp = [2] is not a whole number"),
    ("sp", "yes", "sp = 'yes' is not true or false"), ("gpus", -4, "gpus = -4 is not"),
    ("scenario", 5, "scenario = 5 is not a string"), ("recompute_modules", [1], "not a list of names"),
])
def test_compare_checks_the_settings_a_results_file_echoes(key, value, needle, results_file, tmp_path, capsys):
    data = json.loads(results_file.read_text())
    data[key] = value
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps(data))
    one_line_exit_2(["compare", results_file, bad], capsys, "b.json", needle)


def test_compare_still_reads_a_good_results_file(results_file, capsys):
    """Negative control for the checks above."""
    assert main(["compare", str(results_file), str(results_file)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_collective_sweep_of_905_sizes_with_its_plot_succeeds(tmp_path, capsys):
    """Issue 44's 905 sizes (1 B..1 TiB by 1.02816), here on 128 ranks: every size a row, the plot written
    (on 16,384 ranks it ran past 120 s; now 16 s CPU: benchmarks/limits.py sizes-905-plot)."""
    plot = tmp_path / "p.html"
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "16", "--min-bytes", "1", "--max-bytes", "1T",
                 "--step-factor", "1.02816", "--plot", str(plot), "--json", str(tmp_path / "rows.json")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert len(json.loads((tmp_path / "rows.json").read_text())) == 905 and plot.stat().st_size > 0


@pytest.mark.parametrize(("op", "ranks"), [("all_reduce", range(16)), ("all_gather", (0, 1, 2, 8, 9, 10, 17)),
                                           ("reduce_scatter", (3, 11, 19, 27)), ("all_to_all", range(24))])
def test_a_size_sweep_prices_every_size_as_one_cold_call_does(op, ranks):
    """The sweep's shortcuts (the group's split, NVLS tree's applicability and its checks and candidates
    once across sizes, link loads neither copied nor computed) give rows equal to pricing each size alone
    with every memo cleared: groups of whole, partial and uneven nodes, sizes across every protocol
    switch, every algorithm that applies (NVLS tree and hierarchical on the two whole nodes). The load
    memo does not grow with the sizes (NVLS's load factor is per size: it held one map per size)."""
    from meshsim.sim.cost.collectives import cache
    from meshsim.sim.cost.collectives.choose import algorithms_for
    from meshsim.sim.cost.collectives.cost import collective_cost
    from meshsim.sim.cost.collectives.nccl_table import row_of, sweep, sweep_sizes
    from meshsim.topologies.registry import build_topology

    topo = build_topology("dgx-h100", 4)
    sizes = sweep_sizes(1, 1 << 34, 3.1)
    applicable = algorithms_for(topo, op, list(ranks))
    assert ("nvls_tree" in applicable) == (op == "all_reduce")  # the two whole nodes of range(16)
    for algo in ("auto", *applicable):
        cache.clear()
        fast = sweep(topo, op, list(ranks), sizes, algo=algo)
        assert len(cache.table(topo, "load")) == 0, (op, algo)
        cold = []
        for size in sizes:
            cache.clear()
            cold.append(row_of(collective_cost(topo, op, list(ranks), size, algo=algo)))
        assert fast == cold, (op, algo)
