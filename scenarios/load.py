"""Loading and resolving scenarios: YAML file or built-in name -> Scenario -> ResolvedScenario.

Every problem surfaces as a UserError naming the file, the dotted field, the value and the fix: YAML
syntax errors (with the line), schema errors (pydantic's, translated by schema_errors.schema_error), then
the cross-field rules of scenarios/checks.py, in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from meshsim.scenarios.checks import (
    CheckContext,
    check_gpu_preset,
    check_scenario,
    check_topology_source,
    data_parallel,
    gpus_used,
)
from meshsim.scenarios.fp8_checks import check_fp8
from meshsim.scenarios.library import builtin_scenarios, builtin_source, source_dir
from meshsim.scenarios.limits import check_model_size
from meshsim.scenarios.profile import HardwareProfile, load_profile
from meshsim.scenarios.releases import composed_profile, release_profile
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario
from meshsim.scenarios.schema_errors import schema_error
from meshsim.scenarios.value_names import megatron_key_fix, other_name_fix
from meshsim.sim.core.errors import UserError, closest, unknown_name_error
from meshsim.sim.core.limits import MAX_NODE_GPUS, check_at_most, check_work
from meshsim.sim.core.userio import is_file, load_yaml
from meshsim.topologies import registry
from meshsim.topologies.gpus import GPUS, GpuSpec
from meshsim.topologies.model import Topology
from meshsim.topologies.presets import NVL72_GPUS

GPU_FIGURES = ("peak_tflops", "fp8_peak_tflops", "fp4_peak_tflops", "mem_bw_gbps", "mem_gb")


# ----- loading -----------------------------------------------------------------------------------
def read_yaml(path: Path, source: str) -> dict:
    """A YAML mapping from `path`; unreadable, non-UTF-8, oversized or over-nested files and syntax errors
    become UserErrors (sim/core/userio.py)."""
    data = load_yaml(path, field="scenario", source=source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError("(top level)", type(data).__name__, "write a YAML mapping with the sections name, "
                        "model, hardware, topology, parallel (see docs/scenarios.md)", source=source,
                        problem="A scenario file must be a mapping of sections")
    return data


def validate_scenario(data: object, source: str) -> Scenario:
    """Parsed YAML -> Scenario; schema problems become a UserError naming `source`."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise schema_error(exc, Scenario, source, other_name_fix, megatron_key_fix) from None


def _locate(path_or_name: str | Path) -> tuple[Path, str]:
    """A scenario file path, or a built-in name -> (path, source string)."""
    path = Path(path_or_name)
    if path.is_file():
        return path, str(path)
    library = builtin_scenarios()
    name = str(path_or_name)
    if name in library:
        return library[name], builtin_source(name)
    guess = closest(name, library)
    hint = f"did you mean {guess!r}? " if guess else ""
    raise UserError("scenario", name, f"{hint}give a scenario YAML path or a built-in name: "
                    f"{', '.join(library)}", problem="No such file or built-in scenario")


def load_scenario(path_or_name: str | Path) -> tuple[Scenario, str]:
    """Read and schema-validate a scenario; returns it with its source (file path or 'builtin:NAME')."""
    path, source = _locate(path_or_name)
    return validate_scenario(read_yaml(path, source), source), source


# ----- resolution --------------------------------------------------------------------------------
def _attributed(err: UserError, source: str) -> UserError:
    return err if err.source else err.with_source(source)


def referenced_files(scenario: Scenario, source: str) -> dict[str, Path]:
    """Every file the scenario names, by field, resolved against the scenario file's folder."""
    refs = {"topology.file": scenario.topology.file, "hardware.profile": scenario.hardware.profile}
    return {name: source_dir(source) / ref for name, ref in refs.items() if ref is not None}


def build_scenario_topology(scenario: Scenario, source: str) -> Topology:
    """The whole machine: a registry preset, or a topology YAML relative to the scenario file (whose own
    `nodes` applies unless topology.nodes is given)."""
    t = scenario.topology
    kwargs = dict(nic_gbitps=t.fabric.nic_gbitps, switch_latency_us=t.fabric.switch_latency_us,
                  oversubscription=t.fabric.oversubscription, nvlink_gbps=t.nvlink_gbps)
    try:
        if t.preset is not None:
            return registry.build_topology(t.preset, t.nodes, source=source, gpus_per_node=rack_gpus(scenario),
                                           **kwargs)
        if t.gpus_per_node is not None:
            raise UserError("topology.gpus_per_node", t.gpus_per_node, "remove it: a topology file states its "
                            "own gpus_per_node", source=source)
        path = source_dir(source) / t.file
        if not is_file(path):
            raise UserError("topology.file", t.file, "give a topology YAML path relative to the scenario "
                            "file, or use topology.preset", source=source, problem=f"No such file: {path}")
        nodes = t.nodes if "nodes" in t.model_fields_set else None
        return registry.load_topology_file(str(path), nodes, **kwargs)
    except UserError as err:
        raise _attributed(err, source) from None


def rack_gpus(scenario: Scenario) -> int | None:
    """GPUs used per node of a rack-scale preset (NVL72): topology.gpus_per_node, else parallel.gpus spread
    evenly over several nodes when that leaves some of each rack idle (a scheduler places a 256-GPU job on 4
    racks as 4 x 64, keeping power-of-two groups inside one NVLink domain), else None (all 72)."""
    t, gpus = scenario.topology, scenario.parallel.gpus
    info = registry.PRESETS.get(t.preset) if t.preset is not None else None
    if t.gpus_per_node is not None or info is None or not info.rack:
        return t.gpus_per_node
    if gpus is None or t.nodes == 1 or gpus % t.nodes or gpus // t.nodes >= NVL72_GPUS:
        return None
    return gpus // t.nodes


def load_scenario_profile(scenario: Scenario, source: str) -> HardwareProfile | None:
    """hardware.profile (relative to the scenario file), or None."""
    ref = scenario.hardware.profile
    if ref is None:
        return None
    path = source_dir(source) / ref
    if not is_file(path):
        raise UserError("hardware.profile", ref, "run `meshsim calibrate` to write one, or fix the path "
                        "(relative to the scenario file)", source=source, problem=f"No such file: {path}")
    try:
        return load_profile(path)
    except ValidationError as exc:
        raise schema_error(exc, HardwareProfile, str(path)) from None


def gpu_spec(scenario: Scenario, topology: Topology, profile: HardwareProfile | None, source: str) -> GpuSpec:
    """The topology's GPU (or hardware.gpu), then the profile's measured figures, then hardware.* figures
    (most specific wins); topology.nvlink_gbps also replaces the GPU's NVLink figure."""
    name = scenario.hardware.gpu or topology.gpu
    if name not in GPUS:
        raise unknown_name_error("hardware.gpu", name, GPUS, source=source)
    figures = profile.gpu.model_dump(exclude_none=True) if profile else {}
    for key in GPU_FIGURES:
        value = getattr(scenario.hardware, key)
        if value is not None:
            figures[key] = value
    if scenario.topology.nvlink_gbps is not None:
        figures["nvlink_gbps"] = scenario.topology.nvlink_gbps
    return replace(GPUS[name], **figures)


def resolve(scenario: Scenario, source: str) -> ResolvedScenario:
    """Run every check, build the topology, apply GPU overrides; dp, gpus and micro_batches resolved; the
    release profile (hardware.release, else the newest) under the calibrated profile file (scenarios/releases.py).

    gpus = parallel.gpus or all topology GPUs; dp = gpus / (tp x pp) when 'auto';
    micro_batches = global_batch / (micro_batch x dp).
    """
    early = CheckContext(source, topology_gpus=0)
    check_model_size(scenario, source)
    check_topology_source(scenario, early)
    check_gpu_preset(scenario, early)
    topology = build_scenario_topology(scenario, source)
    check_at_most("topology.file", scenario.topology.file, MAX_NODE_GPUS, f"use a node of at most {MAX_NODE_GPUS} "
                  "GPUs, joined into nodes with `nodes: N` and nic_gbitps (meshsim topologies --show reads any size)",
                  source=source, what="GPUs per node simulated", amount=topology.gpus_per_node)
    check_scenario(scenario, source, topology.num_gpus, topology.gpus_per_node)
    release = release_profile(scenario.hardware.release, source)
    profile = composed_profile(release, load_scenario_profile(scenario, source))
    gpus = gpus_used(scenario, topology.num_gpus)
    dp = data_parallel(scenario, gpus)
    p = scenario.parallel
    micro_batches = p.global_batch // (p.micro_batch * dp)
    check_work(scenario.model.layers, micro_batches, source=source)
    gpu = gpu_spec(scenario, topology, profile, source)
    check_fp8(scenario, gpu, source)
    return ResolvedScenario(
        scenario=scenario, source=source, gpu=gpu,
        topology=topology, gpus=gpus, tp=p.tp, dp=dp, micro_batches=micro_batches, profile=profile, pp=p.pp,
        vp=p.vp, ep=p.ep, etp=p.etp, cp=p.cp, release=release,
    )


def load_and_resolve(path_or_name: str | Path) -> ResolvedScenario:
    return resolve(*load_scenario(path_or_name))


# ----- overrides ---------------------------------------------------------------------------------
_COUNTERPART = {"topology.preset": "topology.file", "topology.file": "topology.preset"}


def _set_dotted(data: dict, key: str, value: object, source: str) -> None:
    parts = key.split(".")
    if not all(parts):
        raise UserError(key, value, "write overrides as SECTION.FIELD, e.g. parallel.tp", source=source,
                        problem="Malformed override key")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            prefix = ".".join(parts[: depth + 1])
            raise UserError(key, value, f"{prefix} is a value, not a section; override {prefix} itself",
                            source=source, problem="Override goes through a non-section")
        node = child
    node[parts[-1]] = value


def with_overrides(scenario: Scenario, overrides: Mapping[str, object], source: str) -> Scenario:
    """A new schema-validated Scenario with dotted keys replaced ("parallel.tp": 4, "model.attention": ...).

    Only schema checks run here; cross-field rules run in resolve(), so a sweep can resolve() each
    candidate and report the UserError as the reason it is skipped. Setting topology.preset clears
    topology.file and vice versa (unless both are given). dp is not adjusted: when dp is a fixed number
    and tp changes, set "parallel.dp": "auto" too.
    """
    data = scenario.model_dump(mode="python", exclude_unset=True)
    for key, value in overrides.items():
        _set_dotted(data, key, value, source)
    for key, other in _COUNTERPART.items():
        if key in overrides and overrides[key] is not None and other not in overrides:
            _set_dotted(data, other, None, source)
    return validate_scenario(data, source)
