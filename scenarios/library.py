"""The built-in scenario library: the YAML files in scenarios/library/, addressed by file stem.

Each file's `name:` equals its stem (tests/test_scenarios.py checks it), so `meshsim run NAME` and
`meshsim run scenarios/library/NAME.yaml` mean the same thing.
"""

from __future__ import annotations

from pathlib import Path

LIBRARY_DIR = Path(__file__).resolve().parent / "library"

# Llama-2 70B, TP 8 + SP inside each DGX H100, DP 8 over 8 nodes: the scenario `meshsim run` uses
# when none is given.
DEFAULT_SCENARIO = "llama2-70b-h100-tp8"

BUILTIN_PREFIX = "builtin:"


def builtin_scenarios() -> dict[str, Path]:
    """Name -> YAML path of every built-in scenario, sorted by name."""
    return {p.stem: p for p in sorted(LIBRARY_DIR.glob("*.yaml"))}


def builtin_source(name: str) -> str:
    """The source string of a built-in scenario, as used in messages: 'builtin:NAME'."""
    return f"{BUILTIN_PREFIX}{name}"


def source_dir(source: str) -> Path:
    """Directory that relative paths in a scenario (topology.file, hardware.profile) are resolved against:
    the scenario file's directory, or the library directory for a built-in scenario."""
    if source.startswith(BUILTIN_PREFIX):
        return LIBRARY_DIR
    return Path(source).parent
