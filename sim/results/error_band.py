"""The model's error band for a scenario: the out-of-fit MAPE of the accuracy group it belongs to.

`python benchmarks/accuracy.py` compares simulated and measured figures on public runs, one group of cases
per kind of run (STEP_GROUPS: dense training steps; FP8, context- and expert-parallel groups register here
as they land). A case is *out of fit* when no constant or per-case assumption was fitted or chosen on it
(benchmarks/accuracy/fits.yaml); the out-of-fit mean absolute percentage error of a group is what the
model can claim for a run of that kind that it has not seen. `python benchmarks/accuracy.py --write-bands`
writes those figures to error_bands.json beside this module; nothing else writes them.

    group_of(scenario)  = the first STEP_GROUPS entry whose rule matches (the last one, dense, always does)
    error_band(rs)      = that group's out-of-fit MAPE, max and case count (ErrorBand); a group that is
                          registered but has no figures yet falls back to DEFAULT_GROUP's, and says so;
                          a mechanism no case runs (UNCHECKED: NVFP4, Muon) is named as unchecked

Adding a group: one StepGroup line in STEP_GROUPS (name, metric title, rule) and its case files under
benchmarks/accuracy/<name>/ (benchmarks/accuracy.py's docstring).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario

BANDS_FILE = Path(__file__).with_name("error_bands.json")
BAND_KEYS = ("metric", "out_of_fit_mape", "out_of_fit_max", "out_of_fit_cases", "all_mape", "all_max", "all_cases")
DEFAULT_GROUP = "dense"


@dataclass(frozen=True)
class StepGroup:
    """An accuracy group of whole training steps: its case folder is benchmarks/accuracy/<name>/."""

    name: str
    metric: str  # what its MAPE measures, for the report line ("iteration-time")
    applies: Callable[[Scenario], bool]  # does a scenario belong to this group?


# first match wins; the default group last (it matches every scenario)
STEP_GROUPS: tuple[StepGroup, ...] = (
    StepGroup("moe", "iteration-time", lambda scenario: scenario.model.moe is not None),
    StepGroup("cp", "iteration-time", lambda scenario: scenario.parallel.cp > 1),
    StepGroup("fp8", "iteration-time", lambda scenario: scenario.run.fp8 != "off"),
    StepGroup(DEFAULT_GROUP, "iteration-time", lambda scenario: True),
)


@dataclass(frozen=True)
class ErrorBand:
    group: str  # the group whose figures these are
    metric: str
    mape: float  # out-of-fit mean absolute percentage error, as a fraction (0.05 = 5%)
    max_error: float  # largest out-of-fit absolute error, fraction
    cases: int  # out-of-fit cases behind the figure
    scenario_group: str = ""  # the scenario's own group when it has no figures yet (fallback), else ""
    unchecked: tuple[str, ...] = ()  # what the scenario runs that no published run of the group does (UNCHECKED)

    def sentence(self) -> str:
        """'±14.9% (max 56.4%): the dense group's out-of-fit iteration-time MAPE over 16 published runs'."""
        text = (f"±{self.mape * 100:.1f}% (max {self.max_error * 100:.1f}%): the {self.group} group's out-of-fit "
                f"{self.metric} MAPE over {self.cases} published runs")
        if self.scenario_group:
            text += f" (the {self.scenario_group} group has no figures yet)"
        if self.unchecked:
            text += f"; none of them runs {' or '.join(self.unchecked)}, so that part is unchecked"
        return text


def group_of(scenario: Scenario) -> str:
    """The accuracy group a scenario belongs to (module doc)."""
    return next(g.name for g in STEP_GROUPS if g.applies(scenario))


@lru_cache(maxsize=4)
def load_bands(path: Path = BANDS_FILE) -> dict[str, ErrorBand]:
    """Group name -> its band, from the generated file (benchmarks/accuracy.py --write-bands)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {name: ErrorBand(name, g["metric"], float(g["out_of_fit_mape"]), float(g["out_of_fit_max"]),
                            int(g["out_of_fit_cases"]))
            for name, g in data["groups"].items()}


# mechanisms no case of benchmarks/accuracy/ runs: a band must not vouch for them (name -> does the scenario use it)
UNCHECKED: tuple[tuple[str, Callable[[Scenario], bool]], ...] = (
    ("NVFP4", lambda scenario: scenario.run.fp8 == "nvfp4"),
    ("Muon", lambda scenario: scenario.optimizer.name == "muon"),
)


def band_for(scenario: Scenario, bands: dict[str, ErrorBand] | None = None) -> ErrorBand:
    """The error band of the scenario's group (module doc), naming what in the scenario no case checks."""
    bands = load_bands() if bands is None else bands
    group = group_of(scenario)
    unchecked = tuple(name for name, uses in UNCHECKED if uses(scenario))
    band = bands[group] if group in bands else bands[DEFAULT_GROUP]
    return replace(band, scenario_group="" if group in bands else group, unchecked=unchecked)


def error_band(rs: ResolvedScenario, bands: dict[str, ErrorBand] | None = None) -> ErrorBand:
    """The error band of a resolved scenario's accuracy group."""
    return band_for(rs.scenario, bands)
