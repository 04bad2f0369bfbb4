"""The bounds' shared records and pricing: `Bound` (either level), `StageBound`, the float margins, and
`Pricer`, the priced duration of an op (sim/search/bound.py step 3; cheap_bound.py step 1)."""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.results.costers import CollectiveCoster, compute_fn
from meshsim.sim.schedule.ops import Collective

RELATIVE_MARGIN = 1e-9  # bound.py step 6: float rounding of the engine's sums
PER_OP_MARGIN_S = 2e-15  # bound.py step 6: the arbiter's completion epsilon, per op summed
LEVELS = ("cheap", "refined")  # cheap_bound.py; bound.py


@dataclass(frozen=True)
class StageBound:
    """One stage's terms: every FIFO stream's bound and the host's static clock, for the full step."""

    stage: int
    busy_s: tuple[tuple[str, float], ...]  # (stream, seconds), streams with ops only
    host_s: float

    @property
    def worst(self) -> tuple[str, float]:
        """The binding term: ("compute", s), ("tp_comm", s), ... or ("host", s)."""
        return max((*self.busy_s, ("host", self.host_s)), key=lambda t: t[1])


@dataclass(frozen=True)
class Bound:
    step_s: float  # the lower bound, margins applied
    stages: tuple[StageBound, ...]
    short_micro_batches: int  # m' of bound.py step 5 (== micro_batches: no premise used; 0: the cheap level)
    micro_batches: int
    level: str = "refined"  # LEVELS

    @property
    def binding(self) -> tuple[int, str]:
        """(stage, term) that gives the bound."""
        best = max(self.stages, key=lambda sb: sb.worst[1])
        return best.stage, best.worst[0]


def mesh_key(rs: ResolvedScenario) -> tuple:
    """What a layout's groups are made of (ResolvedScenario.group, all_groups; FabricBlocks.of's stage size)."""
    return (rs.tp, rs.dp, rs.kv_replicas, rs.pp, rs.ep, rs.etp, rs.cp, rs.cp_a2a, rs.instances, rs.stage_size)


def _hardware_key(rs: ResolvedScenario) -> tuple[str, str, object]:
    """The scenario's topology and hardware sections and GPU count, as JSON: the rest of a collective's and a
    kernel's inputs (the topology and profile files are fixed for one search: the sweep's snapshot)."""
    sc = rs.scenario
    return sc.topology.model_dump_json(), sc.hardware.model_dump_json(), sc.parallel.gpus


class _GroupMemo:
    """The resolved scenario with all_groups memoized (a pure function of (kind, rank) for one mesh): the
    coster asks it for every group it prices, twice."""

    def __init__(self, rs: ResolvedScenario):
        self._rs, self._all = rs, {}

    def __getattr__(self, name: str):
        return getattr(self._rs, name)

    def all_groups(self, kind: str, rank: int = 0) -> tuple[tuple[int, ...], ...]:
        hit = self._all.get((kind, rank))
        if hit is None:
            hit = self._all[(kind, rank)] = self._rs.all_groups(kind, rank)
        return hit


class PriceCache:
    """Cost functions shared by the layouts of one search, so a collective or a kernel is priced once.

    Equal to pricing each layout afresh: CollectiveCoster(rs) is a pure function of the topology, the network
    tuning and profile (hardware), and the groups (the mesh: mesh_key), memoized on (op, group kind, group,
    bytes, kernel); the compute model of the GPU and hardware.compute, the profile, run.deterministic and
    run.fp8, memoized on the work's value (sim/results/costers.py). Layouts equal on those keys get the same
    coster and compute model; tests/test_search_bound.py compares bounds priced both ways."""

    def __init__(self):
        self.costers: dict[tuple, CollectiveCoster] = {}
        self.computes: dict[tuple, object] = {}
        self.groups: dict[tuple, tuple[int, ...]] = {}
        self.blocks: dict[tuple, object] = {}  # cheap_bound.py step 7: (Pricer.key, rank, ...) -> BlockCost
        self.passes: dict[tuple, dict[str, float]] = {}  # cheap_bound.py step 7: a pass's forced gaps
        self.templates: dict[tuple, int] = {}  # overlap_windows.py step 6: a template's value -> its number
        self.windows: dict[tuple, object] = {}  # overlap_windows.py step 6: window_key -> WindowPaths
        self.window_lengths: dict[tuple, dict] = {}  # (Pricer.key, rank, window_key) -> stream -> (L_x, busy_x)

    def pricer(self, rs: ResolvedScenario) -> Pricer:
        hw, mesh = _hardware_key(rs), mesh_key(rs)
        coster = self.costers.get((hw, mesh))
        if coster is None:
            coster = self.costers[(hw, mesh)] = CollectiveCoster(_GroupMemo(rs))
        run = (hw, rs.scenario.run.deterministic, rs.scenario.run.fp8)
        compute = self.computes.get(run)
        if compute is None:
            compute = self.computes[run] = compute_fn(rs)
        return Pricer(rs, compute, coster, self.groups, mesh, key=(hw, mesh, run))


class Pricer:
    """Priced duration of a FIFO op (or a block template's op) on a rank: compute_s, or latency + bandwidth of
    its collective on the rank's group (bound.py step 3). Made alone, or by a PriceCache. Memoized per (work
    object, rank): both prices are functions of the op's work and the rank only (the collective's group is
    rs.group(work.group, rank)), and ops stamped from one template share their work; the memo keeps the
    work alive, so its id stays its own (as sim/results/costers.py compute_fn does)."""

    def __init__(self, rs: ResolvedScenario, compute_s=None, coster: CollectiveCoster | None = None,
                 groups: dict | None = None, mesh: tuple | None = None, key: tuple | None = None):
        self.rs = rs
        self.key = key  # what its prices depend on besides (work, rank), when made by a PriceCache; else None
        self.compute_s = compute_s or compute_fn(rs)
        self.coster = coster or CollectiveCoster(rs)
        self.groups = {} if groups is None else groups
        self.mesh = mesh or mesh_key(rs)
        self.memo: dict[tuple[int, int], tuple[object, float]] = {}

    def __call__(self, op, rank: int) -> float:
        work = op.work
        hit = self.memo.get((id(work), rank))
        if hit is None or hit[0] is not work:
            hit = self.memo[(id(work), rank)] = (work, self._price(op, rank))
        return hit[1]

    def _price(self, op, rank: int) -> float:
        if isinstance(op.work, Collective):
            key = (self.mesh, op.work.group, rank)
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = self.rs.group(op.work.group, rank)
            latency_s, bandwidth_s, _ = self.coster(op, group)
            return latency_s + bandwidth_s
        return self.compute_s(op, rank)
