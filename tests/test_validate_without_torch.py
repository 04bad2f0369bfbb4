"""Without torch (meshsim[validate] is optional): every test module still collects (its torch tests skip),
and the one line a validate command prints tells a CPU-only user how to get torch's CPU build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from meshsim.sim.core.errors import missing_extra

TESTS = Path(__file__).resolve().parent
CPU_INDEX = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
# pytest's collection in a fresh interpreter where `import torch` fails as if it were not installed; the
# modules are imported as they are (--assert=plain): what they import is the question, not their asserts
COLLECT = ("import sys; sys.modules['torch'] = None\n"
           "import pytest; sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', '--assert=plain',"
           " *sys.argv[1:]]))")


def _collect(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", COLLECT, *map(str, paths)], capture_output=True, text=True,
                          timeout=600, cwd=TESTS.parent)


def test_every_test_module_collects_without_torch():
    done = _collect(TESTS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]


def test_a_module_level_torch_import_fails_that_check(tmp_path):
    """Negative control: the harness really hides torch, so a module importing it at the top is caught."""
    (tmp_path / "test_imports_torch.py").write_text("import torch\n\ndef test_x():\n    assert torch\n")
    (tmp_path / "test_skips_torch.py").write_text("import pytest\n\ntorch = pytest.importorskip('torch')\n\n"
                                                  "def test_x():\n    assert torch\n")
    done = _collect(tmp_path / "test_imports_torch.py")
    assert done.returncode != 0 and "test_imports_torch.py" in done.stdout
    assert _collect(tmp_path / "test_skips_torch.py").returncode in (0, 5)  # 5: nothing collected (skipped)


def test_the_missing_torch_line_names_the_cpu_build():
    line = missing_extra("torch")
    assert "\n" not in line and "pip install 'meshsim[validate]'" in line and CPU_INDEX in line
    assert CPU_INDEX not in missing_extra("ray")  # the CPU index is torch's only


def test_the_readme_names_the_cpu_build_where_it_names_the_extra():
    readme = (TESTS.parent / "README.md").read_text()
    extra = readme.index("pip install 'meshsim[validate]'")
    assert CPU_INDEX in readme[extra - 600: extra + 600]
