"""The malformed-input corpus: every bad input, in every command, is one line on stderr, exit status 2 and
no traceback. Inputs that used to run unbounded (huge counts, alias bombs, deep nesting, tiny step
factors) run in a subprocess whose generous timeout is the only bound asserted: no measured duration is.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshsim.sim.cli.main import main

TINY = {
    "name": "tiny", "model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1024},
    "topology": {"preset": "dgx-h100"}, "parallel": {"gpus": 2, "tp": 2, "micro_batch": 2, "global_batch": 4},
}
CUSTOM_NODE = """name: two-gpu
gpu: h100-sxm
gpus_per_node: 2
nic_gbitps: 400
devices: [{name: g0, kind: gpu}, {name: g1, kind: gpu}, {name: sw, kind: nvswitch}, {name: nic0, kind: nic}]
links:
  - {src: g0, dst: sw, bw_gbps: 450, latency_us: 0.5, kind: nvlink}
  - {src: g1, dst: sw, bw_gbps: 450, latency_us: 0.5, kind: nvlink}
"""
SUBPROCESS_TIMEOUT_S = 180  # generous: a regression to unbounded work fails here instead of hanging CI


def scenario(tmp_path: Path, name: str = "s.yaml", **sections) -> Path:
    """TINY with sections replaced or merged ({'model': {'layers': True}}), written as YAML."""
    data = yaml.safe_load(yaml.safe_dump(TINY))
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def assert_one_line_exit_2(code: int, err: str, needle: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def run_subprocess(args: list[str], cwd: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "meshsim.sim.cli.main", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    return done.returncode, done.stderr


# ----- files: encoding, non-finite numbers, strict types --------------------------------------------
def _utf16(tmp_path: Path) -> list:
    path = scenario(tmp_path)
    path.write_bytes(path.read_text().encode("utf-16"))
    return ["run", path]


def _latin1(tmp_path: Path) -> list:
    path = tmp_path / "s.yaml"
    path.write_bytes(yaml.safe_dump({**TINY, "description": "caf\u00e9"}, allow_unicode=True).encode("latin-1"))
    return ["run", path]


def _utf16_topology(tmp_path: Path) -> list:
    (tmp_path / "node.yaml").write_bytes(CUSTOM_NODE.encode("utf-16"))
    return ["run", scenario(tmp_path, topology={"file": "node.yaml", "preset": None})]


def _latin1_profile(tmp_path: Path) -> list:
    (tmp_path / "p.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1"))
    return ["run", scenario(tmp_path, hardware={"profile": "p.yaml"})]


def _inf_profile(tmp_path: Path) -> list:
    (tmp_path / "p.yaml").write_text("name: p\ngpu: {peak_tflops: .inf}\n")
    return ["run", scenario(tmp_path, hardware={"profile": "p.yaml"})]


def _yaml(tmp_path: Path, text: str) -> list:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return ["run", path]


def _with_text(field_line: str):
    def build(tmp_path: Path) -> list:
        base = yaml.safe_dump(TINY).replace("  layers: 2\n", f"  {field_line}\n")
        return _yaml(tmp_path, base)
    return build


FILE_CASES = {
    "scenario in UTF-16": (_utf16, "Not UTF-8"),
    "scenario in Latin-1": (_latin1, "Not UTF-8"),
    "topology file in UTF-16": (_utf16_topology, "Not UTF-8"),
    "profile in Latin-1": (_latin1_profile, "Not UTF-8"),
    "profile with .inf": (_inf_profile, "a finite number"),
    "layers: true": (_with_text("layers: true"), "model.layers"),
    "layers: 2.0": (_with_text("layers: 2.0"), "model.layers"),
    "peak_tflops: .inf": (lambda p: ["run", scenario(p, hardware={"peak_tflops": float("inf")})], "finite"),
    "gemm_efficiency: .nan": (lambda p: ["run", scenario(p, hardware={"compute": {"gemm_efficiency": float("nan")}})],
                              "finite"),
    "dp_bucket_mib: .inf": (lambda p: ["run", scenario(p, parallel={"dp_bucket_mib": float("inf")})], "finite"),
    "sp: 1 (not a boolean)": (lambda p: ["run", scenario(p, parallel={"sp": 1})], "parallel.sp"),
    "2-node custom topology without a NIC route": (
        lambda p: (p.joinpath("node.yaml").write_text(CUSTOM_NODE),
                   ["run", scenario(p, topology={"file": "node.yaml", "preset": None, "nodes": 2})])[1],
        "reaches no NIC"),
    "heads a large prime (divisor search)": (
        lambda p: ["run", scenario(p, model={"heads": 16777213, "hidden": 16777213})], "parallel.tp"),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_bad_files_exit_2_with_one_line(case, tmp_path, capsys):
    build, needle = FILE_CASES[case]
    assert_one_line_exit_2(*run_cli(build(tmp_path), capsys), needle)


# ----- outputs: directories and unwritable places, checked before any work --------------------------
def _output_cases(tmp_path: Path) -> dict[str, tuple[list, str]]:
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    under_file = a_file / "out.json"  # its folder is a file: nothing can be written there
    good = scenario(tmp_path)
    results = tmp_path / "r.json"
    results.write_text('{"step_time_s": 1, "tokens_per_s": 1, "tflops_per_gpu": 1, "mfu": 0.5, '
                       '"breakdown_s": {}, "memory_gb": {"total": 1}}')
    return {
        "run --json DIR": (["run", good, "--json", a_dir], "Is a directory"),
        "run --json under a file": (["run", good, "--json", under_file], "Cannot write there"),
        "run --out FILE": (["run", good, "--out", a_file], "not a directory"),
        "sweep --json DIR": (["sweep", good, "--json", a_dir, "--no-progress"], "Is a directory"),
        "sweep --out FILE": (["sweep", good, "--out", a_file, "--no-progress"], "not a directory"),
        "collective --json DIR": (["collective", "--json", a_dir], "Is a directory"),
        "collective --plot DIR": (["collective", "--plot", a_dir], "Is a directory"),
        "topologies --json DIR": (["topologies", "--json", a_dir], "Is a directory"),
        "compare --out FILE": (["compare", results, results, "--out", a_file], "not a directory"),
        "calibrate --out DIR": (["calibrate", "--out", a_dir], "Is a directory"),
        "validate --json DIR": (["validate", "tiny-2gpu", "--json", a_dir], "Is a directory"),
    }


OUTPUT_CASES = ("run --json DIR", "run --json under a file", "run --out FILE", "sweep --json DIR", "sweep --out FILE",
                "collective --json DIR", "collective --plot DIR", "topologies --json DIR", "compare --out FILE",
                "calibrate --out DIR", "validate --json DIR")


@pytest.mark.parametrize("case", OUTPUT_CASES)
def test_bad_output_paths_exit_2_before_any_work(case, tmp_path, capsys, monkeypatch):
    if case.startswith(("calibrate", "validate")):
        pytest.importorskip("torch")
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the output path was checked")

    # import first every module that binds `simulate` by name: one first imported while it is patched
    # would keep the stand-in after the test (monkeypatch restores only the names it set)
    binders = ["meshsim.sim.cli.run", "meshsim.sim.sweep.record"]
    if case.startswith(("calibrate", "validate")):
        binders.append("meshsim.validate.crosscheck.crosscheck")
    for module in binders:
        importlib.import_module(module)
    for target in ("meshsim.sim.results.simulate.simulate", "meshsim.sim.cli.run.simulate",
                   "meshsim.sim.sweep.record.simulate"):
        monkeypatch.setattr(target, no_work)
    args, needle = _output_cases(tmp_path)[case]
    assert_one_line_exit_2(*run_cli(args, capsys), needle)


# ----- command-line values ----------------------------------------------------------------------
def _compare_inputs(tmp_path: Path) -> dict[str, Path]:
    files = {"list": "[1, 2]", "strings": '{"step_time_s": "fast", "breakdown_s": {}, "memory_gb": {}}',
             "nested": "[" * 100_000 + "]" * 100_000, "inf": '{"step_time_s": Infinity}',
             "huge": '{"step_time_s": 1.0e+308, "tokens_per_s": 1, "tflops_per_gpu": 1, "mfu": 0.5}',
             "tiny overflow": '{"step_time_s": 1e999}', "digits": '{"step_time_s": 1' + "0" * 5000 + "}",
             "shallow nesting": '{"step_time_s": ' + "[" * 40 + "]" * 40 + "}"}
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(text)
    paths["utf16"] = tmp_path / "utf16.json"
    paths["utf16"].write_bytes('{"step_time_s": 1}'.encode("utf-16"))
    return paths


CLI_CASES = {
    "sweep --tp superscript two": (lambda p: ["sweep", scenario(p), "--tp", "\u00b2"], "--tp"),
    "sweep --tp 40-digit number": (lambda p: ["sweep", scenario(p), "--tp", "9" * 40], "--tp"),
    "sweep with too many points": (lambda p: ["sweep", scenario(p), "--tp", ",".join(map(str, range(1, 41))),
                                              "--micro-batch", ",".join(map(str, range(1, 41)))], "configurations"),
    "collective --step-factor inf": (lambda p: ["collective", "--step-factor", "inf"], "--step-factor"),
    "collective --step-factor nan": (lambda p: ["collective", "--step-factor", "nan"], "--step-factor"),
    "collective --max-bytes 400 digits": (lambda p: ["collective", "--max-bytes", "9" * 400], "--max-bytes"),
    "run --explicit-ranks on 64 x 8 GPUs": (
        lambda p: ["run", scenario(p, model={"heads": 64, "hidden": 4096}, topology={"nodes": 64},
                                   parallel={"gpus": None, "tp": 64, "global_batch": 16}), "--explicit-ranks"],
        "--explicit-ranks"),
    "validate --tolerance nan": (lambda p: ["validate", "tiny-2gpu", "--tolerance", "nan"], "--tolerance"),
}
COMPARE_CASES = {"list": "Expected a JSON object", "strings": "step_time_s = 'fast' is not a number from 0 to",
                 "nested": "Nested more than", "inf": "Infinity is not a number", "utf16": "Not UTF-8",
                 "huge": "step_time_s = 1e+308 is not a number from 0 to 1e+09 s", "tiny overflow": "not a finite",
                 "digits": "5,001 digits", "shallow nesting": "Nested more than 32"}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_command_line_values_exit_2(case, tmp_path, capsys):
    if case.startswith("validate"):
        pytest.importorskip("torch")
    build, needle = CLI_CASES[case]
    assert_one_line_exit_2(*run_cli(build(tmp_path), capsys), needle)


@pytest.mark.parametrize("case", list(COMPARE_CASES))
def test_malformed_compare_inputs_exit_2(case, tmp_path, capsys):
    bad = _compare_inputs(tmp_path)[case]
    assert_one_line_exit_2(*run_cli(["compare", bad, bad], capsys), COMPARE_CASES[case])


# ----- inputs that used to run unbounded: a subprocess, bounded only by its generous timeout ----------
def _alias_bomb(tmp_path: Path) -> list:
    """~1 KB of YAML whose last alias stands for 10^9 values."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return _yaml(tmp_path, "\n".join(levels) + "\n" + yaml.safe_dump(TINY) + "extra: *a8\n")


def _big_node(tmp_path: Path, gpus: int = 1300) -> list:
    """A scenario on one custom node of `gpus` GPUs (RecursionError in the ring search before issue 21)."""
    devices = [{"name": f"g{i}", "kind": "gpu"} for i in range(gpus)] + [{"name": "sw", "kind": "nvswitch"}]
    links = [{"src": f"g{i}", "dst": "sw", "bw_gbps": 450, "latency_us": 0.5, "kind": "nvlink"} for i in range(gpus)]
    (tmp_path / "big.yaml").write_text(yaml.safe_dump({"name": "big", "gpu": "h100-sxm", "gpus_per_node": gpus,
                                                       "devices": devices, "links": links}))
    return ["run", scenario(tmp_path, topology={"file": "big.yaml", "preset": None},
                            parallel={"gpus": None, "tp": 1, "global_batch": gpus}), "--outputs", "none"]


UNBOUNDED_CASES = {
    "custom node of 1,300 GPUs": (_big_node, "GPUs per node simulated is 1,300"),
    "pipeline of 100 stages x 1,000 micro-batches": (
        lambda p: ["run", scenario(p, model={"layers": 100}, topology={"nodes": 13},
                                   parallel={"gpus": 100, "tp": 1, "pp": 100, "micro_batch": 1, "global_batch": 1000}),
                   "--outputs", "none"], "ops simulated"),
    "all-to-all over 128 nodes": (lambda p: ["collective", "--op", "all_to_all", "--nodes", "128"], "all-to-all"),
    "layers: 1000000": (lambda p: ["run", scenario(p, model={"layers": 1_000_000})], "model.layers"),
    "global_batch: 1000000000": (lambda p: ["run", scenario(p, parallel={"global_batch": 1_000_000_000})],
                                 "parallel.global_batch"),
    "topology.nodes: 125000": (lambda p: ["run", scenario(p, topology={"nodes": 125_000})], "topology.nodes"),
    "collective --nodes 100000": (lambda p: ["collective", "--nodes", "100000"], "topology.nodes"),
    "collective --step-factor 1.000001": (lambda p: ["collective", "--step-factor", "1.000001"], "rows"),
    "YAML alias bomb": (_alias_bomb, "values"),
    "100k-deep nesting": (lambda p: _yaml(p, "name: " + "[" * 100_000 + "]" * 100_000 + "\n"), "nest"),
}


@pytest.mark.parametrize("case", list(UNBOUNDED_CASES))
def test_formerly_unbounded_inputs_are_refused(case, tmp_path):
    build, needle = UNBOUNDED_CASES[case]
    assert_one_line_exit_2(*run_subprocess(build(tmp_path), tmp_path), needle)


# ----- the scenario name is a label -------------------------------------------------------------
@pytest.mark.parametrize("name, folder", [("../../escaped", "escaped"), ("/abs/dir", "abs-dir"),
                                          ("..", "scenario"), ("a b/c", "a-b-c")])
def test_scenario_name_never_leaves_meshsim_out(name, folder, tmp_path, monkeypatch, capsys):
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    path = scenario(tmp_path, name=f"{folder}.yaml")
    path.write_text(path.read_text().replace("name: tiny", f"name: {json.dumps(name)}"))
    assert main(["run", str(path), "--no-html"]) == 0
    out = work / "meshsim-out" / folder
    assert (out / "results.json").is_file()
    written = {p for p in tmp_path.rglob("*.json")}
    assert written == {out / "results.json", out / "trace.json"}


# ----- numbers at the edges: every numeric field has one plausible range (sim/core/quantities.py) ------
EDGE_NUMBERS = ("1.0e+308", "5.0e-324", "-1.0", "1" + "0" * 1200)
EDGE_FIELDS = {  # field as the message names it -> how to put the raw value in the scenario
    "hardware.peak_tflops": lambda v: {"hardware": f"{{peak_tflops: {v}}}"},
    "hardware.mem_bw_gbps": lambda v: {"hardware": f"{{mem_bw_gbps: {v}}}"},
    "hardware.compute.gemm_efficiency": lambda v: {"hardware": f"{{compute: {{gemm_efficiency: {v}}}}}"},
    "hardware.compute.launch_overhead_us": lambda v: {"hardware": f"{{compute: {{launch_overhead_us: {v}}}}}"},
    "topology.nvlink_gbps": lambda v: {"topology": f"{{preset: dgx-h100, nvlink_gbps: {v}}}"},
    "topology.fabric.nic_gbitps": lambda v: {"topology": f"{{preset: dgx-h100, fabric: {{nic_gbitps: {v}}}}}"},
    "optimizer.pcie_gbps": lambda v: {"optimizer": f"{{precision_aware: true, cpu_offload: true, pcie_gbps: {v}}}"},
    "optimizer.host_mem_gbps": lambda v: {"optimizer": f"{{precision_aware: true, cpu_offload: true, "
                                                        f"host_mem_gbps: {v}}}"},
    "links[0].bw_gbps": "topology", "gemm_table[0].tflops": "profile",
}


def _schema_models():
    """Every pydantic model reachable from the user's three file schemas: scenario, profile, topology."""
    from pydantic import BaseModel

    from meshsim.scenarios.profile import HardwareProfile
    from meshsim.scenarios.schema import Scenario
    from meshsim.topologies.custom import CustomTopology

    seen, todo = set(), [Scenario, HardwareProfile, CustomTopology]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for field in model.model_fields.values():
            todo += [t for t in _types_in(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
    return sorted(seen, key=lambda m: m.__name__)


def _types_in(annotation) -> list:
    import typing

    args = typing.get_args(annotation)
    return [annotation] if not args else [t for a in args for t in _types_in(a)]


def test_every_float_field_of_the_input_schemas_has_a_finite_range():
    """The class, not the examples: any float field (a new one too) refuses 1e308 and 5e-324 / accepts
    0 only as a range's lower end, so no accepted value makes a step time infinite."""
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    unbounded = []
    for model in _schema_models():
        for name, field in model.model_fields.items():
            if float not in _types_in(field.annotation):
                continue
            meta = tuple(field.metadata)
            adapter = TypeAdapter(Annotated[(field.annotation, *meta)] if meta else field.annotation)
            for value in (1e308, 5e-324):
                try:
                    adapter.validate_python(value)
                except ValidationError:
                    continue
                if value == 1e308 or not _zero_allowed(adapter):
                    unbounded.append(f"{model.__name__}.{name} accepts {value}")
    assert not unbounded, unbounded


def _zero_allowed(adapter) -> bool:
    """A range starting at 0 (a latency, a fraction) may take 5e-324: it is as harmless as 0."""
    from pydantic import ValidationError

    try:
        adapter.validate_python(0.0)
    except ValidationError:
        return False
    return True


def _edge_case(tmp_path: Path, field: str, value: str) -> list:
    how = EDGE_FIELDS[field]
    data = yaml.safe_load(yaml.safe_dump(TINY))
    if how == "topology":
        (tmp_path / "node.yaml").write_text(CUSTOM_NODE.replace("bw_gbps: 450, latency_us: 0.5",
                                                                f"bw_gbps: {value}, latency_us: 0.5", 1))
        data["topology"] = {"file": "node.yaml"}
    elif how == "profile":
        (tmp_path / "p.yaml").write_text(f"name: p\ngemm_table: [{{m: 8, n: 8, k: 8, tflops: {value}}}]\n")
        data["hardware"] = {"profile": "p.yaml"}
    text = yaml.safe_dump(data)
    if callable(how):
        ((section, raw),) = how("@@").items()
        data[section] = "@@"
        text = yaml.safe_dump(data).replace("'@@'", raw.replace("@@", value))
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return ["run", path, "--outputs", "none"]


@pytest.mark.parametrize("value", EDGE_NUMBERS)
@pytest.mark.parametrize("field", list(EDGE_FIELDS))
def test_numbers_at_the_edges_are_one_line_naming_the_field(field, value, tmp_path, capsys):
    args = _edge_case(tmp_path, field, value)
    if (field, value) == ("hardware.compute.launch_overhead_us", "5.0e-324"):  # in range: a zero latency
        assert run_cli([*args[:2], "--outputs", "results", "--out", tmp_path / "o"], capsys)[0] == 0
        assert "Infinity" not in (tmp_path / "o" / "results.json").read_text()
        return
    code, err = run_cli(args, capsys)
    needle = "digits" if len(value) > 100 else field
    assert_one_line_exit_2(code, err, needle)
    if needle == field:
        assert "a number from" in err, err


@pytest.mark.parametrize("writer", ["trace", "merged-trace"])
@pytest.mark.parametrize("field", ["flops", "end_s"])
def test_trace_writers_never_write_non_finite_numbers(writer, field, tmp_path):
    """A non-finite number reaching a trace writer (a bug upstream) is one CommandFailed line and no file,
    never a trace.json holding Infinity / NaN that a reader cannot parse."""
    from meshsim.sim.core.errors import CommandFailed
    from meshsim.sim.engine.events import Event
    from meshsim.sim.outputs.trace import write_trace

    values = {"flops": 1e9, "end_s": 1e-3, field: float("inf") if field == "flops" else float("nan")}
    ev = Event(0, 0, "L0.fwd.qkv", "compute", "compute", "fwd", 0, 0, 0.0, values["end_s"], flops=values["flops"])
    good = Event(0, 0, "L0.fwd.qkv", "compute", "compute", "fwd", 0, 0, 0.0, 1e-3, flops=1e9)
    path = tmp_path / "trace.json"
    if writer == "trace":
        write_trace(path, [good])
        json.loads(path.read_text())  # the negative control: a finite trace is written and parses
        path.unlink()
        with pytest.raises((CommandFailed, ValueError)):
            write_trace(path, [ev])
    else:
        from meshsim.validate.timing.trace_merge import write_merged_trace  # validate extra

        with pytest.raises((CommandFailed, ValueError)):
            write_merged_trace(path, [ev], (), [good], ())
    assert not path.exists() or "Infinity" not in path.read_text() and "NaN" not in path.read_text()
