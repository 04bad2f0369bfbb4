"""Loading and resolving scenarios: YAML file or built-in name -> Scenario -> ResolvedScenario.

Every problem surfaces as a UserError naming the file, the dotted field, the value and the fix: YAML
syntax errors (with the line), schema errors (pydantic's, translated by checks.schema_error), then
the cross-field rules of scenarios/checks.py, in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import yaml
from pydantic import ValidationError

from meshsim.scenarios.checks import (
    CheckContext,
    check_gpu_preset,
    check_scenario,
    check_topology_source,
    data_parallel,
    gpus_used,
    schema_error,
)
from meshsim.scenarios.library import builtin_scenarios, builtin_source, source_dir
from meshsim.scenarios.profile import HardwareProfile, load_profile
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError, closest, unknown_name_error
from meshsim.topologies import registry
from meshsim.topologies.gpus import GPUS, GpuSpec
from meshsim.topologies.model import Topology

GPU_FIGURES = ("peak_tflops", "mem_bw_gbps", "mem_gb")


# ----- loading -----------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """safe_load that rejects a key given twice in one mapping (plain YAML keeps the last silently)."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def yaml_error(exc: Exception, path: Path, source: str) -> UserError:
    """A YAML syntax error -> UserError naming the line, its text and the parser's complaint."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return UserError("(file)", str(path), "fix the YAML syntax", source=source,
                         problem=f"YAML syntax error: {problem}")
    lines = path.read_text(errors="replace").splitlines()
    text = lines[mark.line].strip() if mark.line < len(lines) else ""
    return UserError(f"line {mark.line + 1}", text, f"fix the YAML at line {mark.line + 1}, column "
                     f"{mark.column + 1} (`key: value` pairs; nested sections indented with spaces)",
                     source=source, problem=f"YAML syntax error: {problem}")


def read_yaml(path: Path, source: str) -> dict:
    """A YAML mapping from `path`; unreadable files and syntax errors become UserErrors."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError("scenario", str(path), "check the path", source=source,
                        problem=f"Cannot read the file ({exc.strerror})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise yaml_error(exc, path, source) from None
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
        raise schema_error(exc, Scenario, source) from None


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


def build_scenario_topology(scenario: Scenario, source: str) -> Topology:
    """The whole machine: a registry preset, or a topology YAML relative to the scenario file (whose own
    `nodes` applies unless topology.nodes is given)."""
    t = scenario.topology
    kwargs = dict(nic_gbitps=t.fabric.nic_gbitps, switch_latency_us=t.fabric.switch_latency_us,
                  oversubscription=t.fabric.oversubscription, nvlink_gbps=t.nvlink_gbps)
    try:
        if t.preset is not None:
            return registry.build_topology(t.preset, t.nodes, source=source, **kwargs)
        path = source_dir(source) / t.file
        if not path.is_file():
            raise UserError("topology.file", t.file, "give a topology YAML path relative to the scenario "
                            "file, or use topology.preset", source=source, problem=f"No such file: {path}")
        nodes = t.nodes if "nodes" in t.model_fields_set else None
        return registry.load_topology_file(str(path), nodes, **kwargs)
    except UserError as err:
        raise _attributed(err, source) from None


def load_scenario_profile(scenario: Scenario, source: str) -> HardwareProfile | None:
    """hardware.profile (relative to the scenario file), or None."""
    ref = scenario.hardware.profile
    if ref is None:
        return None
    path = source_dir(source) / ref
    if not path.is_file():
        raise UserError("hardware.profile", ref, "run `meshsim calibrate` to write one, or fix the path "
                        "(relative to the scenario file)", source=source, problem=f"No such file: {path}")
    try:
        return load_profile(path)
    except ValidationError as exc:
        raise schema_error(exc, HardwareProfile, str(path)) from None
    except yaml.YAMLError as exc:
        raise yaml_error(exc, path, str(path)) from None
    except OSError as exc:
        raise UserError("hardware.profile", ref, "check the file", source=source,
                        problem=f"Cannot read {path} ({exc.strerror})") from None


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
    """Run every check, build the topology, apply GPU overrides; dp, gpus and micro_batches resolved.

    gpus = parallel.gpus or all topology GPUs; dp = gpus / tp when 'auto';
    micro_batches = global_batch / (micro_batch x dp).
    """
    early = CheckContext(source, topology_gpus=0)
    check_topology_source(scenario, early)
    check_gpu_preset(scenario, early)
    topology = build_scenario_topology(scenario, source)
    check_scenario(scenario, source, topology.num_gpus, topology.gpus_per_node)
    profile = load_scenario_profile(scenario, source)
    gpus = gpus_used(scenario, topology.num_gpus)
    dp = data_parallel(scenario, gpus)
    p = scenario.parallel
    return ResolvedScenario(
        scenario=scenario, source=source, gpu=gpu_spec(scenario, topology, profile, source),
        topology=topology, gpus=gpus, tp=p.tp, dp=dp,
        micro_batches=p.global_batch // (p.micro_batch * dp), profile=profile,
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
