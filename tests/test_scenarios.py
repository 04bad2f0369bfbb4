"""Scenarios: the built-in library, resolution (dp, gpus, micro-batches, GPU figures) and the user errors.

Expected numbers are computed here from the rules (dp = gpus / tp, micro_batches = global_batch /
(micro_batch x dp)) and from the models' public configs, never copied from the implementation.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from meshsim.scenarios import schema
from meshsim.scenarios.checks import check_scenario
from meshsim.scenarios.library import DEFAULT_SCENARIO, builtin_scenarios
from meshsim.scenarios.load import load_and_resolve, load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.topologies.gpus import GPUS

LIBRARY = builtin_scenarios()

# Public architecture figures (layers, hidden, heads, kv_heads, ffn, seq_len, vocab, mlp), per the brief's
# sources: Brown et al. 2020 Table 2.1; the Llama-2-70b / Meta-Llama-3-8B config.json files.
ARCHITECTURES = {
    "gpt3-175b-a100-16node": (96, 12288, 96, 96, 4 * 12288, 2048, 51200, "gelu"),
    "llama2-70b-h100-tp8": (80, 8192, 64, 8, 28672, 4096, 32000, "swiglu"),
    "llama2-70b-h100-1node": (80, 8192, 64, 8, 28672, 4096, 32000, "swiglu"),
    "llama3-8b-h200": (32, 4096, 32, 8, 14336, 8192, 128256, "swiglu"),
    "gpt-13b-a100-1node": (40, 5120, 40, 40, 4 * 5120, 2048, 51200, "gelu"),
    "gpt-13b-a100-2node": (40, 5120, 40, 40, 4 * 5120, 2048, 51200, "gelu"),
    "gpt3-175b-a100-pp8": (96, 12288, 96, 96, 4 * 12288, 2048, 51200, "gelu"),
    "llama2-70b-h100-pp4": (80, 8192, 64, 8, 28672, 4096, 32000, "swiglu"),
}
MACHINES = {  # name -> (topology preset, nodes)
    "gpt3-175b-a100-16node": ("dgx-a100", 16), "llama2-70b-h100-tp8": ("dgx-h100", 8),
    "llama2-70b-h100-1node": ("dgx-h100", 1), "llama3-8b-h200": ("dgx-h200", 1),
    "gpt-13b-a100-1node": ("dgx-a100", 1), "gpt-13b-a100-2node": ("dgx-a100", 2), "tiny-2gpu": ("dgx-h100", 1),
    "gpt3-175b-a100-pp8": ("dgx-a100", 16), "llama2-70b-h100-pp4": ("dgx-h100", 8),
}

TINY = yaml.safe_load(LIBRARY["tiny-2gpu"].read_text())


def write(tmp_path: Path, data: dict | str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def tiny(**sections: dict) -> dict:
    """The tiny scenario with some section fields replaced (None removes a field)."""
    data = copy.deepcopy(TINY)
    for section, fields in sections.items():
        if not isinstance(fields, dict):
            data[section] = fields
            continue
        target = data.setdefault(section, {})
        for key, value in fields.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return data


# ----- the library ---------------------------------------------------------------------------------
def test_library_contents():
    assert set(MACHINES) <= set(LIBRARY)
    assert DEFAULT_SCENARIO == "llama2-70b-h100-tp8"
    assert DEFAULT_SCENARIO in LIBRARY


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_every_library_scenario_loads_and_resolves(name):
    text = LIBRARY[name].read_text()
    assert text.startswith("#"), "each library scenario starts with a comment header citing its sources"
    scenario, source = load_scenario(name)
    assert scenario.name == name == LIBRARY[name].stem
    assert source == f"builtin:{name}"
    r = resolve(scenario, source)
    p = scenario.parallel
    assert r.tp * r.cp * r.pp * r.dp == r.gpus <= r.topology.num_gpus
    assert r.micro_batches * p.micro_batch * r.dp == p.global_batch
    if name in MACHINES:
        preset, nodes = MACHINES[name]
        assert (scenario.topology.preset, scenario.topology.nodes) == (preset, nodes)
        assert r.topology.num_gpus == 8 * nodes


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_library_architectures_match_public_configs(name):
    m, _ = load_scenario(name)
    m = m.model
    assert (m.layers, m.hidden, m.heads, m.num_kv_heads, m.ffn, m.seq_len, m.vocab, m.mlp) == ARCHITECTURES[name]


def test_default_scenario_resolution():
    r = load_and_resolve(DEFAULT_SCENARIO)
    p = r.scenario.parallel
    assert (r.tp, p.sp, p.distributed_optimizer) == (8, True, True)
    assert r.gpus == 8 * 8 and r.dp == 64 // 8
    assert r.micro_batches == p.global_batch // (p.micro_batch * 8)
    assert r.gpu == GPUS["h100-sxm"]
    assert not r.crosses_nodes()


@pytest.mark.parametrize("name", ["tiny-2gpu", "llama3-8b-h200", "gpt-13b-a100-2node"])
def test_library_sweep_axes_resolve_or_explain(name):
    """Each sweep point resolves, or is refused with a UserError naming the rule (what `meshsim sweep`
    lists as the reason a configuration is skipped)."""
    scenario, source = load_scenario(name)
    resolved, refused = 0, 0
    for tp in scenario.sweep.tp:
        for sp in scenario.sweep.sp:
            candidate = with_overrides(scenario, {"parallel.tp": tp, "parallel.sp": sp}, source)
            try:
                r = resolve(candidate, source)
                assert (r.tp, r.dp) == (tp, r.gpus // tp)
                resolved += 1
            except UserError as err:
                assert tp == 1 and sp and "parallel.sp" in str(err)
                refused += 1
    assert resolved >= 3 and refused == 1


# ----- resolution ----------------------------------------------------------------------------------
def test_dp_auto_and_micro_batches(tmp_path):
    data = tiny(topology={"nodes": 2}, parallel={"gpus": None, "tp": 4, "micro_batch": 3, "global_batch": 48})
    r = load_and_resolve(write(tmp_path, data, "ok.yaml"))
    assert r.gpus == 16 and r.dp == 16 // 4
    assert r.micro_batches == 48 // (3 * 4)
    assert r.tp_group(1) == (4, 5, 6, 7) and r.dp_group(0) == (0, 4, 8, 12)


def test_fixed_dp_and_gpus_subset(tmp_path):
    data = tiny(parallel={"gpus": 6, "tp": 2, "dp": 3, "micro_batch": 1, "global_batch": 12})
    r = load_and_resolve(write(tmp_path, data, "ok.yaml"))
    assert (r.gpus, r.tp, r.dp, r.micro_batches, r.topology.num_gpus) == (6, 2, 3, 12 // 3, 8)


def test_gpu_overrides_and_profile_precedence(tmp_path):
    profile = {"name": "measured", "gpu": {"peak_tflops": 700.0, "mem_bw_gbps": 1000.0}}
    (tmp_path / "prof").mkdir()
    write(tmp_path / "prof", profile, "p.yaml")
    data = tiny(hardware={"gpu": "a100-40gb", "profile": "prof/p.yaml", "mem_bw_gbps": 1234.0})
    r = load_and_resolve(write(tmp_path, data, "ok.yaml"))
    base = GPUS["a100-40gb"]
    assert r.gpu.name == base.name and r.gpu.mem_gb == base.mem_gb
    assert r.gpu.peak_tflops == 700.0  # the profile's measured figure replaces the preset's
    assert r.gpu.mem_bw_gbps == 1234.0  # an explicit hardware.* figure wins over the profile
    assert r.profile is not None and r.profile.name == "measured"


def test_custom_topology_file_relative_to_scenario(tmp_path):
    topo = {"name": "pair", "gpu": "h100-sxm", "gpus_per_node": 2,
            "devices": [{"name": "g0", "kind": "gpu"}, {"name": "g1", "kind": "gpu"}],
            "links": [{"src": "g0", "dst": "g1", "bw_gbps": 100, "latency_us": 1.0, "kind": "nvlink"}]}
    (tmp_path / "topo").mkdir()
    write(tmp_path / "topo", topo, "pair.yaml")
    data = tiny(topology={"preset": None, "nodes": None, "file": "topo/pair.yaml"}, parallel={"gpus": None})
    r = load_and_resolve(write(tmp_path, data, "ok.yaml"))
    assert (r.topology.name, r.gpus, r.dp, r.gpu.name) == ("pair", 2, 1, "h100-sxm")


# ----- with_overrides ------------------------------------------------------------------------------
def test_with_overrides_round_trip_and_validation():
    scenario, source = load_scenario("tiny-2gpu")
    assert with_overrides(scenario, {}, source) == scenario
    changed = with_overrides(scenario, {"parallel.tp": 1, "model.attention": "unfused",
                                        "topology.nvlink_gbps": 225.0, "hardware.compute.gemm_efficiency": 0.5},
                             source)
    assert (changed.parallel.tp, changed.model.attention, changed.topology.nvlink_gbps) == (1, "unfused", 225.0)
    assert changed.hardware.compute.gemm_efficiency == 0.5
    assert scenario.parallel.tp == 2 and changed.model.hidden == scenario.model.hidden
    r = resolve(changed, source)
    assert (r.tp, r.dp, r.gpu.nvlink_gbps, r.topology.nvlink_gbps_per_gpu) == (1, 2, 225.0, 225.0)
    back = with_overrides(changed, {"parallel.tp": 2, "model.attention": "flash", "topology.nvlink_gbps": None,
                                    "hardware.compute.gemm_efficiency": None}, source)
    assert back.model == scenario.model and back.parallel == scenario.parallel
    assert back.topology == scenario.topology and back.hardware == scenario.hardware


def test_with_overrides_errors_name_the_key():
    scenario, source = load_scenario("tiny-2gpu")
    with pytest.raises(UserError, match=r"parallel\.tpp.*did you mean 'tp'"):
        with_overrides(scenario, {"parallel.tpp": 4}, source)
    with pytest.raises(UserError, match=r"parallel\.recompute = 'most'"):
        with_overrides(scenario, {"parallel.recompute": "most"}, source)
    with pytest.raises(UserError, match=r"builtin:tiny-2gpu: parallel\.tp = 3"):
        resolve(with_overrides(scenario, {"parallel.tp": 3, "parallel.gpus": 3}, source), source)


def test_with_overrides_topology_file_replaces_preset(tmp_path):
    scenario, source = load_scenario("tiny-2gpu")
    changed = with_overrides(scenario, {"topology.file": "x.yaml"}, source)
    assert (changed.topology.preset, changed.topology.file) == (None, "x.yaml")


def test_check_scenario_callable_directly():
    scenario, source = load_scenario("tiny-2gpu")
    check_scenario(scenario, source, topology_gpus=8)
    with pytest.raises(UserError, match=r"parallel\.gpus = 2 .*topology\.nodes: 2"):
        check_scenario(scenario, source, topology_gpus=1)


# ----- every rule: file, field and value in the message ---------------------------------------------
DUP_KEY = "name: a\nname: b\n"
BAD_INDENT = "name: x\nmodel:\n  layers: 2\n hidden: 3\n"

ERROR_CASES = {  # id -> (scenario data or YAML text, field, value as it must appear, fragment of the message)
    "unknown-key": (tiny(model={"hiden": 300}), "model.hiden", "300", "did you mean 'hidden'"),
    "unknown-section": (tiny(paralel={"tp": 2}), "paralel", "{'tp': 2}", "did you mean 'parallel'"),
    "missing-field": (tiny(parallel={"global_batch": None}), "parallel.global_batch", "(missing)", "Required"),
    "missing-section": (tiny(model=None), "model", "None", "section of keys"),
    "range": (tiny(parallel={"tp": 0}), "parallel.tp", "0", "greater than 0"),
    "type": (tiny(model={"layers": "many"}), "model.layers", "'many'", "whole number"),
    "recompute": (tiny(parallel={"recompute": "sometimes"}), "parallel.recompute", "'sometimes'", "'selective'"),
    "mlp": (tiny(model={"mlp": "relu"}), "model.mlp", "'relu'", "'swiglu'"),
    "dp-type": (tiny(parallel={"dp": "half"}), "parallel.dp", "'half'", "whole number or 'auto'"),
    "nodes": (tiny(topology={"nodes": 0}), "topology.nodes", "0", "greater than 0"),
    "yaml-syntax": (BAD_INDENT, "line 4", "'hidden: 3'", "column 2"),
    "duplicate-key": (DUP_KEY, "line 2", "'name: b'", "duplicate key 'name'"),
    "not-a-mapping": ("- 1\n- 2\n", "(top level)", "'list'", "mapping"),
    "topology-both": (tiny(topology={"file": "t.yaml"}), "topology", "{'preset': 'dgx-h100', 'file': 't.yaml'}",
                      "Exactly one"),
    "topology-neither": (tiny(topology={"preset": None}), "topology", "{'preset': None, 'file': None}",
                         "Exactly one"),
    "gpu-preset": (tiny(hardware={"gpu": "h100"}), "hardware.gpu", "'h100'", "did you mean 'h100-sxm'"),
    # the name it abbreviates, not the one letter away b200
    "gpu-preset-case": (tiny(hardware={"gpu": "H200"}), "hardware.gpu", "'H200'", "did you mean 'h200-sxm'"),
    "topology-preset": (tiny(topology={"preset": "dgx-h10"}), "topology.preset", "'dgx-h10'", "'dgx-h100'"),
    "topology-file": (tiny(topology={"preset": None, "file": "nope.yaml"}), "topology.file", "'nope.yaml'",
                      "No such file"),
    "profile-file": (tiny(hardware={"profile": "nope.yaml"}), "hardware.profile", "'nope.yaml'", "calibrate"),
    "pipeline": (tiny(parallel={"pp": 4}), "parallel.pp", "4", "pp exceeds the 2 GPUs used"),
    "head-dim": (tiny(model={"hidden": 258}), "model.hidden", "258", "multiple of 4"),
    "kv-divides-heads": (tiny(model={"kv_heads": 3}), "model.kv_heads", "3", "{1, 2, 4}"),
    "gpus-exceed-topology": (tiny(parallel={"gpus": 16}), "parallel.gpus", "16", "topology.nodes: 2"),
    "tp-exceeds-gpus": (tiny(parallel={"tp": 4}), "parallel.tp", "4", "{1, 2}"),
    "tp-divides-heads": (tiny(parallel={"gpus": None, "tp": 8}), "parallel.tp", "8", "model.heads = 4"),
    "tp-divides-ffn": (tiny(model={"ffn_hidden": 1001}), "parallel.tp", "2", "model.ffn_hidden = 1001"),
    "kv-replicated": (tiny(model={"heads": 12, "kv_heads": 3, "hidden": 768}, parallel={"gpus": 4, "tp": 4}),
                      "parallel.tp", "4", "multiple of kv_heads"),
    "kv-split": (tiny(model={"heads": 24, "kv_heads": 6, "hidden": 768}, parallel={"gpus": 4, "tp": 4}),
                 "parallel.tp", "4", "{1, 2}"),
    "dp-mismatch": (tiny(parallel={"dp": 2}), "parallel.dp", "2", "parallel.dp: auto"),
    "dp-auto-indivisible": (tiny(parallel={"gpus": 3}), "parallel.tp", "2", "3 GPUs"),
    "global-batch": (tiny(parallel={"global_batch": 5}), "parallel.global_batch", "5", "4 or 6"),
    "sp-needs-tp": (tiny(parallel={"tp": 1, "sp": True}), "parallel.sp", "True", "tp > 1"),
    "sp-seq-len": (tiny(model={"seq_len": 129}, parallel={"sp": True}), "model.seq_len", "129", "multiple of 2"),
    "tp-comm-overlap-needs-sp": (tiny(parallel={"sp": False, "tp_comm_overlap": True}),
                                 "parallel.tp_comm_overlap", "True", "parallel.sp: true"),
    "param-gather-needs-dist-opt": (tiny(parallel={"overlap_param_gather": True}),
                                    "parallel.overlap_param_gather", "True", "distributed_optimizer: true"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_each_rule_names_file_field_and_value(tmp_path, case):
    data, field, value, fragment = ERROR_CASES[case]
    path = write(tmp_path, data)
    with pytest.raises(UserError) as info:
        load_and_resolve(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {field} = {value} is invalid."), message
    assert fragment.lower() in message.lower(), message
    assert "Fix: " in message and "\n" not in message


def test_first_error_is_reported_deterministically(tmp_path):
    schema_and_rule = tiny(model={"hiden": 3}, parallel={"tp": 3, "pp": 3})
    with pytest.raises(UserError, match=r"model\.hiden"):
        load_and_resolve(write(tmp_path, schema_and_rule))
    two_rules = tiny(parallel={"tp": 3, "pp": 3, "global_batch": 5})
    with pytest.raises(UserError, match=r"parallel\.pp"):
        load_and_resolve(write(tmp_path, two_rules))


def test_missing_scenario_and_builtin_suggestion(tmp_path):
    with pytest.raises(UserError, match=r"scenario = 'tiny-2gp' .*did you mean 'tiny-2gpu'"):
        load_scenario("tiny-2gp")
    with pytest.raises(UserError, match="No such file"):
        load_scenario(tmp_path / "absent.yaml")


# ----- docs/scenarios.md stays in step with the schema ------------------------------------------------
DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"


def test_docs_example_resolves_and_every_field_is_documented(tmp_path):
    from meshsim.scenarios.schema import Scenario

    text = DOC.read_text()
    example = text.split("## A complete example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    r = load_and_resolve(write(tmp_path, example, "example.yaml"))
    assert (r.gpus, r.tp, r.dp, r.micro_batches) == (64, 8, 64 // 8, 128 // (1 * 8))

    def fields(model, prefix=""):
        for name, info in model.model_fields.items():
            yield prefix + name
            sub = _doc_submodel(info.annotation)
            if sub is not None:
                yield from fields(sub, prefix + name + ".")

    undocumented = [f for f in fields(Scenario) if f"`{f.rsplit('.', 1)[-1]}`" not in text]
    assert not undocumented
    for section in ("model", "hardware", "hardware.compute", "hardware.network", "topology", "topology.fabric",
                    "parallel"):
        assert f"## `{section}`" in text or f"### `{section}`" in text


def _doc_submodel(annotation):
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)


def _section_models() -> list[type]:
    return [m for m in vars(schema).values()
            if inspect.isclass(m) and issubclass(m, schema.Frozen) and m is not schema.Frozen]


@pytest.mark.parametrize("model", _section_models(), ids=lambda m: m.__name__)
def test_a_section_validated_on_its_own_is_still_checked(model):
    """Frozen's validators are built on first use (defer_build, scenarios/model_schema.py): a section validated
    alone, after the Scenario that holds it or before, still refuses an unknown field (extra=forbid)."""
    load_and_resolve(DEFAULT_SCENARIO)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model.model_validate({"not_a_field": 1})


def test_strict_section_fields_refuse_a_bool_for_a_count():
    """strict=True survives the deferred build: `true` is not a count, neither alone nor in a Scenario."""
    with pytest.raises(ValidationError):
        schema.ParallelConfig.model_validate({"tp": True})
    sc, source = load_scenario(DEFAULT_SCENARIO)
    with pytest.raises(UserError, match="parallel.tp = True is invalid"):
        with_overrides(sc, {"parallel.tp": True}, source)
