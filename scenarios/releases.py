"""Software-release profiles: the constants that differ between release families of NeMo, Megatron-Bridge and
Megatron-LM, as the published rows of each family show them (scenarios/profiles/<name>.yaml).

The same layout steps 10-50% apart between releases of the published tables, so rows of different releases
are not averaged into one constant: each family keeps its own, with provenance (the software it ran, the
rows it was read from, what each constant was fitted on), and a scenario names its family with
`hardware.release`. Unset, the default is the newest calibrated release (DEFAULT_RELEASE: the latest
`released` date), so the defaults are what the newest software does.

How the layers compose, most specific first (each knob from the first layer that states it):

    scenario hardware.compute / hardware.network
    > the calibrated profile file (hardware.profile, `meshsim calibrate`)
    > the release profile's `compute` / `network` sections
    > the cost models' by-GPU-generation defaults, times the release's `fp8_gemm_rate` for the GPU

so a measured figure always wins over a release's fitted one, and a release that states nothing is exactly
the defaults. `fp8_gemm_rate` multiplies the generation's FP8 large-GEMM ceiling (sim/cost/fp8_gemm.py), so it
composes with the block-scaled rate and a part's reference rate; a stated fp8_gemm_efficiency is not scaled.
"""

from __future__ import annotations

from datetime import date
from functools import cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator

from meshsim.scenarios.profile import HardwareProfile
from meshsim.scenarios.schema import ComputeTuning, Frozen, NetworkTuning, defaults_of
from meshsim.sim.core.errors import unknown_name_error
from meshsim.sim.core.userio import load_yaml
from meshsim.topologies.gpus import by_gpu_prefix

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


class ReleaseConstant(Frozen):
    """One constant of a release profile and where it comes from."""

    name: str  # e.g. fp8_gemm_rate.h100
    value: float
    fitted_on: list[str] = []  # accuracy case names (benchmarks/accuracy/...); [] = not fitted (source, reasoning)
    checked_on: list[str] = []  # rows of this family it was not fitted on
    why: str  # the mechanism and its source (file + commit), or what the rows cannot separate


class ReleaseProfile(Frozen):
    """A release family: its software, its calibration rows, and the constants that differ from the defaults."""

    name: str  # equals the file stem: hardware.release names it
    family: str  # the releases it covers, in words
    released: date  # the newest release of the family (orders the families; the newest is the default)
    software: dict[str, str] = {}  # container, Transformer Engine, Megatron-Core, NCCL, ... as far as known
    sources: list[str] = []  # where the family's rows are printed (reference file, repository, commit, lines)
    rows: list[str] = []  # the accuracy cases of this family (their accuracy.release names it)
    # multiplier on the GPU generation's FP8 large-GEMM ceiling, by GPU prefix (by_gpu_prefix: h100 covers h100-*)
    fp8_gemm_rate: dict[str, Annotated[float, Field(gt=0.25, le=2.0)]] = Field(default_factory=dict)
    compute: ComputeTuning = defaults_of(ComputeTuning)  # absolute knobs, under a calibrated profile's
    network: NetworkTuning = defaults_of(NetworkTuning)
    constants: list[ReleaseConstant] = []  # provenance of every value above

    @model_validator(mode="after")
    def _every_value_has_provenance(self) -> ReleaseProfile:
        """Each fp8_gemm_rate entry and each knob of compute / network is a `constants` entry of that name and value."""
        stated = {f"fp8_gemm_rate.{gpu}": v for gpu, v in self.fp8_gemm_rate.items()}
        for section in ("compute", "network"):  # the knobs the file sets (scalars: as model_dump(exclude_unset) gives them)
            knobs = getattr(self, section)
            stated |= {f"{section}.{k}": getattr(knobs, k) for k in type(knobs).model_fields if k in knobs.model_fields_set}
        named = {c.name: c.value for c in self.constants}
        missing = [k for k, v in stated.items() if k not in named or named[k] != v]
        if missing:
            raise ValueError(f"no constants entry with the same value for {', '.join(missing)}")
        return self

    def fp8_rate(self, gpu_name: str) -> float:
        """fp8_gemm_rate for this GPU preset (its reference's for a part that carries another's die), else 1."""
        return by_gpu_prefix(self.fp8_gemm_rate, gpu_name, 1.0)


@cache
def builtin_releases() -> dict[str, ReleaseProfile]:
    """Every built-in release profile by name, oldest first. A malformed built-in file is a bug: it raises."""
    out = {}
    for path in sorted(PROFILES_DIR.glob("*.yaml")):
        try:
            profile = ReleaseProfile.model_validate(load_yaml(path, field="release profile"))
        except ValidationError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if profile.name != path.stem:
            raise ValueError(f"{path}: name {profile.name!r} must equal the file stem {path.stem!r}")
        out[profile.name] = profile
    return dict(sorted(out.items(), key=lambda kv: (kv[1].released, kv[0])))


def default_release() -> str:
    """The newest calibrated release family: the default profile of every scenario that names none."""
    return next(reversed(builtin_releases()))


def release_profile(name: str | None, source: str | None = None) -> ReleaseProfile:
    """hardware.release's profile (None: the default); an unknown name is a UserError listing the known ones."""
    releases = builtin_releases()
    key = default_release() if name is None else name
    if key not in releases:
        raise unknown_name_error("hardware.release", key, releases, source=source)
    return releases[key]


def composed_profile(release: ReleaseProfile, calibrated: HardwareProfile | None) -> HardwareProfile | None:
    """The hardware profile the cost models read: the calibrated file's sections over the release's absolute
    knobs (a field the file sets wins). None when neither states anything (the defaults apply)."""
    if release.compute == ComputeTuning.model_construct() and release.network == NetworkTuning.model_construct():
        return calibrated
    base = calibrated or HardwareProfile(name=f"release:{release.name}")
    mine = base.compute.model_dump(exclude_none=True)
    compute = release.compute.model_copy(update=mine)
    network = release.network.model_copy(update=base.network.model_dump(exclude_unset=True))
    return base.model_copy(update={"compute": compute, "network": network})


def check_release_name(name: object, source: str | None = None) -> None:
    """Raise the one-line UserError for a name that is not a built-in release (for loaders outside a scenario)."""
    if not isinstance(name, str) or name not in builtin_releases():
        raise unknown_name_error("release", str(name), builtin_releases(), source=source)

