"""Golden headline figures of every library scenario, pinned to the last printed digit.

A refactor must leave them identical. A model change that is meant to move them regenerates the file
(`python tests/golden/update.py`) and says why in its commit message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden_figures import headline_figures

from meshsim.scenarios.library import builtin_scenarios

GOLDEN = json.loads((Path(__file__).parent / "golden" / "headlines.json").read_text())


def test_every_library_scenario_has_golden_figures():
    assert sorted(GOLDEN) == sorted(builtin_scenarios())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_headline_figures_are_unchanged(name):
    assert headline_figures(name) == GOLDEN[name]
