"""Count collectives where they leave Python: torch.distributed's functions are wrapped for the
duration of a step, and each call is recorded with the tag (validate/stack/comm.py) active at the time.

A record's name follows the schedule's op names (sim/schedule/builder.py, sim/schedule/dp_ops.py):
"<block>.mb<m>.<phase>.<key>" inside a micro-batch ("L0.mb0.fwd.attn_in", "head.mb0.bwd.head_in_regather"),
"<block>.<key>" after backward ("opt.ln_grad", "dp.bucket0.all_reduce"). Sizes are compared in elements:
the schedule counts activation collectives in the model dtype (2 bytes) and gradient / cross-entropy
ones in fp32 (4 bytes), while the CPU run may use another dtype.
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
from meshsim.sim.schedule.ops import P2P, Collective, Schedule
from meshsim.validate.stack.comm import current_tag

# torch.distributed function -> schedule op name; numel is the total (gathered) size, as nccl-tests counts
PATCHED = {
    "all_reduce": "all_reduce", "all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "all_to_all_single": "all_to_all",
}


@dataclass(frozen=True)
class CallRecord:
    name: str
    op: str
    group: str  # "tp", "dp", "kv" (GQA replica group) or "world"
    ranks: int
    numel: int


def _numel(args: tuple, kwargs: dict) -> int:
    """The largest tensor argument's size: the buffer (all-reduce) or the total gathered size."""
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
    group_names maps id(process group) -> "tp" / "dp" / "kv". Nested calls (one API calling another)
    count once."""
    records: list[CallRecord] = []
    depth = [0]
    originals = {name: getattr(dist, name) for name in PATCHED if hasattr(dist, name)}

    def wrap(name, fn):
        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                group = kwargs.get("group")
                records.append(CallRecord(op_name(current_tag(), micro_batch), PATCHED[name],
                                          group_names.get(id(group), "world"), dist.get_world_size(group),
                                          _numel(args, kwargs)))
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


def element_bytes(work: Collective, dtype_bytes: int) -> int:
    """Bytes per element the schedule assumed: model dtype for boundary traffic, fp32 otherwise."""
    return dtype_bytes if work.boundary in DUALITY or work.boundary == K.SP_REGATHER else FP32_BYTES


def schedule_records(schedule: Schedule, dtype_bytes: int, micro_batch: int | None = 0) -> list[CallRecord]:
    """The schedule's collectives of one micro-batch (None: every micro-batch) and the step end as
    CallRecords."""
    out = []
    for op in schedule.ops:
        if not isinstance(op.work, Collective) or op.micro_batch not in (None, micro_batch) and micro_batch is not None:
            continue
        ranks = {"tp": schedule.tp, "dp": schedule.dp, "kv": schedule.kv_replicas, "embed": 2}[op.work.group]
        out.append(CallRecord(op.name, op.work.op, op.work.group, ranks,
                              op.work.nbytes // element_bytes(op.work, dtype_bytes)))
    return out


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
