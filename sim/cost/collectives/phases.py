"""Algorithms as phase plans, evaluated once into a byte-independent structure.

A phase is a set of concurrent point-to-point flows, each carrying `frac x nbytes` bytes over a route
(link indices), plus the hops whose per-step latencies add up in one repetition of the phase. A plan is
a sequence of phases, each repeated `repeat` times back to back (ring steps are identical phases).

Evaluation (the only place rates are computed): the flows of a phase - this group's and those of every
concurrent symmetric copy - share link capacity max-min fairly (maxmin.py). Rates do not depend on the
byte count, so a phase reduces to `s_per_byte = max over own flows of frac / rate`, and

    time(S) = sum_phases repeat x (step latency + S x s_per_byte / bandwidth factor)

is a closed form in S: evaluating a plan costs O(flows of one phase), never O(bytes) or O(chunks).
Identical flows (same route and bytes) are merged into one flow of multiplicity m before max-min (exact:
identical flows rise and freeze together). Flows of one phase with different byte counts are given the
rates they would have if all ran for the whole phase (conservative for the shorter ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshsim.sim.core.units import US
from meshsim.sim.cost.collectives import cache, maxmin
from meshsim.sim.cost.collectives.maxmin import maxmin_rates
from meshsim.topologies.model import Topology


@dataclass(frozen=True)
class Hop:
    """Latency descriptor of one algorithm step: physical path latency (s) and NCCL link class."""

    path_s: float
    link_class: str  # "nvlink" | "pcie" | "network"


@dataclass(frozen=True)
class Flow:
    links: tuple[int, ...]
    frac: float  # bytes carried / nbytes of the collective


@dataclass(frozen=True)
class Phase:
    flows: tuple[Flow, ...]
    latency: tuple[tuple[Hop, float], ...]  # (hop, weight): step latency = sum weight x latency(hop)
    repeat: int = 1


@dataclass(frozen=True)
class Plan:
    algo: str
    phases: tuple[Phase, ...]
    launches: int = 1  # NCCL launches, each paying the base latency
    multi_node: bool = False  # the group spans more than one node


@dataclass(frozen=True)
class PhaseCost:
    repeat: int
    s_per_byte: float  # max over own flows of frac / rate, rates at link efficiency, protocol factor 1
    latency: tuple[tuple[Hop, float], ...]


@dataclass(frozen=True)
class PlanCost:
    """A plan with rates evaluated: everything needed for time(S) under any protocol."""

    algo: str
    phases: tuple[PhaseCost, ...]
    launches: int
    multi_node: bool
    link_s_per_byte: dict[int, float]  # busy time of each link per byte of nbytes (all copies), at capacity
    flows: int  # point-to-point flows evaluated (own + concurrent, before merging)

    @property
    def s_per_byte(self) -> float:
        return sum(p.repeat * p.s_per_byte for p in self.phases)


def link_class(topo: Topology, links: Sequence[int]) -> str:
    """NCCL link class of a route: network if it crosses IB, else NVLink if it uses any, else PCIe."""
    return class_of_kinds({topo.links[i].kind for i in links})


def class_of_kinds(kinds: set[str]) -> str:
    """The link class of a route whose links have these kinds (link_class)."""
    if "ib" in kinds:
        return "network"
    if "nvlink" in kinds or not kinds - {"internal"}:
        return "nvlink"
    return "pcie"


def hop_between(topo: Topology, src: int, dst: int) -> Hop:
    return path_hop(topo, topo.route(src, dst))


def path_hop(topo: Topology, links: Sequence[int]) -> Hop:
    return Hop(sum(topo.links[i].latency_us for i in links) * US, link_class(topo, links))


_CLASS_ORDER = {"nvlink": 0, "pcie": 1, "network": 2}  # the slowest hop: network, then PCIe, then NVLink
_INTERNAL = frozenset({"internal"})


def worst_hop(topo: Topology, routes: Sequence[Sequence[int]]) -> Hop:
    """max(path_hop(topo, r) for r in routes) by (class order, path_s), the first of equal ones: the same
    Hop (equal keys are equal hops), with each route's latency summed as path_hop sums it (left to right
    from 0) and its class found as link_class finds it (class_of_kinds, inline), from per-link lists
    instead of Link objects; a route of a lower class than the best so far cannot win, so its latency is
    not summed."""
    lat, kind = _link_columns(topo)
    best_order, best_s = -1, 0.0
    for links in routes:
        kinds = {kind[i] for i in links}
        order = 2 if "ib" in kinds else 0 if "nvlink" in kinds or kinds <= _INTERNAL else 1
        if order < best_order:
            continue
        path_s = sum(map(lat.__getitem__, links)) * US
        if order > best_order or path_s > best_s:  # (order, path_s) > the best key, as tuples compare
            best_order, best_s = order, path_s
    if best_order < 0:
        raise ValueError("worst_hop of no routes")
    return Hop(best_s, ("nvlink", "pcie", "network")[best_order])


def _link_columns(topo: Topology) -> tuple[list[float], list[str]]:
    """(latency_us, kind) of every link, in link order; memoized per topology."""
    tab = cache.table(topo, "link_columns")
    hit = tab.get(0)
    if hit is None:
        hit = cache.remember(tab, 0, ([lk.latency_us for lk in topo.links], [lk.kind for lk in topo.links]))
    return hit


def merge_plans(own: Plan, others: Sequence[Plan]) -> tuple[tuple[Phase, tuple[Flow, ...]], ...]:
    """Per phase of `own`: (own phase, flows of the concurrent copies' matching phases)."""
    merged = []
    for k, phase in enumerate(own.phases):
        extra = tuple(f for p in others if k < len(p.phases) for f in p.phases[k].flows)
        merged.append((phase, extra))
    return tuple(merged)


def evaluate(topo: Topology, own: Plan, others: Sequence[Plan], capacity_bps: Sequence[float]) -> PlanCost:
    """Rates of every phase (own + concurrent flows, max-min fair), reduced to byte-independent numbers."""
    phases, link_busy, nflows = [], {}, 0
    for phase, extra in merge_plans(own, others):
        s_per_byte, busy = _phase_rates(phase.flows, extra, capacity_bps)
        phases.append(PhaseCost(phase.repeat, s_per_byte, phase.latency))
        for li, sec in busy.items():
            link_busy[li] = link_busy.get(li, 0.0) + phase.repeat * sec
        nflows += len(phase.flows) + len(extra)
    return PlanCost(own.algo, tuple(phases), own.launches, own.multi_node, link_busy, nflows)


def _phase_rates(own: Sequence[Flow], extra: Sequence[Flow],
                 capacity_bps: Sequence[float]) -> tuple[float, dict[int, float]]:
    """(max over own flows of frac / rate, per-link busy seconds per byte) for one phase: the compiled
    transliteration (_maxmin.phase_rates) when it is built and covers the input, else the reference below;
    the same floats and the same dict order either way (tests/test_maxmin_compiled.py)."""
    if type(capacity_bps) is list:
        hit = maxmin.compiled_phase_rates(own, extra, capacity_bps)
        if hit is not None:
            return hit
    return _phase_rates_reference(own, extra, capacity_bps)


def _phase_rates_reference(own: Sequence[Flow], extra: Sequence[Flow],
                           capacity_bps: Sequence[float]) -> tuple[float, dict[int, float]]:
    """_phase_rates in Python: merge identical flows, fill max-min (maxmin_rates), sum each link's busy time."""
    keys: dict[tuple[tuple[int, ...], float], int] = {}
    mult: list[int] = []
    own_keys = set()
    for is_own, flows in ((True, own), (False, extra)):
        for f in flows:
            if not f.links or f.frac <= 0:
                continue
            key = (f.links, f.frac)
            idx = keys.setdefault(key, len(keys))
            if idx == len(mult):
                mult.append(0)
            mult[idx] += 1
            if is_own:
                own_keys.add(idx)
    items = list(keys)
    demands = [dict.fromkeys(links, float(mult[i])) for i, (links, _) in enumerate(items)]
    rates = maxmin_rates(demands, capacity_bps.__getitem__)
    s_per_byte = max((items[i][1] / rates[i] for i in own_keys), default=0.0)
    busy: dict[int, float] = {}
    for i, (links, frac) in enumerate(items):
        for li in links:
            busy[li] = busy.get(li, 0.0) + mult[i] * frac / capacity_bps[li]
    return s_per_byte, busy
