"""collective_cost: the time of one collective call, split into latency and bandwidth parts.

For a plan evaluated once per (topology, algorithm, op, group, concurrent groups, link efficiencies)
(phases.py), a protocol p and nbytes S:

    latency_s   = launches x base(p) + sum_phases repeat x sum_hops weight x max(path_s, hw(class, p)) x r
                  + fill
    bandwidth_s = S x sum_phases repeat x s_per_byte / scale(algo, p, S)

r = 1, except ring Simple inside a node: slices per chunk x loops (slice_rounds); fill: the Simple/LL128
pipeline fill per channel (_fill_s); scale: NCCL's protocol refinements (nccl_limits.py) or, for NVLS,
link time / max(link time, its kernel's loop time) (nvls_limits.py).

NCCL's per-step latency hw(class, p) is an end-to-end figure that already contains the wire and switch
latency, so a step costs the larger of the physical path latency and NCCL's figure, never their sum: the
protocol overhead added on top of the physical path is max(0, hw - path_s). Multi-node ring all-reduce
with Simple has its latency x 1.4 (tuning.cc). All constants: protocols.py.

link_load[l] = (bytes the collective and its concurrent copies put on l / (capacity x protocol factor))
/ bandwidth_s: the fraction of link l it keeps busy while its bandwidth part drains alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from meshsim.sim.core.errors import UserError, unknown_name_error
from meshsim.sim.core.units import GB
from meshsim.sim.cost.collectives import cache
from meshsim.sim.cost.collectives.channels import group_channels
from meshsim.sim.cost.collectives.choose import OPS, candidates
from meshsim.sim.cost.collectives.direct import direct_plan, shift_plan
from meshsim.sim.cost.collectives.groups import by_node
from meshsim.sim.cost.collectives.hierarchical import hierarchical_plan
from meshsim.sim.cost.collectives.nccl_limits import channels_used, generation, protocol_busbw_gbps
from meshsim.sim.cost.collectives.nvls import nvls_plan
from meshsim.sim.cost.collectives.nvls_limits import nvls_kernel_s
from meshsim.sim.cost.collectives.nvls_tree import nvls_tree_plan
from meshsim.sim.cost.collectives.nvls_tree_limits import nvls_tree_scale
from meshsim.sim.cost.collectives.phases import Plan, PlanCost, evaluate
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, IDEAL, NcclConstants, family
from meshsim.sim.cost.collectives.ring import ring_plan
from meshsim.sim.cost.collectives.sharing import sharing_groups
from meshsim.sim.cost.collectives.tree import tree_plan
from meshsim.topologies.fabric_items import link_values
from meshsim.topologies.model import Topology

SLICED_OPS = ("all_reduce", "all_gather", "reduce_scatter")  # ring ops whose chunks go in Simple slices
STATS = {"structures": 0, "flows": 0}  # plans evaluated and flows fed to max-min since import


@dataclass(frozen=True)
class CollectiveCost:
    op: str
    algo: str
    protocol: str
    nbytes: int
    ranks: int
    time_s: float
    latency_s: float
    bandwidth_s: float
    algbw_gbps: float
    busbw_gbps: float
    link_load: Mapping[int, float] = field(default_factory=dict, hash=False, compare=False)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests: busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all),
    1 (broadcast, reduce, and a ring shift "send_recv": each rank moves its whole buffer once). hardware-facts.md."""
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send_recv"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def build_plan(topo: Topology, algo: str, op: str, ranks: Sequence[int]) -> Plan:
    if algo == "ring":
        return ring_plan(topo, op, ranks)
    if algo == "tree":
        return tree_plan(topo, ranks)
    if algo == "nvls":
        return nvls_plan(topo, op, ranks)
    if algo == "nvls_tree":
        return nvls_tree_plan(topo, ranks)
    if algo == "hierarchical":
        return hierarchical_plan(topo, ranks)
    if algo == "direct":
        return shift_plan(topo, ranks) if op == "send_recv" else direct_plan(topo, ranks)
    raise ValueError(f"unknown algorithm {algo!r}")


def _capacity_bps(topo: Topology, eff: tuple[tuple[str, float], ...]) -> list[float]:
    """bw_gbps x GB x efficiency(kind) of every link, a fabric's once per template link, NIC link and leaf
    (topologies/fabric_items.link_values: no Link record built); memoized per efficiencies."""
    tab = cache.table(topo, "capacity")
    hit = tab.get(eff)
    if hit is None:
        by_kind = dict(eff)
        hit = cache.remember(tab, eff, link_values(topo, lambda bw, kind: bw * GB * by_kind[kind], ("bw_gbps", "kind")))
    return hit


def structure(topo: Topology, algo: str, op: str, ranks: Sequence[int],
              concurrent: Sequence[Sequence[int]] = (), constants: NcclConstants = DEFAULT_CONSTANTS) -> PlanCost:
    """The evaluated plan, memoized per (algo, op, group, concurrent groups that can share its links,
    link efficiencies); copies on links of their own are dropped first (sharing.py)."""
    groups = concurrent if type(concurrent) is Groups else tuple(tuple(g) for g in concurrent)
    return _structure(topo, algo, op, tuple(ranks), groups, _efficiencies(topo, constants))


def _efficiencies(topo: Topology, constants: NcclConstants) -> tuple[tuple[str, float], ...]:
    """The link efficiencies as a memo key: (kind, fraction of peak) sorted by kind."""
    return tuple(sorted(constants.efficiencies(topo.gpu).items()))


def _structure(topo: Topology, algo: str, op: str, ranks: tuple[int, ...], groups: tuple[tuple[int, ...], ...],
               eff: tuple[tuple[str, float], ...]) -> PlanCost:
    own = _own_plan(topo, algo, op, ranks)
    concurrent = sharing_groups(topo, own, ranks, groups)
    key = (algo, op, ranks, concurrent, eff)
    tab = cache.table(topo, "structure")
    hit = tab.get(key)
    if hit is None:
        others = [build_plan(topo, algo, op, g) for g in concurrent]
        hit = cache.remember(tab, key, evaluate(topo, own, others, _capacity_bps(topo, eff)))
        STATS["structures"] += 1
        STATS["flows"] += hit.flows
    return hit


def _own_plan(topo: Topology, algo: str, op: str, ranks: tuple[int, ...]) -> Plan:
    tab = cache.table(topo, "plan")
    key = (algo, op, ranks)
    hit = tab.get(key)
    return hit if hit is not None else cache.remember(tab, key, build_plan(topo, algo, op, ranks))


def latency_s(pc: PlanCost, op: str, protocol: str, constants: NcclConstants, ranks: int = 0,
              nbytes: int | None = None, channels: int = 1) -> float:
    """Launch base + per-step latencies (intra-node steps x slice_rounds for ring Simple) + pipeline fill."""
    rounds = slice_rounds(pc.algo, op, protocol, constants, ranks, nbytes, channels)
    steps, count = 0.0, 0.0
    for phase in pc.phases:
        step = sum(w * max(hop.path_s, constants.hw_s(pc.algo, hop.link_class, protocol))
                   * (1 if hop.link_class == "network" else rounds) for hop, w in phase.latency)
        steps += phase.repeat * step
        count += phase.repeat * sum(w for _, w in phase.latency)
    total = (pc.launches * constants.base_s(pc.algo, protocol) + steps
             + _fill_s(pc, op, protocol, constants, count, ranks, nbytes, channels))
    if pc.algo == "ring" and op == "all_reduce" and protocol == "simple" and pc.multi_node:
        total *= constants.ring_simple_internode_lat_factor
    return total


def slice_rounds(algo: str, op: str, protocol: str, constants: NcclConstants, ranks: int, nbytes: int | None,
                 channels: int) -> int:
    """Flag handshakes per ring step with Simple: slices per chunk x loops, loops = ceil(nbytes / (channels x
    ranks x chunk)) (protocols.SIMPLE_CHUNK_BYTES); 1 for the other algorithms, protocols and ops."""
    if algo != "ring" or protocol != "simple" or op not in SLICED_OPS or not nbytes or ranks < 2:
        return 1
    loops = math.ceil(nbytes / (max(1, channels) * ranks * constants.simple_chunk_bytes))
    return max(1, constants.simple_slices_per_chunk * loops)


def _fill_s(pc: PlanCost, op: str, protocol: str, constants: NcclConstants, steps: float, ranks: int,
            nbytes: int | None = None, channels: int = 1) -> float:
    """Simple/LL128 pipeline fill (protocols.SIMPLE_FILL_BYTES_PER_CHANNEL): per step, each channel's fill
    bytes at the channel's share of the bus bandwidth - steps x channels x min(fill, nbytes / (ranks x
    channels)) / busbw (a slice cannot exceed its chunk). NVLS (one switch round trip) and LL have none."""
    if protocol not in ("simple", "ll128") or family(pc.algo) == "nvls" or pc.s_per_byte <= 0 or ranks < 2:
        return 0.0
    busbw = busbw_factor(op, ranks) / pc.s_per_byte
    per_channel = constants.simple_fill_bytes_per_channel
    if nbytes is not None:
        per_channel = min(per_channel, nbytes / (ranks * max(1, channels)))
    return steps * max(1, channels) * per_channel / busbw if busbw > 0 else 0.0


def link_load(topo: Topology, pc: PlanCost, scale: float) -> Mapping[int, float]:
    """Busy fraction per link during the bandwidth part (see module doc); memoized per plan and factor."""
    tab = cache.table(topo, "load")
    key = (id(pc), scale)
    hit = tab.get(key)
    if hit is None or hit[0] is not pc:
        total = pc.s_per_byte
        load = {li: min(1.0, busy * scale / total) for li, busy in pc.link_s_per_byte.items()} if total > 0 else {}
        hit = cache.remember(tab, key, (pc, MappingProxyType(load)))
    return hit[1]


class Groups(tuple):
    """Concurrent groups as a tuple of rank tuples that hashes once: a collective_costs call keys the memos of
    each of its (algorithm, protocol) pairs on the same thousands of groups (16,384 ranks: 2,047 TP copies).
    Equal to, and hashing as, the plain tuple of the same groups."""

    def __new__(cls, groups):
        self = super().__new__(cls, groups)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


def _normalise_groups(ranks: Sequence[int], groups: Sequence[Sequence[int]]) -> Groups:
    """The concurrent groups of two ranks or more, less those of the group's own ranks (as a set). A group
    whose first rank is not the group's cannot be its set, so only the others are made sets."""
    mine = set(ranks)
    return Groups(tuple(g) for g in groups if len(g) >= 2 and (g[0] not in mine or set(g) != mine))


def _check_group(topo: Topology, op: str, ranks: Sequence[int]) -> None:
    if op not in OPS:
        raise unknown_name_error("op", op, OPS)
    if not ranks:
        raise UserError("ranks", list(ranks), "give at least one rank")
    n = topo.num_gpus
    bad = [r for r in ranks if not 0 <= r < n]
    if bad:
        raise UserError("ranks", bad[0], f"use ranks 0..{topo.num_gpus - 1} of {topo.name}")
    if len(set(ranks)) != len(ranks):
        raise UserError("ranks", list(ranks), "list each rank once")


@dataclass(frozen=True)
class GroupShape:
    """What the price of every (algorithm, protocol, size) reads of the group itself, worked out once per
    collective_costs call: NCCL's ring channels (channels.group_channels) and the nodes it spans."""

    channels: int
    nodes: int

    @classmethod
    def of(cls, topo: Topology, ranks: Sequence[int], constants: NcclConstants) -> GroupShape:
        return cls(group_channels(topo, ranks, constants), len(by_node(topo, ranks)))


def bandwidth_scale(topo: Topology, pc: PlanCost, op: str, protocol: str, nbytes: int, ranks: Sequence[int],
                    constants: NcclConstants, shape: GroupShape | None = None) -> float:
    """Achieved / max-min bus bandwidth for this (algorithm, protocol, size): NCCL's refinements
    (nccl_limits.protocol_busbw_gbps), or the flat factors when constants.protocol_limits is off. `shape`:
    GroupShape.of(topo, ranks, constants) when the caller has it."""
    if protocol == IDEAL or pc.s_per_byte <= 0:
        return 1.0
    if pc.algo == "nvls":  # link time / max(link time, the NVLS kernel's own loop time)
        kernel_s = nvls_kernel_s(topo.gpu, op, nbytes, len(ranks), constants.nvls_channels,
                                 constants.nvls_channel_gbps, constants.nvls_loop_overhead_us)
        link_s = nbytes * pc.s_per_byte
        return min(constants.bw_scale(pc.algo, op, protocol), link_s / kernel_s if kernel_s > link_s else 1.0)
    if pc.algo == "nvls_tree":
        return min(constants.bw_scale(pc.algo, op, protocol), nvls_tree_scale(topo, pc, ranks, nbytes, constants))
    if not constants.protocol_limits:
        return constants.bw_scale(pc.algo, op, protocol)
    raw_gbps = busbw_factor(op, len(ranks)) / pc.s_per_byte / GB
    shape = shape or GroupShape.of(topo, ranks, constants)
    algo = "tree" if pc.algo == "tree" else family(pc.algo)
    used = channels_used(nbytes, algo, protocol, len(ranks), shape.channels)
    eff = protocol_busbw_gbps(raw_gbps, algo=algo, op=op, protocol=protocol, gen=generation(topo.gpu),
                              nodes=shape.nodes, channels=shape.channels, used=used)
    return eff / raw_gbps


def priced(topo: Topology, op: str, ranks: Sequence[int], nbytes: int, algo: str, protocol: str,
           concurrent: Sequence[Sequence[int]], constants: NcclConstants, with_load: bool = True) -> CollectiveCost:
    """The cost of one (algorithm, protocol) pair; with_load=False leaves link_load empty and does not
    compute it (NVLS's load factor is per size, so a size sweep would build and memoize one map per size)."""
    pc = structure(topo, algo, op, ranks, concurrent, constants)
    cost, load = _priced(topo, op, ranks, nbytes, algo, protocol, pc, constants, GroupShape.of(topo, ranks, constants))
    return replace(cost, link_load=link_load(topo, pc, load)) if with_load else cost


def _priced(topo: Topology, op: str, ranks: Sequence[int], nbytes: int, algo: str, protocol: str, pc: PlanCost,
            constants: NcclConstants, shape: GroupShape) -> tuple[CollectiveCost, float]:
    """priced() on the evaluated plan `pc` and the group's shape: (the cost with link_load left empty, the
    load factor link_load(topo, pc, factor) takes)."""
    scale = bandwidth_scale(topo, pc, op, protocol, nbytes, ranks, constants, shape)
    lat = latency_s(pc, op, protocol, constants, len(ranks), nbytes, shape.channels)
    bw = nbytes * pc.s_per_byte / scale
    time = lat + bw
    algbw = nbytes / time / GB if time > 0 else 0.0
    # NVLS's channel bound leaves its links partly idle; the other algorithms load theirs at the flat factor
    load = scale if family(algo) == "nvls" else constants.bw_scale(algo, op, protocol) / constants.bw_factor[protocol]
    return CollectiveCost(op, algo, protocol, nbytes, len(ranks), time, lat, bw, algbw,
                          algbw * busbw_factor(op, len(ranks)), {}), load


def collective_cost(topo: Topology, op: str, ranks: Sequence[int], nbytes: int, *, algo: str = "auto",
                    protocol: str = "auto", concurrent_groups: Sequence[Sequence[int]] = (), tuning=None,
                    constants: NcclConstants | None = None, link_loads: bool = True) -> CollectiveCost:
    """Predicted time of `op` over `ranks` moving `nbytes` (nccl-tests convention), with the (algorithm,
    protocol) NCCL would pick - the fastest predicted - unless forced. `concurrent_groups` run the same
    collective at the same time and share links with it. A group of one rank or 0 bytes costs 0.
    link_loads=False leaves link_load empty (a size sweep's rows need only the times: the copy of a
    16,384-rank plan's link loads was most of each size's cost); every other figure is the same."""
    return collective_costs(topo, op, ranks, (nbytes,), algo=algo, protocol=protocol,
                            concurrent_groups=concurrent_groups, tuning=tuning, constants=constants,
                            link_loads=link_loads)[0]


def collective_costs(topo: Topology, op: str, ranks: Sequence[int], sizes: Sequence[int], *, algo: str = "auto",
                     protocol: str = "auto", concurrent_groups: Sequence[Sequence[int]] = (), tuning=None,
                     constants: NcclConstants | None = None, link_loads: bool = True) -> list[CollectiveCost]:
    """collective_cost of each size in `sizes`, the group checked, its candidates chosen and its concurrent
    groups normalised once (what does not depend on the size): a size sweep over 16,384 ranks would
    otherwise scan the group per size. Each result is the one collective_cost returns for that size."""
    ranks = tuple(int(r) for r in ranks)
    _check_group(topo, op, ranks)
    for nbytes in sizes:
        _check_bytes(nbytes)
    if len(ranks) < 2:
        return [CollectiveCost(op, "none", "none", n, len(ranks), 0.0, 0.0, 0.0, 0.0, 0.0, {}) for n in sizes]
    pairs = candidates(topo, op, ranks, algo, protocol, tuning) if any(sizes) else ()  # 0 bytes: no choice
    consts = (constants or DEFAULT_CONSTANTS).with_tuning(tuning)
    group = _Group(topo, op, ranks, _normalise_groups(ranks, concurrent_groups), consts)
    return [_best(group, nbytes, pairs, link_loads) for nbytes in sizes]


class _Group:
    """One collective_costs call's group: what every (algorithm, protocol, size) of it reads, made once -
    its shape (GroupShape) and, per algorithm, its evaluated plan (_structure) - each on first use, so a
    call raises where, and only if, the per-pair path did."""

    def __init__(self, topo: Topology, op: str, ranks: tuple[int, ...], concurrent: Groups, consts: NcclConstants):
        self.topo, self.op, self.ranks, self.concurrent, self.consts = topo, op, ranks, concurrent, consts
        self._shape: GroupShape | None = None
        self._eff: tuple | None = None
        self._plans: dict[str, PlanCost] = {}

    def shape(self) -> GroupShape:
        if self._shape is None:
            self._shape = GroupShape.of(self.topo, self.ranks, self.consts)
        return self._shape

    def plan(self, algo: str) -> PlanCost:
        pc = self._plans.get(algo)
        if pc is None:
            if self._eff is None:
                self._eff = _efficiencies(self.topo, self.consts)
            pc = self._plans[algo] = _structure(self.topo, algo, self.op, self.ranks, self.concurrent, self._eff)
        return pc


def _check_bytes(nbytes: int) -> None:
    if nbytes < 0:
        raise UserError("nbytes", nbytes, "use a size >= 0 bytes")


def _best(group: _Group, nbytes: int, pairs: Sequence[tuple[str, str]], link_loads: bool) -> CollectiveCost:
    """The fastest predicted of `pairs` at `nbytes` (0 bytes: costs 0), its link loads (a plain dict the
    caller may change) made for it alone: priced() of each pair, the losers' loads never read."""
    topo, op, ranks = group.topo, group.op, group.ranks
    if nbytes == 0:
        return CollectiveCost(op, "none", "none", nbytes, len(ranks), 0.0, 0.0, 0.0, 0.0, 0.0, {})
    best: tuple[CollectiveCost, PlanCost, float] | None = None
    for a, p in pairs:
        pc = group.plan(a)
        cost, load = _priced(topo, op, ranks, nbytes, a, p, pc, group.consts, group.shape())
        if best is None or cost.time_s < best[0].time_s:
            best = (cost, pc, load)
    assert best is not None
    cost, pc, load = best
    return replace(cost, link_load=dict(link_load(topo, pc, load)) if link_loads else {})
