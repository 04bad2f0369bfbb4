"""Count collectives where they leave Python: torch.distributed's functions are wrapped for the
duration of a step, and each call is recorded with the tag (validate/stack/comm.py) active at the time.

A record's name follows the schedule's op names (sim/schedule/builder.py, sim/schedule/dp_ops.py):
"<block>.mb<m>.<phase>.<key>" inside a micro-batch ("L0.mb0.fwd.attn_in", "head.mb0.bwd.head_in_regather"),
"<block>.<key>" after backward ("opt.ln_grad", "dp.bucket0.all_reduce"). Sizes are compared in elements:
the schedule counts activation collectives in the model dtype (2 bytes) and gradient / cross-entropy
ones in fp32 (4 bytes), MoE collectives by what they carry (sim/schedule/moe_shapes.element_bytes: rows
in the model dtype, routing probabilities fp32, token counts int64), while the CPU run may use another
dtype. An all-to-all's size is its send buffer (nccl-tests' count). The MoE dispatcher's sizes follow the
routing, which differs from rank to rank; the schedule states them at model.moe.imbalance (1.0 in the
shrunk scenario: every rank receives what it sends). `mean_routed_sizes` therefore compares their mean
over the ranks that issue them, which equals the schedule's figure for any dropless routing (every rank
sends its T k rows, so the rows received sum to the rows sent); `routing_imbalance` reports the real
max / mean.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import asdict, dataclass

import torch.distributed as dist

from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.core.units import FP32_BYTES
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.duality import DUALITY
from meshsim.sim.schedule.moe_shapes import PROB_KEYS, ROW_KEYS
from meshsim.sim.schedule.moe_shapes import element_bytes as moe_element_bytes
from meshsim.sim.schedule.ops import P2P, Collective, Schedule
from meshsim.validate.stack.comm import current_stand_in, current_tag

# torch.distributed function -> schedule op name; numel is the total (gathered) size, as nccl-tests counts
PATCHED = {
    "all_reduce": "all_reduce", "all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "all_to_all_single": "all_to_all", "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
}
LIST_ARG = {"all_gather": 0, "reduce_scatter": 1}  # list-of-tensors calls: the list's position


@dataclass(frozen=True)
class CallRecord:
    name: str
    op: str
    group: str  # "tp", "dp", "kv" (GQA replica group) or "world"
    ranks: int
    numel: int


def _numel(name: str, args: tuple, kwargs: dict) -> int:
    """The buffer (all-reduce), the total gathered size (all-gather, reduce-scatter; a list call: the sum of
    its list) or the send buffer (all-to-all)."""
    if name == "all_to_all_single":
        return (args[1] if len(args) > 1 else kwargs["input"]).numel()
    if name in LIST_ARG:
        return sum(t.numel() for t in args[LIST_ARG[name]])
    tensors = list(args[:2]) + [kwargs[k] for k in ("output", "output_tensor", "input", "input_tensor", "tensor")
                                if k in kwargs]
    return max(t.numel() for t in tensors if hasattr(t, "numel"))


def op_name(tag, micro_batch: int = 0) -> str:
    if tag.phase == "opt":
        return f"{tag.block}.{tag.key}"
    mb = micro_batch if tag.micro_batch is None else tag.micro_batch
    return f"{tag.block}.mb{mb}.{tag.phase}.{tag.key}"


@contextlib.contextmanager
def count_collectives(group_names: dict[int, str], micro_batch: int = 0):
    """Wrap torch.distributed's collectives; yields the list the calls are appended to.
    group_names maps id(process group) -> "tp" / "dp" / "kv" / an expert kind. Nested calls (one API calling
    another) count once; the calls of a comm.counted_as block count as the one collective they stand for."""
    records: list[CallRecord] = []
    depth = [0]
    originals = {name: getattr(dist, name) for name in PATCHED if hasattr(dist, name)}

    def record(name, args, kwargs):
        group, stand = kwargs.get("group"), current_stand_in()
        if stand is not None and stand.counted:
            return
        op, numel = (stand.op, stand.numel) if stand is not None else (PATCHED[name], _numel(name, args, kwargs))
        records.append(CallRecord(op_name(current_tag(), micro_batch), op, group_names.get(id(group), "world"),
                                  dist.get_world_size(group), numel))
        if stand is not None:
            stand.counted = True

    def wrap(name, fn):
        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                record(name, args, kwargs)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield records
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def element_bytes(work: Collective, dtype_bytes: int, key: str = "") -> int:
    """Bytes per element the schedule assumed: an MoE collective's by its op key (moe_shapes.element_bytes),
    the model dtype for boundary traffic, fp32 otherwise."""
    moe = moe_element_bytes(key, dtype_bytes)
    if moe is not None:
        return moe
    return dtype_bytes if work.boundary in DUALITY or work.boundary == K.SP_REGATHER else FP32_BYTES


def group_size(schedule: Schedule, kind: str) -> int:
    """Ranks of a schedule's symbolic group, by sim/core/mesh.py's rule (every group of a kind has this size)."""
    return len(mesh_group(kind, 0, schedule.tp, schedule.dp, schedule.kv_replicas, schedule.pp, schedule.ep,
                          schedule.etp))


def schedule_records(schedule: Schedule, dtype_bytes: int, micro_batch: int | None = 0) -> list[CallRecord]:
    """The schedule's collectives of one micro-batch (None: every micro-batch) and the step end as
    CallRecords."""
    out = []
    for op in schedule.ops:
        if not isinstance(op.work, Collective) or op.micro_batch not in (None, micro_batch) and micro_batch is not None:
            continue
        per = element_bytes(op.work, dtype_bytes, op.name.rsplit(".", 1)[-1])
        out.append(CallRecord(op.name, op.work.op, op.work.group, group_size(schedule, op.work.group),
                              op.work.nbytes // per))
    return out


ROUTED_KEYS = frozenset(ROW_KEYS + PROB_KEYS)  # MoE collectives whose sizes follow the routing


def _routed(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ROUTED_KEYS


def mean_routed_sizes(per_rank: list[list[dict]]) -> list[list[dict]]:
    """Every rank's calls with each routed MoE collective's size replaced by its mean over the ranks that
    issue it (module docstring); an uneven mean stays a float, so it differs from the schedule's."""
    sizes: dict[str, list[int]] = {}
    for calls in per_rank:
        for c in calls:
            if _routed(c["name"]):
                sizes.setdefault(c["name"], []).append(c["numel"])
    mean = {n: sum(v) // len(v) if sum(v) % len(v) == 0 else sum(v) / len(v) for n, v in sizes.items()}
    return [[{**c, "numel": mean[c["name"]]} if c["name"] in mean else c for c in calls] for calls in per_rank]


def routing_imbalance(per_rank: list[list[dict]]) -> float | None:
    """Max over ranks / mean of the rows the experts received (each forward combine's send buffer), the worst
    MoE layer's; None without an expert-parallel all-to-all."""
    sizes: dict[str, list[int]] = {}
    for calls in per_rank:
        for c in calls:
            if c["name"].endswith(f".fwd.{K.MOE_COMBINE}"):
                sizes.setdefault(c["name"], []).append(c["numel"])
    ratios = [max(v) * len(v) / sum(v) for v in sizes.values() if sum(v)]
    return max(ratios) if ratios else None


def compare_records(real: list[dict | CallRecord], planned: list[dict | CallRecord]) -> list[str]:
    """Differences between the counted calls and the schedule's, one line each (empty = equal)."""
    def key(r):
        r = r if isinstance(r, dict) else asdict(r)
        return r["name"], r["op"], r["group"], r["ranks"], r["numel"]

    have, want = Counter(map(key, real)), Counter(map(key, planned))
    lines = []
    for k in sorted(set(have) | set(want)):
        if have[k] != want[k]:
            name, op, group, ranks, numel = k
            lines.append(f"{name}: {op} on {group}({ranks}) of {numel} elements: counted {have[k]}, "
                         f"schedule {want[k]}")
    return lines


def per_block_counts(records: list[dict | CallRecord]) -> dict[str, int]:
    """Collectives per 'block.phase' (e.g. 'L0.fwd': 2, 'L0.bwd': 2, 'opt': 1): the per-layer table."""
    counts: Counter = Counter()
    for r in records:
        name = r["name"] if isinstance(r, dict) else r.name
        parts = name.split(".")
        counts[f"{parts[0]}.{parts[2]}" if len(parts) >= 4 and parts[1].startswith("mb") else parts[0]] += 1
    return dict(counts)


@dataclass(frozen=True)
class P2PRecord:
    """One pipeline send or receive: its batch (the n-th batch_isend_irecv or lone call of the step), kind
    ("send" / "recv"), the peer's global rank and the tensor's elements."""

    batch: int
    kind: str
    peer: int
    numel: int

    def describe(self) -> str:
        return f"{self.kind} {'to' if self.kind == 'send' else 'from'} rank {self.peer} of {self.numel} elements " \
               f"(batch {self.batch})"


# Blocking calls wrapped as well; isend / irecv are not (dist.P2POp accepts only the originals), and the
# pipeline stage issues every transfer through batch_isend_irecv.
P2P_CALLS = {"send": "send", "recv": "recv"}


@contextlib.contextmanager
def count_p2p():
    """Wrap torch.distributed's point-to-point calls (batch_isend_irecv, send, recv); yields
    the list of P2PRecords appended in call order. The peer is the global rank the call names."""
    records: list[P2PRecord] = []
    batches = [0]
    originals = {n: getattr(dist, n) for n in ("batch_isend_irecv", *P2P_CALLS)}

    def batch(ops, *args, **kwargs):
        records.extend(P2PRecord(batches[0], "send" if "send" in op.op.__name__ else "recv", op.peer,
                                 op.tensor.numel()) for op in ops)
        batches[0] += 1
        return originals["batch_isend_irecv"](ops, *args, **kwargs)

    def lone(name):
        def wrapper(tensor, peer=None, *args, **kwargs):
            records.append(P2PRecord(batches[0], P2P_CALLS[name], peer, tensor.numel()))
            batches[0] += 1
            return originals[name](tensor, peer, *args, **kwargs)
        return wrapper

    dist.batch_isend_irecv = batch
    for name in P2P_CALLS:
        setattr(dist, name, lone(name))
    try:
        yield records
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def schedule_p2p_records(schedule: Schedule, rank: int, dtype_bytes: int) -> list[P2PRecord]:
    """A stage schedule's P2P transfers as rank `rank` issues them: one batch per P2P op, in op order; the
    peer is the peer stage's rank at the same (tp, dp) position (sim/core/mesh.py)."""
    stages = mesh_group("pp", rank, schedule.tp, schedule.dp, pp=schedule.pp)
    out, batch = [], 0
    for op in schedule.ops:
        if isinstance(op.work, P2P):
            out += [P2PRecord(batch, "send" if t.send else "recv", stages[t.peer_stage], t.nbytes // dtype_bytes)
                    for t in op.work.transfers]
            batch += 1
    return out


def compare_p2p(real: list[dict | P2PRecord], planned: list[P2PRecord], rank: int) -> list[str]:
    """Op-by-op differences (position, kind, peer, size, batch) between counted and scheduled P2P calls."""
    have = [r if isinstance(r, P2PRecord) else P2PRecord(**r) for r in real]
    lines = [f"rank {rank} P2P #{i}: counted {a.describe()}, schedule {b.describe()}"
             for i, (a, b) in enumerate(zip(have, planned, strict=False)) if a != b]
    if len(have) != len(planned):
        lines.append(f"rank {rank}: counted {len(have)} P2P transfers, schedule {len(planned)}")
    return lines
