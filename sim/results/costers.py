"""What the engine is handed to price a step's ops, built from one ResolvedScenario: pure cost functions
(sim/cost) wrapped as the engine's callables and memoized.

- `CollectiveCoster`: collective(op, group) -> (latency_s, bandwidth_s, link_load), memoized per (op, group
  kind, group, nbytes, kernel), costed on the real group with every other group of the same kind as
  concurrent (symmetric contention is in the cost); the hardware profile's measured table first (its time
  split into the analytic latency part, capped at the measured time, and a bandwidth part that contends for
  links), else the analytic model with hardware.network's algo / protocol / tuning. A group in a later
  block of the fabric that repeats the first exactly is priced as its translated copy in the first block
  (sim/results/fabric_blocks.py). `rows` / `chosen` give the per-collective report rows.
- `P2PCoster`: pipeline transfers on their real route, the other (tp, dp) positions' copies concurrent.
- `compute_fn`: kernel time per op (sim/cost/compute.py), memoized by the identity of the op's work.
- `comm_interference` (kappa) and `host_issue_times` (sim/cost/host_dispatch.py): the scenario's value,
  else the profile's, else the default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter

import numpy as np

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.cost.calibrated import table_collective_time_s
from meshsim.sim.cost.collectives import collective_cost
from meshsim.sim.cost.collectives.cost import Groups
from meshsim.sim.cost.collectives.flex import flex_arguments
from meshsim.sim.cost.collectives.p2p import p2p_cost
from meshsim.sim.cost.compute import ComputeModel, resolve_tuning
from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import events as engine
from meshsim.sim.results.fabric_blocks import FabricBlocks
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.schedule.ops import Collective, Op, Schedule
from meshsim.sim.schedule.shapes import UB_PIPELINE_SPLITS, USERBUFFERS
from meshsim.topologies.fabric import FabricRouter
from meshsim.topologies.model import Topology


def network_tuning(rs: ResolvedScenario):
    """hardware.network, with fields the scenario leaves unset taken from the profile's network section."""
    mine = rs.scenario.hardware.network
    if rs.profile is None:
        return mine
    theirs = rs.profile.network.model_dump(exclude_unset=True)
    return mine.model_copy(update={k: v for k, v in theirs.items() if k not in mine.model_fields_set})


# _compute's results by everything it reads, for every coster of the process (CollectiveCoster._shared);
# at most MAX_SHARED_PRICES of them holding at most MAX_SHARED_LOADS link loads together (a price on a
# 16,384-GPU fabric loads thousands of links), the oldest dropped first
SHARED_PRICES: dict[tuple, tuple[object, object, tuple[engine.CommTiming, CollectiveRow]]] = {}
MAX_SHARED_PRICES = 8192
MAX_SHARED_LOADS = 1 << 20
_shared_loads = [0]  # link loads SHARED_PRICES holds (its entries' sizes)


def clear_shared_prices() -> None:
    SHARED_PRICES.clear()
    _shared_loads[0] = 0


def _remember(key: tuple, entry: tuple) -> None:
    if not SHARED_PRICES:
        _shared_loads[0] = 0
    old = SHARED_PRICES.pop(key, None)
    if old is not None:
        _shared_loads[0] -= len(old[2][0][2])
    SHARED_PRICES[key] = entry
    _shared_loads[0] += len(entry[2][0][2])
    while SHARED_PRICES and (len(SHARED_PRICES) > MAX_SHARED_PRICES or _shared_loads[0] > MAX_SHARED_LOADS):
        _shared_loads[0] -= len(SHARED_PRICES.pop(next(iter(SHARED_PRICES)))[2][0][2])  # the oldest first


class CollectiveCoster:
    """collective(op, group) -> (latency_s, bandwidth_s, link_load), memoized per (op, kind, group, nbytes, kernel).

    What the pure cost depends on, and so the memo key: the topology, the network tuning and the profile are
    fixed per coster; the rest is (op, the group's ranks, nbytes) for the model, the group kind (it picks the
    concurrent groups, `rs.all_groups(kind, group[0])`, and names the report row), and the kernel (userbuffers
    chunking, the flex dispatcher's arguments). The measured table reads (op, group size, nbytes)."""

    by_value = True  # the engine may reuse a timing per (work, group): the memo returns the same object (_core.pyx)

    def __init__(self, rs: ResolvedScenario, translate: bool = True):
        self.rs = rs
        self.tuning = network_tuning(rs)
        self.blocks = FabricBlocks.of(rs) if translate else None
        self.memo: dict[tuple[str, str, tuple[int, ...], int, str], tuple[engine.CommTiming, CollectiveRow]] = {}
        self.tuning_key = (type(self.tuning).__qualname__, self.tuning.model_dump_json())
        self.concurrent: dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], ...]] = {}
        self.moves: dict[tuple[str, tuple[int, ...]], tuple | None] = {}  # _move's memo
        self.translate_blocks = self.translate_leaves = translate

    def __call__(self, op: Op, group: tuple[int, ...]) -> engine.CommTiming:
        work = op.work  # the memo read inline (the engine calls this per collective op and rank)
        hit = self.memo.get((work.op, work.group, group, work.nbytes, work.kernel))
        return (hit if hit is not None else self.cost(work, group))[0]

    def cost(self, work: Collective, group: tuple[int, ...]) -> tuple[engine.CommTiming, CollectiveRow]:
        key = (work.op, work.group, group, work.nbytes, work.kernel)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._translated(work, group) or self._shared(work, group)
        return hit

    def _shared(self, work: Collective, group: tuple[int, ...]) -> tuple[engine.CommTiming, CollectiveRow]:
        """_compute(work, group), looked up first among the prices every coster of this process made
        (SHARED_PRICES): a sweep's configurations share their topology and profile objects (scenarios/load.py
        caches them) and most of their collectives. The key is everything _compute reads: the topology and
        profile (by identity, checked on a hit), the network tuning (by value), the work's op, group kind,
        bytes and kernel, the group and its concurrent groups."""
        rs = self.rs
        key = (id(rs.topology), id(rs.profile), self.tuning_key, work.op, work.group, group, work.nbytes,
               work.kernel, self._concurrent(work.group, group))
        hit = SHARED_PRICES.get(key)
        if hit is not None and hit[0] is rs.topology and hit[1] is rs.profile:
            return hit[2]
        priced = self._compute(work, group)
        _remember(key, (rs.topology, rs.profile, priced))  # (kept alive: their ids stay theirs)
        return priced

    def _translated(self, work: Collective, group: tuple[int, ...]) -> tuple[engine.CommTiming, CollectiveRow] | None:
        """The cost of the group's copy earlier on the fabric (_move), its link loads moved back to the group's
        own links; None when no copy qualifies (then it is priced directly)."""
        move = self._move(work.group, group)
        if move is None:
            return None
        shift, offsets = move
        (latency_s, bandwidth_s, load), row = self.cost(work, tuple(r - shift for r in group))
        return (latency_s, bandwidth_s, moved_loads(self.rs.topology.router, load, offsets)), row

    def _move(self, kind: str, group: tuple[int, ...]) -> tuple[int, tuple[int, int, int]] | None:
        """(ranks to move the group back by, what that adds to node, NIC and uplink indices) to its exact copy:
        in the fabric's first block (fabric_blocks.py), else in its own leaf (leaf_move); None when neither
        qualifies. Memoized per (kind, group): it reads only them and what the coster fixes (its topology,
        blocks and concurrent groups)."""
        key = (kind, group)
        if key not in self.moves:
            self.moves[key] = self._move_of(kind, group)
        return self.moves[key]

    def _move_of(self, kind: str, group: tuple[int, ...]) -> tuple[int, tuple[int, int, int]] | None:
        if kind == "embed" or not isinstance(self.rs.topology.router, FabricRouter):
            return None
        blocks = self.blocks
        shift = blocks.shift(group) if blocks is not None and self.translate_blocks else 0
        if shift and self._copies_move(kind, group, shift) and all(blocks.shift(g) == shift
                                                                   for g in self._concurrent(kind, group)):
            return shift, block_offsets(blocks, shift)
        shift = leaf_move(self.rs.topology, [group, *self._concurrent(kind, group)], self.rs.stage_size) \
            if self.translate_leaves else 0
        if shift and self._copies_move(kind, group, shift):
            return shift, leaf_offsets(self.rs.topology.router, shift)
        return None

    def _copies_move(self, kind: str, group: tuple[int, ...], shift: int) -> bool:
        """The concurrent groups of the group's copy `shift` ranks back are its own, moved."""
        moved = tuple(tuple(r - shift for r in g) for g in self._concurrent(kind, group))
        return self._concurrent(kind, tuple(r - shift for r in group)) == moved

    def _concurrent(self, kind: str, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The groups of `kind` that run beside `group` (rs.all_groups less itself), made once per coster:
        the shared-price key, _translated and _compute all read them (thousands of groups at 16,384 GPUs),
        as a cost.Groups (a tuple that hashes once: every shared-price key holds it)."""
        hit = self.concurrent.get((kind, group))
        if hit is None:
            hit = self.concurrent[(kind, group)] = Groups(g for g in self.rs.all_groups(kind, group[0]) if g != group)
        return hit

    def _compute(self, work: Collective, group: tuple[int, ...]) -> tuple[engine.CommTiming, CollectiveRow]:
        row = CollectiveRow(work.op, work.group, len(group), work.nbytes, work.kernel)
        if len(group) < 2 or work.nbytes == 0:
            return (0.0, 0.0, {}), replace(row, algo="none", protocol="none", source="trivial")

        # a userbuffers pipeline chunk: 1/k of the whole message's time (sim/schedule/shapes.py, USERBUFFERS)
        parts, kernel = (UB_PIPELINE_SPLITS, "nccl") if work.kernel == USERBUFFERS else (1, work.kernel)
        whole = replace(work, nbytes=work.nbytes * parts, kernel=kernel)
        # the scenario's algo/protocol are preferences (tuning): applied where they can serve the op
        c = collective_cost(self.rs.topology, work.op, group, whole.nbytes,
                            concurrent_groups=self._concurrent(work.group, group), tuning=self.tuning,
                            **flex_arguments(kernel, self.rs.topology))
        latency_s, bandwidth_s, source = c.latency_s, c.time_s - c.latency_s, "model"
        measured_s = self._measured_s(whole, len(group))
        if measured_s is not None:
            latency_s = min(c.latency_s, measured_s)
            bandwidth_s, source = measured_s - latency_s, "calibrated"
        latency_s, bandwidth_s = latency_s / parts, bandwidth_s / parts
        total_s = latency_s + bandwidth_s
        algbw = work.nbytes / total_s / 1e9 if total_s > 0 else 0.0
        busbw = c.busbw_gbps * (c.time_s / parts / total_s) if total_s > 0 else 0.0
        row = replace(row, algo=c.algo, protocol=c.protocol, time_us=total_s * 1e6, algbw_gbps=algbw,
                      busbw_gbps=busbw, source=source)
        return (latency_s, max(0.0, bandwidth_s), c.link_load), row  # collective_cost's own fresh dict

    def _measured_s(self, work: Collective, ranks: int) -> float | None:
        if self.rs.profile is None or not self.rs.profile.collective_table:
            return None

        return table_collective_time_s(self.rs.profile, work.op, ranks, work.nbytes)

    def chosen(self, schedule: Schedule, rank: int = 0) -> list[CollectiveRow]:
        """One row per distinct collective of the representative rank, with its count per step."""
        return self.rows(collective_counts(schedule), rank)

    def rows(self, counts: Mapping[tuple, int], rank: int = 0) -> list[CollectiveRow]:
        """One row per (op, group, nbytes[, kernel]) with its count per step."""
        group_of = self.rs.group  # rank -> its real TP, DP or KV group
        rows = []
        for key, n in sorted(counts.items()):
            kind, gname, nbytes = key[:3]
            kernel = key[3] if len(key) > 3 else "nccl"
            _, row = self.cost(Collective(kind, gname, nbytes, kernel=kernel), group_of(gname, rank))
            rows.append(replace(row, count=n))
        return rows


def block_offsets(blocks: FabricBlocks, shift: int) -> tuple[int, int, int]:
    """What blocks.link(li, shift) adds to node links, NIC links and uplinks (one constant each: fabric_blocks.py)."""
    router = blocks.router
    return tuple(blocks.link(start, shift) - start for start in (0, router.ib_base, router.uplink_base))


def leaf_move(topo: Topology, groups: Sequence[tuple[int, ...]], stage_size: int) -> int:
    """Ranks by which `groups` (a group and its concurrent groups) move back to their copy in the first stage
    of their leaf, or 0. Inside one leaf every node is alike: node n's links, its NICs' links and their rail
    leaves' uplinks play the same part for node n - d (fabric.py); moving whole nodes d back, all in the same
    leaf before and after, keeps every rank's local index and rail, every route's links' bandwidths, latencies
    and kinds in order, the ranks' order and each node's rank counts: what the pure cost reads. So the move
    qualifies when it is a whole number of nodes and stages, every rank of `groups` and its image lie in one
    leaf, and the image is not the groups themselves (the coster checks the copy's concurrent groups)."""
    router = topo.router
    per_node = topo.gpus_per_node
    leaf_ranks = router.nodes_per_leaf * per_node
    ranks = [r for g in groups for r in g]
    lo, hi = min(ranks), max(ranks)
    first = lo - lo % leaf_ranks  # the leaf's first rank
    if hi >= first + leaf_ranks:
        return 0
    stage = lo - lo % stage_size
    base = first + -first % stage_size  # the leaf's first whole stage
    shift = stage - base
    if shift <= 0 or shift % per_node or lo - shift < first:
        return 0
    return shift


def leaf_offsets(router: FabricRouter, shift: int) -> tuple[int, int, int]:
    """What moving whole nodes `shift` ranks back inside one leaf adds to node, NIC and uplink indices
    (fabric.multiply's layout: node n's links n x node_links + k, NIC links 2 (n x rails + r) on from
    ib_base; a leaf's own uplinks do not move)."""
    nodes = shift // router.node.gpus_per_node
    return nodes * router.node_links, 2 * router.rails * nodes, 0


def moved_loads(router: FabricRouter, load: Mapping[int, float], offsets: tuple[int, int, int]) -> dict[int, float]:
    """The link loads of a copy moved onto the original's links: each index plus its range's offset (node
    links, NIC links, uplinks)."""
    ib, up = router.ib_base, router.uplink_base
    node_off, ib_off, up_off = offsets
    return {li + (node_off if li < ib else ib_off if li < up else up_off): v for li, v in load.items()}


def collective_key(work: Collective) -> tuple:
    """(op, group, nbytes), plus the kernel for the flex dispatcher's fused kernels."""
    base = (work.op, work.group, work.nbytes)
    return base if work.kernel == "nccl" else (*base, work.kernel)


def collective_counts(schedule: Schedule) -> Counter:
    """collective_key -> how many times the schedule issues it (count_collectives, over its WorkTable)."""
    table = schedule.work_table
    per_work = np.bincount(table.index, minlength=len(table.works)).tolist()
    out: Counter = Counter()
    for work, n in zip(table.works, per_work, strict=True):
        if isinstance(work, Collective):
            out[collective_key(work)] += n
    return out


def count_collectives_between(schedule: Schedule, lo: int, hi: int) -> Counter:
    """count_collectives(schedule.ops[lo:hi]) over the schedule's WorkTable (no op record read): the same
    counts, keys in the order of the works' first use in the schedule (a Counter compares without order)."""
    table = schedule.work_table
    per_work = np.bincount(table.index[lo:hi], minlength=len(table.works)).tolist()
    out: Counter = Counter()
    for work, n in zip(table.works, per_work, strict=True):
        if n and isinstance(work, Collective):
            out[collective_key(work)] += n
    return out


def count_collectives(ops: Iterable[Op]) -> Counter:
    """collective_key -> how many of `ops` are that collective. Counted per work object (ops stamped from one
    template share it), then per key in the order the works first occur: the order, and the counts, of
    counting op by op (count_collectives_per_op, which tests compare it with)."""
    works = list(map(_WORK, ops))
    per_work = Counter(map(id, works))
    out: Counter = Counter()
    for work in dict(zip(map(id, works), works, strict=True)).values():
        if isinstance(work, Collective):
            out[collective_key(work)] += per_work[id(work)]
    return out


def count_collectives_per_op(ops: Iterable[Op]) -> Counter:
    """count_collectives the long way, op by op (the reference)."""
    return Counter(collective_key(op.work) for op in ops if isinstance(op.work, Collective))


_WORK = attrgetter("work")


class P2PCoster:
    """p2p(src, dst, nbytes) -> (latency_s, bandwidth_s, link_load), memoized; concurrent copies: the same
    transfer between every other (tp, dp) position of the two stages. A transfer whose two stages lie under
    full leaves in blocks k, k + 1 >= 1 (or one block k >= 1) of the fabric (sim/results/fabric_blocks.py) is
    priced as its copy k blocks back, and one whose two stages lie in one leaf as its copy in the leaf's first
    stages (leaf_move), its link loads moved back: both moves map the two stages, every copy's route and each
    link's bandwidth, latency and kind onto the copy's, in order (tests/test_price_p2p.py and
    tests/test_price_leaf_moves.py check memo == direct)."""

    def __init__(self, rs: ResolvedScenario, translate: bool = True):
        self.rs = rs
        self.tuning = network_tuning(rs)
        self.blocks = FabricBlocks.of(rs) if translate else None
        self.translate_leaves = translate and isinstance(rs.topology.router, FabricRouter)
        self.memo: dict[tuple[int, int, int], engine.CommTiming] = {}

    def __call__(self, src: int, dst: int, nbytes: int) -> engine.CommTiming:
        key = (src, dst, nbytes)
        hit = self.memo.get(key)
        if hit is None:
            move = self.move(src, dst)
            if move is not None:
                shift, offsets = move
                latency_s, bandwidth_s, load = self(src - shift, dst - shift, nbytes)
                hit = self.memo[key] = (latency_s, bandwidth_s, moved_loads(self.rs.topology.router, load, offsets))
            else:
                size = self.rs.stage_size
                src0, dst0 = src - src % size, dst - dst % size
                copies = [(src0 + i, dst0 + i) for i in range(size)]
                c = p2p_cost(self.rs.topology, src, dst, nbytes, concurrent=copies, tuning=self.tuning)
                hit = self.memo[key] = (c.latency_s, c.bandwidth_s, dict(c.link_load))
        return hit

    def move(self, src: int, dst: int) -> tuple[int, tuple[int, int, int]] | None:
        """(ranks, index offsets) to the transfer's copy (class doc): whole blocks back to the lower stage's
        first block when both stages end under full leaves, else whole stages back inside their leaf
        (leaf_move); None when neither applies (priced directly)."""
        if self.blocks is None and not self.translate_leaves:
            return None
        size = self.rs.stage_size
        lo, hi = sorted((src - src % size, dst - dst % size))
        blocks = self.blocks
        if blocks is not None and hi + size <= blocks.full and lo >= blocks.block:
            shift = lo - lo % blocks.block
            return shift, block_offsets(blocks, shift)
        shift = leaf_move(self.rs.topology, [(lo, lo + size - 1), (hi, hi + size - 1)], size)
        return (shift, leaf_offsets(self.rs.topology.router, shift)) if shift else None


def compute_fn(rs: ResolvedScenario) -> engine.ComputeFn:
    """compute_s(op, rank) from the compute model (sim/cost/compute.py), memoized per work item (by value in
    the model, and by identity here: the same object, the same time)."""
    model = ComputeModel(rs.gpu, rs.scenario.hardware.compute, rs.profile,  # memoizes per work itself
                         fill_uninitialized=rs.scenario.run.deterministic, fp8_recipe=rs.scenario.run.fp8,
                         fp8_gemm_rate=rs.fp8_gemm_rate)

    memo: dict[int, tuple[object, float]] = {}  # id(work) -> (the work, kept alive so its id stays its own; time)

    def compute_s(op: Op, rank: int) -> float:
        work = op.work  # ops stamped from one template share their work: look it up by identity, not by hash
        hit = memo.get(id(work))
        if hit is None or hit[0] is not work:
            hit = memo[id(work)] = (work, model.time_s(work))
        return hit[1]

    compute_s.by_work = True  # the same time for every op of one work on every rank (sim/engine/compiled.py)
    return compute_s


def comm_interference(rs: ResolvedScenario) -> float:
    """kappa (sim/engine/events.py): hardware.compute.comm_interference, else the profile's compute section's
    (what `meshsim calibrate` measured), else 0.0 (no interference)."""
    return resolve_tuning(rs.scenario.hardware.compute, rs.profile).comm_interference or 0.0


def host_issue_times(rs: ResolvedScenario, schedule: Schedule) -> tuple[float, ...]:
    """When the host issues each op (sim/cost/host_dispatch.py): hardware.compute.host_dispatch_us, else the
    profile's, else the default, per op; none under run.cuda_graphs."""
    if rs.scenario.run.cuda_graphs:
        return ()
    us = resolve_tuning(rs.scenario.hardware.compute, rs.profile).host_dispatch_us or 0.0
    return issue_times_s(schedule, us * 1e-6)
