"""The accuracy report's data: case files under benchmarks/accuracy/, read into typed records.

- step cases: benchmarks/accuracy/<group>/<name>.yaml, a scenario plus an `accuracy:` block
  (measured_s, source, release, assumptions: dotted field -> why). The block is removed before the scenario
  is validated, so the rest is an ordinary scenario file. `release` names the software-release family the
  row was measured on (a built-in profile, scenarios/profiles/<name>.yaml): the case is simulated under that
  release's profile (hardware.release), never under a constant fitted on another release's rows.
- collectives.yaml: nccl-tests curves (points by MiB); kernels.yaml: FLUX GEMM / collective times;
  scaling.yaml: ratios of two step cases; fits.yaml: what was fitted or chosen on which cases.

Every problem in these files is a ValueError naming the file and the field (they are this report's own
data, not user input).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from meshsim.scenarios.load import validate_scenario
from meshsim.scenarios.releases import builtin_releases
from meshsim.scenarios.schema import Scenario

HERE = Path(__file__).resolve().parent / "accuracy"
MIB = 1 << 20


@dataclass(frozen=True)
class Assumption:
    field: str  # dotted scenario field
    value: Any  # its value in the case file
    why: str

    def as_json(self) -> dict[str, Any]:
        return {"field": self.field, "value": self.value, "why": self.why}


@dataclass(frozen=True)
class StepCase:
    name: str
    group: str
    path: Path
    measured_s: float
    source: str
    assumptions: tuple[Assumption, ...]
    scenario: Scenario
    release: str  # accuracy.release: the software-release profile the row is simulated under
    # settings the measured run used that this meshsim cannot express yet (accuracy.pending: dotted field ->
    # value, e.g. run.fp8): applied once the schema has the field; until then the case is not scored
    pending: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Curve:
    id: str
    label: str
    source: str
    preset: str
    gpu: str
    gpus: int
    algo: str
    busbw_gbps: tuple[tuple[int, float], ...]  # (MiB, GB/s), ascending


@dataclass(frozen=True)
class KernelCase:
    id: str
    label: str
    gpu: str
    preset: str
    measured_ms: float
    gemm: tuple[int, int, int] | None = None  # m, n, k
    collective: str = ""  # op, when not a GEMM
    nbytes: int = 0
    # FLUX's all-gather baseline times `alpha_scale * torch.matmul(...)`: the GEMM and an elementwise multiply
    # reading and writing its m x n 16-bit output (bytedance/flux @239a13d2 test/test_ag_kernel.py L118-145)
    scaled_output: bool = False


@dataclass(frozen=True)
class Ratio:
    label: str
    num: str
    den: str


@dataclass(frozen=True)
class Fit:
    name: str
    value: Any
    where: str
    how: str
    cases: tuple[str, ...]


def _read(path: Path) -> dict:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    return data


def _dotted(data: dict, field: str, path: Path) -> Any:
    node: Any = data
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{path}: accuracy.assumptions names {field!r}, which the scenario does not set")
        node = node[part]
    return node


def load_step_case(path: Path, group: str) -> StepCase:
    data = _read(path)
    block = data.pop("accuracy", None)
    if not isinstance(block, dict) or "measured_s" not in block or "source" not in block:
        raise ValueError(f"{path}: needs an accuracy: block with measured_s and source")
    why = block.get("assumptions") or {}
    assumptions = tuple(Assumption(f, _dotted(data, f, path), str(w)) for f, w in why.items())
    release = _release(block, data, path)
    scenario = validate_scenario(data, str(path))
    pending = tuple((str(k), v) for k, v in (block.get("pending") or {}).items())
    return StepCase(path.stem, group, path, float(block["measured_s"]), str(block["source"]), assumptions,
                    scenario, release, pending)


def _release(block: dict, data: dict, path: Path) -> str:
    """accuracy.release, a built-in release name; a scenario's own hardware.release must agree with it."""
    name = block.get("release")
    known = builtin_releases()
    if name not in known:
        raise ValueError(f"{path}: accuracy.release = {name!r}: name the release family the row was measured on, "
                         f"one of {', '.join(known)} (scenarios/profiles/)")
    stated = (data.get("hardware") or {}).get("release")
    if stated is not None and stated != name:
        raise ValueError(f"{path}: hardware.release = {stated!r} contradicts accuracy.release = {name!r}")
    return str(name)


def step_cases(group: str, only: str = "") -> list[StepCase]:
    """The cases of one step group (benchmarks/accuracy/<group>/*.yaml), by name."""
    return [load_step_case(p, group) for p in sorted((HERE / group).glob("*.yaml")) if p.stem.startswith(only)]


def curves() -> list[Curve]:
    out = []
    for c in _read(HERE / "collectives.yaml")["curves"]:
        points = tuple(sorted((int(k), float(v)) for k, v in c["busbw_gbps"].items()))
        out.append(Curve(c["id"], c["label"], c["source"], c["preset"], c["gpu"], int(c["gpus"]), c["algo"], points))
    return out


def kernels() -> tuple[list[KernelCase], float]:
    """FLUX rows and the export parts' NVLink GB/s per direction."""
    data = _read(HERE / "kernels.yaml")
    rows = [KernelCase(k["id"], k["label"], k["gpu"], k["preset"], float(k["measured_ms"]),
                       tuple(k["gemm"]) if "gemm" in k else None, k.get("collective", ""), int(k.get("bytes", 0)),
                       bool(k.get("scaled_output", False)))
            for k in data["kernels"]]
    return rows, float(data["nvlink_gbps"])


def ratios() -> list[Ratio]:
    return [Ratio(r["label"], r["num"], r["den"]) for r in _read(HERE / "scaling.yaml")["ratios"]]


def fits() -> list[Fit]:
    return [Fit(f["name"], f["value"], f["where"], f["how"], tuple(f["cases"]))
            for f in _read(HERE / "fits.yaml")["fits"]]


def used_in_fit(all_fits: list[Fit]) -> dict[str, tuple[str, ...]]:
    """Case name -> the fits that used it (fits.yaml is the one definition)."""
    out: dict[str, list[str]] = {}
    for f in all_fits:
        for case in f.cases:
            out.setdefault(case, []).append(f.name)
    return {k: tuple(v) for k, v in out.items()}
