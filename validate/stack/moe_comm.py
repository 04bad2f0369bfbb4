"""The alltoall token dispatcher's collectives on real tensors, with their autograd (Megatron-Core
token_dispatcher.py MoEAlltoAllTokenDispatcher and tensor_parallel/mappings.py at Megatron-LM d98e8a64).

Row counts differ from rank to rank (they follow the routing), so every collective takes split sizes:
- `AllToAll`: all_to_all_single over the ep group with input / output splits (gloo supports unequal splits);
  its backward is the all-to-all back with the splits swapped (mappings.py _AllToAll);
- `GatherRows`: the expert-TP all-gather of rows of unequal counts (gather_from_sequence_parallel_region
  with output_split_sizes); backward: the reduce-scatter of the gradient to each member's rows. gloo has no
  all-gather of unequal sizes (ProcessGroupGloo::allgather: "invalid tensor size"), so every member sends
  its rows to every member through all_to_all_single, which moves exactly the all-gather's data, and
  validate/numerics/opcount.py counts it as that all-gather (comm.counted_as);
- `ScatterRows`: the reduce-scatter of rows to unequal counts (reduce_scatter_to_sequence_parallel_region
  with input_split_sizes; torch.distributed.reduce_scatter of a list, which gloo runs with unequal sizes);
  backward: the all-gather of GatherRows;
- `gather_counts`: the all-gather of every rank's tokens per expert over the etp x ep group (preprocess),
  no gradient.
Each call runs under the schedule's op key (sim/schedule/op_keys.py) of the MoE block it serves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from meshsim.sim.schedule import op_keys as K
from meshsim.validate.stack.comm import ALL_GATHER, comm_tag, counted_as


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group, block: str,
               key: str) -> torch.Tensor:
    """Rows x [sum(in_splits), ...]: in_splits[j] rows go to group member j, out_splits[j] come from it."""
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    with comm_tag(block, key):
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def gather_rows(x: torch.Tensor, sizes: list[int], group, block: str, key: str) -> torch.Tensor:
    """Every member's rows (member i holds sizes[i]) concatenated in group order, on every member."""
    out = x.new_empty((sum(sizes), *x.shape[1:]))
    send = x.contiguous().repeat(len(sizes), *([1] * (x.dim() - 1)))  # one copy for each member
    with comm_tag(block, key), counted_as("all_gather", out.numel()):
        dist.all_to_all_single(out, send, list(sizes), [x.shape[0]] * len(sizes), group=group)
    return out


def scatter_rows(x: torch.Tensor, sizes: list[int], member: int, group, block: str, key: str) -> torch.Tensor:
    """The sum over the group of x's rows, member `member` keeping its sizes[member] rows."""
    out = x.new_empty((sizes[member], *x.shape[1:]))
    with comm_tag(block, key):
        dist.reduce_scatter(out, [part.contiguous() for part in x.split(list(sizes))], group=group)
    return out


class AllToAll(torch.autograd.Function):
    """apply(x, out_splits, in_splits, group, block, key) -> rows received (module docstring)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, block, key):
        ctx.meta = (out_splits, in_splits, group, block, key)
        return all_to_all(x, out_splits, in_splits, group, block, key)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits, group, block, key = ctx.meta
        return all_to_all(grad, in_splits, out_splits, group, block, key), None, None, None, None, None


class GatherRows(torch.autograd.Function):
    """apply(x, sizes, member, group, block, key) -> the group's rows (module docstring)."""

    @staticmethod
    def forward(ctx, x, sizes, member, group, block, key):
        ctx.meta = (sizes, member, group, block, key)
        return gather_rows(x, sizes, group, block, key)

    @staticmethod
    def backward(ctx, grad):
        sizes, member, group, block, key = ctx.meta
        return scatter_rows(grad, sizes, member, group, block, key), None, None, None, None, None


class ScatterRows(torch.autograd.Function):
    """apply(x, sizes, member, group, block, key) -> this member's rows of the group's sum."""

    @staticmethod
    def forward(ctx, x, sizes, member, group, block, key):
        ctx.meta = (sizes, member, group, block, key)
        return scatter_rows(x, sizes, member, group, block, key)

    @staticmethod
    def backward(ctx, grad):
        sizes, member, group, block, key = ctx.meta
        return gather_rows(grad, sizes, group, block, key), None, None, None, None, None


def gather_counts(counts: torch.Tensor, group, block: str) -> torch.Tensor:
    """[experts] tokens per expert of this rank -> [members, experts] of the etp x ep group, in group order."""
    world = dist.get_world_size(group)
    out = counts.new_empty((world * counts.shape[0],))
    with comm_tag(block, K.MOE_META):
        getattr(dist, ALL_GATHER)(out, counts.contiguous(), group=group)
    return out.view(world, -1)
