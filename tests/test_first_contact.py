"""What a new user meets first (issue 21, "First contact"): the version, a missing optional extra named in
one line with the pip command that adds it, and packaging that installs without warnings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import EXIT_USER_ERROR, missing_extra
from meshsim.sim.engine import compiled

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_the_installed_distributions(capsys):
    from importlib import metadata

    assert main(["--version"]) == 0
    core = "compiled" if compiled.AVAILABLE else "python (the compiled core is not built)"
    assert capsys.readouterr().out.strip() == f"meshsim {metadata.version('meshsim')} (engine core: {core})"
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert metadata.version("meshsim") == version


# ----- a missing optional extra: one line, the pip command, exit 2 ------------------------------------
NO_TORCH = ("import sys; sys.modules['torch'] = None  # as if torch were not installed\n"
            "from meshsim.sim.cli.main import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("argv", [
    ["validate", "--check", "tiny-2gpu", "--nproc", "2"],
    ["validate", "tiny-2gpu", "--nproc", "2"],
    ["calibrate", "tiny-2gpu", "--nproc", "2"],
    ["validate", "tiny-2gpu", "--nproc", "2", "--dump-payload", "payload.json"],
])
def test_validate_and_calibrate_without_torch_name_the_extra(argv, tmp_path):
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == EXIT_USER_ERROR
    assert done.stderr.count("\n") == 1 and "pip install 'meshsim[validate]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []  # nothing written


def test_only_an_extras_module_is_reported_as_a_missing_extra():
    """Negative control: a missing module that no extra provides is a bug, and raises as one."""
    assert "meshsim[validate]" in missing_extra("torch.distributed")
    assert "meshsim[ray]" in missing_extra("ray")
    assert missing_extra("yaml") is None and missing_extra(None) is None and missing_extra("torchvision") is None


def test_readme_names_the_extra_where_validate_is_introduced():
    readme = (ROOT / "README.md").read_text()
    first_validate = readme.index("meshsim validate")
    note = readme.index("pip install 'meshsim[validate]'")
    assert first_validate < note < readme.index("## How it works")


# ----- packaging ----------------------------------------------------------------------------------------
def _shipped_dirs(tool: dict) -> dict[Path, str]:
    """Every folder under a configured package folder that holds a file (source or data) -> its package."""
    found = {}
    for package, folder in tool["package-dir"].items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                rel = path.parent.relative_to(ROOT / folder)
                found.setdefault(path.parent, ".".join((package, *rel.parts)))
    return found


def test_packaging_config_lists_every_shipped_folder_and_an_spdx_license(pyproject):
    """Classes of setuptools warnings: a folder of files that is not a configured package ('absent from
    the packages configuration'), a license table (deprecated: PEP 639 wants an SPDX string)."""
    tool = pyproject["tool"]["setuptools"]
    shipped = set(_shipped_dirs(tool).values())
    assert "meshsim.scenarios.library" in shipped  # the checker sees a data-only folder (the warning's case)
    assert sorted(shipped - set(tool["packages"])) == []
    assert set(tool["package-dir"]) == set(tool["packages"])
    assert isinstance(pyproject["project"]["license"], str)
    assert pyproject["build-system"]["requires"] == ["setuptools>=77", "Cython>=3"]
    for package, patterns in tool["package-data"].items():  # data is declared on the package that holds it
        folder = ROOT / tool["package-dir"][package]
        assert all("/" not in p and list(folder.glob(p)) for p in patterns), (package, patterns)


def _setuptools_version() -> tuple[int, ...]:
    import setuptools

    return tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])


@pytest.mark.slow
@pytest.mark.skipif(_setuptools_version() < (77,), reason="needs setuptools >= 77 (the build requirement) here")
def test_the_wheel_builds_without_warnings_and_carries_the_data(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # that one warns by design
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                           "-v", "-w", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    log = [line for line in (done.stdout + done.stderr).splitlines() if "Location 'file:" not in line]
    assert [line for line in log if re.search(r"warn|deprecat", line, re.I)] == []
    names = zipfile.ZipFile(next(tmp_path.glob("meshsim-*.whl"))).namelist()
    library = sorted(p.name for p in (ROOT / "scenarios" / "library").glob("*.yaml"))
    assert sorted(Path(n).name for n in names if n.startswith("meshsim/scenarios/library/")) == library
    assert "meshsim/sim/results/error_bands.json" in names and "meshsim/scenarios/library.py" in names
