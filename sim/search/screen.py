"""Screening a layout before any simulation: the scenario checks, then the closed-form memory.

Legality is the scenario's own: a layout is the scenario with the layout's overrides, resolved by
scenarios/load.py `resolve` (every check a scenario file meets: scenarios/checks.py and the pipeline, MoE,
CP, FP8, FSDP and optimizer checks), exactly as `meshsim sweep` resolves a configuration
(sim/sweep/record.py run_point). A UserError there refuses the layout, filed under the rule's field
(`parallel.vp`, `model.heads`, ...). A legal layout whose closed-form memory (sim/cost/memory.py
memory_per_gpu, the figure results.json reports) does not fit is out of memory; the others are candidates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from meshsim.scenarios.load import resolve, with_overrides
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.userio import FileSnapshot, pinned_files
from meshsim.sim.cost.memory import MemoryBreakdown, memory_per_gpu
from meshsim.sim.search.memory_memo import MemoryMemo
from meshsim.sim.search.space import Layout
from meshsim.sim.sweep.axes import skip_reason


@dataclass(frozen=True)
class Refusal:
    layout: Layout
    rule: str  # the field of the check that refused it: "parallel.vp"
    reason: str  # the check's problem and fix


@dataclass(frozen=True)
class Candidate:
    """A legal layout that fits in memory, resolved."""

    layout: Layout
    rs: ResolvedScenario
    memory: MemoryBreakdown


@dataclass(frozen=True)
class RuleCount:
    rule: str
    count: int
    example: str  # one refused layout's reason, in full


class Variants:
    """The scenario with each layout's variant settings applied, made once per variant."""

    def __init__(self, scenario: Scenario, source: str):
        self.scenario, self.source = scenario, source
        self._made: dict[tuple, Scenario | UserError] = {}

    def __call__(self, layout: Layout) -> Scenario:
        made = self._made.get(layout.variant)
        if made is None:
            try:
                made = with_overrides(self.scenario, dict(layout.variant), self.source)
            except UserError as err:
                made = err
            self._made[layout.variant] = made
        if isinstance(made, UserError):
            raise made
        return made


def screen(layout: Layout, variants: Variants, files: FileSnapshot | None = None,
           memo: MemoryMemo | None = None) -> Candidate | Refusal | MemoryBreakdown:
    """A candidate, a refusal, or (out of memory) the memory that does not fit (`memo`: the memo of
    sim/search/memory_memo.py, equal to memory_per_gpu)."""
    try:
        with pinned_files(files):
            rs = resolve(with_overrides(variants(layout), layout.point.overrides(), variants.source), variants.source)
    except UserError as err:
        return Refusal(layout, err.field, skip_reason(err))
    memory = memo(layout, rs) if memo is not None else memory_per_gpu(rs)
    return Candidate(layout, rs, memory) if memory.fits else memory


def by_rule(refusals: list[Refusal]) -> tuple[RuleCount, ...]:
    """Refusals grouped by rule, most frequent first."""
    counts = Counter(r.rule for r in refusals)
    example = {}
    for r in refusals:
        example.setdefault(r.rule, r.reason)
    return tuple(RuleCount(rule, n, example[rule]) for rule, n in counts.most_common())
