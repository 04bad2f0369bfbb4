"""The search's typed records: one per bounded layout, and the whole outcome (sim/search/branch.py)."""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.sim.results.error_band import ErrorBand
from meshsim.sim.search.bound_types import Bound
from meshsim.sim.search.screen import Refusal, RuleCount
from meshsim.sim.search.space import Layout
from meshsim.sim.sweep.record import SweepRecord


@dataclass(frozen=True)
class Entry:
    """A legal layout that fits: its cheap lower bound, the refined one when it reached the front of the
    queue, and, when simulated, its sweep record."""

    layout: Layout
    cheap: Bound  # sim/search/cheap_bound.py
    refined: Bound | None = None  # sim/search/bound.py; None: never refined
    record: SweepRecord | None = None  # None: pruned (never simulated)

    @property
    def key(self) -> str:
        return self.layout.key

    @property
    def bound(self) -> Bound:
        """The larger of the bounds computed (both are <= the simulated step, so the larger is too)."""
        if self.refined is not None and self.refined.step_s >= self.cheap.step_s:
            return self.refined
        return self.cheap

    @property
    def step_s(self) -> float | None:
        return self.record.result.step_time_s if self.record is not None and self.record.ok else None

    @property
    def tightness(self) -> float | None:
        """bound / simulated step (<= 1 by the bound's proof)."""
        step = self.step_s
        return self.bound.step_s / step if step else None


@dataclass(frozen=True)
class SearchResult:
    scenario: str
    searched: int  # layouts enumerated
    refused: tuple[RuleCount, ...]  # by rule
    out_of_memory: int
    entries: tuple[Entry, ...]  # every legal layout that fits, in ascending order of its final bound
    failed: tuple[Refusal, ...]  # simulated but refused by a check of the simulation itself
    winner: Entry | None
    proven: bool  # every layout not simulated has a bound >= the winner's step
    stop_reason: str
    within_error: tuple[Entry, ...]  # simulated, not the winner, step within the error band of the winner's
    band: ErrorBand | None  # the winner's accuracy group's band
    explanation: tuple[str, ...]
    wall_s: float
    phase_s: tuple[tuple[str, float], ...] = ()  # wall s of screening + cheap bounds and of refining + simulating; workers CPU s of each
    bounds_reused: int = 0  # bounds read back from OUT/bounds.jsonl instead of computed
    band_complete: bool = True  # every layout within the error band of the winner was simulated (branch.py step 4)
    unscreened: int = 0  # layouts --budget left unscreened (then nothing is proven)

    @property
    def unproven(self) -> int:
        """Layouts not simulated whose bound is below the winner's step: what a proof still lacks (besides the
        unscreened ones)."""
        if self.winner is None:
            return len(self.entries)
        return sum(1 for e in self.entries if e.record is None and e.bound.step_s < self.winner.step_s)

    @property
    def band_missing(self) -> int:
        """Layouts not simulated whose bound is within the winner's error band: what the band's list lacks."""
        if self.winner is None or self.band is None:
            return 0
        limit = self.winner.step_s * (1 + self.band.mape)
        return sum(1 for e in self.entries if e.record is None and e.bound.step_s <= limit)

    @property
    def refused_total(self) -> int:
        return sum(r.count for r in self.refused)

    @property
    def simulated(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.record is not None)

    @property
    def needed_for_proof(self) -> int:
        """Layouts whose bound is below the winner's step: any branch and bound with this bound simulates
        them (the rest of the simulated ones are the error band's)."""
        if self.winner is None:
            return len(self.entries)
        return sum(1 for e in self.entries if e.bound.step_s < self.winner.step_s)

    @property
    def refined(self) -> int:
        """Layouts whose refined bound was computed (those that reached the front of the queue)."""
        return sum(1 for e in self.entries if e.refined is not None)

    @property
    def pruned(self) -> int:
        return sum(1 for e in self.entries if e.record is None)

    def runners_up(self, k: int) -> tuple[Entry, ...]:
        """The k fastest simulated layouts after the winner."""
        ranked = sorted((e for e in self.simulated if e.step_s is not None and e.record.fits and e is not self.winner),
                        key=lambda e: e.step_s)
        return tuple(ranked[:k])
