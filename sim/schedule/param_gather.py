"""Overlapped parameter all-gather of the distributed optimizer, in steady state.

With the distributed optimizer each DP rank updates 1/dp of the parameters, which are then all-gathered
(bf16) over DP. Megatron-LM with --overlap-param-gather (with --overlap-grad-reduce, our
`parallel.dp_overlap`) does not wait for those gathers after the optimizer: it issues them bucket by bucket
as the NEXT step's forward pass reaches the bucket's parameters. A simulated step is one step of that
steady state, so it starts with the gathers of the previous step's update:

- one all-gather per gradient bucket (the same buckets as the reduce-scatter, sim/dp_ops.make_buckets),
  issued at the start of the step on the dp_comm stream in forward order (the reverse of the buckets'
  backward order: the bucket holding the embedding and the first layers comes first);
- the first forward op of micro-batch 0 that uses a bucket's parameters (the first op of that layer, or
  of the embedding / output head) waits for its all-gather.

So only the first gather is necessarily exposed; the others hide behind the forward of earlier layers
when the network keeps up. Without dp_overlap the gathers trail the optimizer (sim/schedule/dp_ops.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, islice
from operator import attrgetter

from meshsim.sim.schedule.dp_ops import PARAM_BYTES, Bucket, make_buckets, param_gather
from meshsim.sim.schedule.ops import Op
from meshsim.sim.schedule.stage_ops import StageOps

_ID, _PHASE_MB = attrgetter("id"), attrgetter("phase", "micro_batch")


def _owner(op: Op) -> tuple:
    """What an op's parameters belong to: its layer, or the embedding / head block ("embed", "head")."""
    return owner_of(op.layer, op.name)


def owner_of(layer: int | None, name: str) -> tuple:
    """_owner of an op of this layer and name."""
    return ("layer", layer) if layer is not None else ("block", name.split(".", 1)[0])


def _first_forward_use(ops: Sequence[Op], start: int, owners: set[tuple]) -> dict[tuple, int]:
    """Owner -> id of the first forward op of micro-batch 0 in ops[start:] that belongs to it, for `owners`:
    the scan stops once each has been seen (micro-batch 0's forward runs early in the step). A StageOps is
    scanned by its stamps (StageOps.where), no record built."""
    if isinstance(ops, StageOps):
        uses = ((op_id, owner_of(layer, name)) for op_id, layer, name in ops.where(start, "fwd", 0))
    else:
        fwd_mb0 = map(("fwd", 0).__eq__, map(_PHASE_MB, islice(ops, start, None)))
        uses = ((op.id, _owner(op)) for op in compress(islice(ops, start, None), fwd_mb0))  # a C-level filter
    first: dict[tuple, int] = {}
    for op_id, owner in uses:
        if owner in owners and owner not in first:
            first[owner] = op_id
            if len(first) == len(owners):
                break
    return first


def _ids_are_positions(ops: Sequence[Op], start: int) -> bool:
    if isinstance(ops, StageOps):
        return ops.ids_are_positions(start)
    return list(map(_ID, ops[start:])) == list(range(start, len(ops)))


def reserved_gathers(grad_params: list[int], bucket_bytes: int, expert_params: list[int] = (), dp: int = 2,
                     edp: int = 1) -> int:
    """How many all-gathers open the step: the number of buckets the gradient producers' parameter counts
    (in backward order) make, dense over dp and routed experts over edp (dp_ops.all_buckets). The builder
    reserves that many list slots before stamping the step."""
    dense = len(make_buckets(list(enumerate(grad_params)), bucket_bytes)) if dp > 1 else 0
    experts = len(make_buckets(list(enumerate(expert_params)), bucket_bytes)) if edp > 1 and expert_params else 0
    return dense + experts


def fill_param_gathers(ops: list[Op | None] | StageOps, buckets: list[Bucket], param_bytes: float = PARAM_BYTES) -> list[Op]:
    """Fill the reserved slots ops[0:len(buckets)] (None) with the buckets' all-gathers in forward order,
    and make each bucket's first forward consumers depend on its gather (module docstring). Only the
    gated ops are rebuilt: ids stay list positions."""
    n = len(buckets)
    assert list(ops[:n]) == [None] * n and _ids_are_positions(ops, n)
    owner = {p: _owner_at(ops, p) for b in buckets for p in b.producers}  # (a producer is never a reserved slot)
    first = _first_forward_use(ops, n, set(owner.values()))
    gates: dict[int, list[int]] = {}
    for new_id, (i, bucket) in enumerate(reversed(list(enumerate(buckets)))):
        gather = param_gather(bucket, param_bytes)
        ops[new_id] = Op(new_id, f"dp.bucket{i}.all_gather", "dp_comm", "dp_comm", "opt", gather)
        for consumer in sorted({first[owner[p]] for p in bucket.producers}):
            gates.setdefault(consumer, []).append(new_id)
    for consumer, gathers in gates.items():
        op = ops[consumer]
        ops[consumer] = op._replace(deps=op.deps + tuple(gathers))  # (dataclasses.replace's record)
    return ops


def _owner_at(ops: Sequence[Op] | StageOps, p: int) -> tuple:
    """_owner(ops[p]); of a StageOps without building the record."""
    return owner_of(*ops.layer_name(p)) if isinstance(ops, StageOps) else _owner(ops[p])
