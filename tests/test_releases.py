"""Software-release profiles (scenarios/releases.py, scenarios/profiles/): names, the default, golden GEMM times
under two releases, composition with a calibrated profile file, the header and results key, and the case files."""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
import yaml

from meshsim.scenarios.load import resolve, validate_scenario
from meshsim.scenarios.profile import HardwareProfile, save_profile
from meshsim.scenarios.releases import (
    ReleaseProfile,
    builtin_releases,
    composed_profile,
    default_release,
    release_profile,
)
from meshsim.scenarios.schema import ComputeTuning
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.outputs.step_report import config_line
from meshsim.sim.results.costers import compute_fn
from meshsim.sim.results.step_result import config_echo
from meshsim.sim.schedule.ops import Gemm, Op
from meshsim.topologies.gpus import GPUS

REPO = Path(__file__).resolve().parents[1]
H100 = GPUS["h100-sxm"]
REF = Gemm(8192, 8192, 8192, fp8=True)  # the shape model's reference GEMM: it reaches the ceiling exactly
LAUNCH_S = 3e-6


def scenario(tmp_path: Path | None = None, *, fp8: str = "delayed", **hardware):
    data = {"name": "t", "model": {"layers": 2, "hidden": 1024, "heads": 8, "seq_len": 128, "vocab": 1024},
            "hardware": {"gpu": "h100-sxm", **hardware}, "topology": {"preset": "dgx-h100"},
            "parallel": {"tp": 1, "gpus": 1, "dp": 1, "global_batch": 1}, "run": {"fp8": fp8}}
    source = str(tmp_path / "s.yaml") if tmp_path else "test"
    return resolve(validate_scenario(data, source), source)


def gemm_s(rs, work: Gemm) -> float:
    return compute_fn(rs)(Op(0, "g", "compute", "compute", "fwd", work), 0)


def test_default_is_the_newest_release():
    releases = builtin_releases()
    newest = max(releases.values(), key=lambda p: p.released)
    assert default_release() == newest.name == "mbridge-26.08"
    assert list(releases) == sorted(releases, key=lambda n: releases[n].released)  # oldest first
    assert scenario().release.name == "mbridge-26.08"
    assert release_profile(None) is releases["mbridge-26.08"]


def test_unknown_release_names_the_known_ones():
    with pytest.raises(UserError) as err:
        scenario(release="nemo-24.7")
    text = str(err.value)
    assert "hardware.release" in text and "did you mean 'nemo-24.07'" in text
    assert all(name in text for name in builtin_releases())


def test_unknown_release_exits_2_on_one_line():
    out = subprocess.run([sys.executable, "-m", "meshsim.sim.cli.main", "run", "--set", "hardware.release=nemo-2504"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "did you mean 'nemo-25.04'" in out.stderr
    assert "Traceback" not in out.stderr


def test_golden_fp8_gemm_under_two_releases():
    """8192^3 FP8 GEMM on H100: flops / (FP8 peak x 0.62 x rate) + launch; rate 1 (TE 1.x), 1.11 (TE 2.x)."""
    flops = 2 * 8192**3
    old, new = scenario(release="nemo-24.07"), scenario(release="nemo-25.04")
    assert gemm_s(old, REF) == pytest.approx(flops / (H100.fp8_peak_tflops * 1e12 * 0.62) + LAUNCH_S)
    assert gemm_s(new, REF) == pytest.approx(flops / (H100.fp8_peak_tflops * 1e12 * 0.62 * 1.11) + LAUNCH_S)
    assert gemm_s(old, REF) * 1e3 == pytest.approx(0.8991, abs=1e-4)  # 1979 TFLOP/s FP8 peak
    assert gemm_s(new, REF) * 1e3 == pytest.approx(0.8103, abs=1e-4)  # 0.8961 / 1.11 + 3 us launch


def test_release_rate_touches_only_hopper_fp8():
    """Negative controls: 16-bit GEMMs and Blackwell FP8 GEMMs are the same under both releases."""
    bf16 = Gemm(8192, 8192, 8192)
    assert gemm_s(scenario(release="nemo-24.07"), bf16) == gemm_s(scenario(release="nemo-25.04"), bf16)
    b200 = [scenario(release=r, gpu="b200") for r in ("nemo-24.07", "nemo-25.04")]
    assert gemm_s(b200[0], REF) == gemm_s(b200[1], REF)


def test_rate_scales_per_tensor_recipes_only():
    """fp8_gemm_rate multiplies the per-tensor ceiling (delayed, tensorwise: 0.62 x 1.12); block-scaled recipes
    keep the generation's rate (blockwise 0.62 x 0.78, fitted on the Megatron-LM moe_perf rows at the burst clock)."""
    for recipe in ("delayed", "tensorwise"):
        assert ComputeModel(H100, fp8_recipe=recipe, fp8_gemm_rate=1.12).knobs.fp8_gemm_efficiency == \
            pytest.approx(0.62 * 1.12)
    assert ComputeModel(H100, fp8_recipe="blockwise", fp8_gemm_rate=1.12).knobs.fp8_gemm_efficiency == \
        pytest.approx(0.62 * 0.78)


def test_calibrated_profile_file_overrides_the_release(tmp_path):
    """A measured fp8_gemm_efficiency in hardware.profile wins over the release's rate; other knobs stay."""
    save_profile(HardwareProfile(name="p", compute=ComputeTuning(fp8_gemm_efficiency=0.5)), tmp_path / "p.yaml")
    rs = scenario(tmp_path, release="nemo-25.04", profile="p.yaml")
    assert rs.release.name == "nemo-25.04"
    assert gemm_s(rs, REF) == pytest.approx(2 * 8192**3 / (H100.fp8_peak_tflops * 1e12 * 0.5) + LAUNCH_S)


def test_composed_profile_layers_release_knobs_under_the_file():
    release = ReleaseProfile(name="x", family="x", released=date(2025, 1, 1),
                             compute=ComputeTuning(host_dispatch_us=30.0, launch_overhead_us=4.0),
                             constants=[{"name": "compute.host_dispatch_us", "value": 30.0, "why": "test"},
                                        {"name": "compute.launch_overhead_us", "value": 4.0, "why": "test"}])
    calibrated = HardwareProfile(name="p", compute=ComputeTuning(host_dispatch_us=5.0))
    both = composed_profile(release, calibrated)
    assert both.name == "p" and both.compute.host_dispatch_us == 5.0 and both.compute.launch_overhead_us == 4.0
    assert composed_profile(release, None).compute.host_dispatch_us == 30.0
    assert composed_profile(builtin_releases()["nemo-24.07"], None) is None  # states no absolute knob
    assert composed_profile(builtin_releases()["nemo-24.07"], calibrated) is calibrated


def test_header_and_results_name_the_release():
    echo = config_echo(scenario(release="nemo-24.07"))
    assert echo.release == "nemo-24.07" and echo.to_json()["release"] == "nemo-24.07"
    assert config_line(echo).endswith(", release profile nemo-24.07")


def test_profiles_and_case_files_agree():
    """Each case names the release whose profile lists it; every fitted / checked row exists; names = stems."""
    cases = {p.stem: yaml.safe_load(p.read_text())["accuracy"]["release"]
             for p in (REPO / "benchmarks" / "accuracy").glob("*/*.yaml")}
    for name, profile in builtin_releases().items():
        assert (REPO / "scenarios" / "profiles" / f"{name}.yaml").is_file()
        assert all(cases[row] == name for row in profile.rows)
        for c in profile.constants:
            assert set(c.fitted_on + c.checked_on) <= set(cases), c.name
    assert sorted(cases) == sorted(r for p in builtin_releases().values() for r in p.rows)


def _case_file(tmp_path: Path, release: str | None, hardware_release: str | None = None) -> Path:
    block = {"measured_s": 1.0, "source": "test"} | ({"release": release} if release else {})
    data = {"accuracy": block, "name": "c", "model": {"layers": 2, "hidden": 4096, "heads": 32, "seq_len": 2048,
                                                      "vocab": 1024},
            "hardware": {"gpu": "h100-sxm"} | ({"release": hardware_release} if hardware_release else {}),
            "topology": {"preset": "dgx-h100"}, "parallel": {"tp": 1, "gpus": 1, "dp": 1, "global_batch": 8},
            "run": {"fp8": "delayed", "cuda_graphs": True}}  # GPU-bound: no host dispatch
    path = tmp_path / f"c-{release}-{hardware_release}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_case_files_need_a_known_release(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import accuracy_cases as cases

    for bad in (None, "nemo-24.7"):
        with pytest.raises(ValueError, match="accuracy.release .* nemo-24.07"):
            cases.load_step_case(_case_file(tmp_path, bad), "fp8")
    with pytest.raises(ValueError, match="contradicts"):
        cases.load_step_case(_case_file(tmp_path, "nemo-24.07", "nemo-25.04"), "fp8")


def test_a_case_runs_under_its_own_release(tmp_path):
    """The same H100 FP8 case, tagged with two releases: faster under TE 2.x's rate, and the row says which."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import accuracy_cases as cases
    from accuracy_rows import Context, step_row

    old, new = (step_row(cases.load_step_case(_case_file(tmp_path, r), "fp8"), Context())
                for r in ("nemo-24.07", "nemo-25.04"))
    assert (old.release, new.release) == ("nemo-24.07", "nemo-25.04")
    assert new.simulated < old.simulated
    assert old.simulated == pytest.approx(simulate_step(tmp_path, "nemo-24.07"))


def simulate_step(tmp_path: Path, release: str) -> float:
    from meshsim.sim.results.simulate import simulate

    data = yaml.safe_load(_case_file(tmp_path, release).read_text())
    data.pop("accuracy")
    data["hardware"]["release"] = release
    return simulate(resolve(validate_scenario(data, "t"), "t")).step_time_s


def test_every_release_value_names_its_constant():
    """A rate or knob without a `constants` entry of the same name and value is refused (provenance)."""
    base = dict(name="x", family="x", released=date(2025, 1, 1))
    with pytest.raises(ValueError, match="fp8_gemm_rate.h100"):
        ReleaseProfile.model_validate(base | {"fp8_gemm_rate": {"h100": 1.1}})
    with pytest.raises(ValueError, match="compute.host_dispatch_us"):
        ReleaseProfile.model_validate(base | {"compute": {"host_dispatch_us": 30.0}})
    ok = base | {"fp8_gemm_rate": {"h100": 1.1}, "constants": [{"name": "fp8_gemm_rate.h100", "value": 1.1,
                                                                "why": "test"}]}
    assert ReleaseProfile.model_validate(ok).fp8_rate("h100-sxm") == 1.1
