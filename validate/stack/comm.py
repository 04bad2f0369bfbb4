"""Real collectives for the TP/SP region boundaries, generated from the ONE duality table.

`BOUNDARY_FUNCTIONS[name]` is an autograd Function built by `boundary_function(DUALITY[name])`: its
forward runs `Boundary.forward` and its backward `Boundary.backward` (sim/schedule/duality.py). Nothing here
names f or g: swapping a boundary for its conjugate (a negative control) is a table lookup.

Activations are Megatron's [s, b, h]; the SP pair gathers / scatters along dimension 0 (sequence).
Every collective runs under a `comm_tag` (layer, key, phase) so validate/numerics/opcount.py can attribute the
torch.distributed calls it intercepts.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.duality import DUALITY, Boundary, CommOp

# torch >= 2.12 renamed the tensor-in/tensor-out collectives; older releases only have the old names.
ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
REDUCE_SCATTER = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"


def p2p_tag(direction: str, micro_batch: int, sender_vstage: int, vstages: int) -> int:
    """A pipeline transfer's rendezvous key (direction, micro-batch, sender's virtual stage) as one int, the
    same on both ends; vstages = pp x vp virtual stages."""
    return (micro_batch * vstages + sender_vstage) * 2 + (direction == "bwd")


@dataclass(frozen=True)
class CommTag:
    """Where a collective comes from, in the schedule's naming (sim/schedule/builder.py): block "L3", "embed",
    "head" or "opt"; key "attn_in", "mlp_out_regather", "xent_max_ar", "ln_grad", ...; phase "fwd",
    "bwd", "recompute" or "opt" (after backward)."""

    block: str = ""
    key: str = ""
    phase: str = "fwd"
    micro_batch: int | None = None  # set by the pipeline stage runner; None: the counter's default


# A process-wide slot, not thread-local: CUDA autograd runs backward on its own thread.
_STATE: dict[str, object] = {"tag": CommTag(), "as": None}


def current_tag() -> CommTag:
    return _STATE["tag"]


def current_phase() -> str:
    return current_tag().phase


@contextlib.contextmanager
def comm_tag(block: str | None = None, key: str | None = None, phase: str | None = None,
             micro_batch: int | None = None):
    """Set the tag (fields left None are inherited) for the collectives issued inside."""
    old = current_tag()
    _STATE["tag"] = CommTag(old.block if block is None else block, old.key if key is None else key,
                            old.phase if phase is None else phase,
                            old.micro_batch if micro_batch is None else micro_batch)
    try:
        yield _STATE["tag"]
    finally:
        _STATE["tag"] = old


@dataclass
class StandIn:
    """One collective `op` of `numel` elements that the calls inside a `counted_as` block stand for."""

    op: str
    numel: int
    counted: bool = False


def current_stand_in() -> StandIn | None:
    return _STATE["as"]


@contextlib.contextmanager
def counted_as(op: str, numel: int):
    """The torch.distributed calls inside are an equivalent of ONE collective `op` of `numel` elements, built
    from other calls where gloo lacks it; validate/numerics/opcount.py counts that collective, once."""
    old = _STATE["as"]
    _STATE["as"] = StandIn(op, numel)
    try:
        yield
    finally:
        _STATE["as"] = old


def all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Sum (or `op`) of x over the group, into a new tensor."""
    out = x.clone()
    dist.all_reduce(out, op=op, group=group)
    return out


def all_gather(x: torch.Tensor, group) -> torch.Tensor:
    """Concatenate the group's x along dimension 0: [n, ...] -> [n * world, ...]."""
    world = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] * world, *x.shape[1:]))
    getattr(dist, ALL_GATHER)(out, x.contiguous(), group=group)
    return out


def reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """Sum over the group, then keep this rank's 1/world slice of dimension 0."""
    world = dist.get_world_size(group)
    if x.shape[0] % world:
        raise ValueError(f"reduce-scatter of dim 0 = {x.shape[0]} over {world} ranks")
    out = x.new_empty((x.shape[0] // world, *x.shape[1:]))
    getattr(dist, REDUCE_SCATTER)(out, x.contiguous(), group=group)
    return out


def run_comm(op: CommOp, x: torch.Tensor, group) -> torch.Tensor:
    """Execute one duality-table CommOp on x within `group`."""
    if op is CommOp.IDENTITY:
        return x.view_as(x)
    if op is CommOp.ALL_REDUCE:
        return all_reduce(x, group)
    if op is CommOp.ALL_GATHER:
        return all_gather(x, group)
    if op is CommOp.REDUCE_SCATTER:
        return reduce_scatter(x, group)
    raise ValueError(f"unknown CommOp {op}")


def _solo(group) -> bool:
    return group is None or dist.get_world_size(group) == 1


def boundary_function(boundary: Boundary) -> type[torch.autograd.Function]:
    """A generic autograd Function for one table row: forward = boundary.forward, backward = boundary.backward.
    apply(x, group, block, key) -> tensor."""

    def forward(ctx, x, group, block, key):
        ctx.group, ctx.block, ctx.key = group, block, key
        with comm_tag(block, key):
            return run_comm(boundary.forward, x, group)

    def backward(ctx, grad):
        with comm_tag(ctx.block, ctx.key):
            return run_comm(boundary.backward, grad, ctx.group), None, None, None

    return type(f"Boundary_{boundary.name}", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "boundary": boundary,
                 "__doc__": f"{boundary.name}: forward {boundary.forward.value}, backward {boundary.backward.value}"})


def column_function(boundary: Boundary) -> type[torch.autograd.Function]:
    """Entry boundary fused with a column-parallel linear: y = B(x) W^T + b, B = boundary.forward.

    Backward: dB(x) = dy W -> boundary.backward; dW = dy^T B(x). A boundary along the sequence (SP's
    all-gather) keeps only its input shard and runs boundary.forward again in backward (key
    "<key>_regather"), as Megatron's column-parallel linear does to save the gathered activation.
    apply(x, weight, bias | None, group, block, key) -> tensor."""
    regather = boundary.dim == "seq"

    def forward(ctx, x, weight, bias, group, block, key):
        with comm_tag(block, key):
            full = run_comm(boundary.forward, x, group)
        ctx.save_for_backward(x if regather else full, weight)
        ctx.meta = (group, block, key, bias is not None)
        return F.linear(full, weight, bias)

    def backward(ctx, grad):
        saved, weight = ctx.saved_tensors
        group, block, key, has_bias = ctx.meta
        if regather:
            with comm_tag(block, key + K.REGATHER):
                saved = run_comm(boundary.forward, saved, group)
        grad_in = grad @ weight
        grad2d = grad.reshape(-1, grad.shape[-1])
        grad_w = grad2d.t() @ saved.reshape(-1, saved.shape[-1])
        with comm_tag(block, key):
            grad_x = run_comm(boundary.backward, grad_in, group)
        return grad_x, grad_w, grad2d.sum(0) if has_bias else None, None, None, None

    return type(f"Column_{boundary.name}", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward), "boundary": boundary})


BOUNDARY_FUNCTIONS: dict[str, type[torch.autograd.Function]] = {
    name: boundary_function(b) for name, b in DUALITY.items()
}
COLUMN_FUNCTIONS: dict[str, type[torch.autograd.Function]] = {
    name: column_function(b) for name, b in DUALITY.items()
}


def apply_boundary(name: str, x: torch.Tensor, group, block: str, key: str) -> torch.Tensor:
    """Cross the boundary `name` (a DUALITY key); a group of one rank is the identity."""
    return x if _solo(group) else BOUNDARY_FUNCTIONS[name].apply(x, group, block, key)


def column_linear(name: str, x: torch.Tensor, weight, bias, group, block: str, key: str) -> torch.Tensor:
    """Entry boundary `name` then a column-parallel linear (plain F.linear in a group of one)."""
    if _solo(group):
        return F.linear(x, weight, bias)
    return COLUMN_FUNCTIONS[name].apply(x, weight, bias, group, block, key)


def all_reduce_grads(tensors: list[torch.Tensor], group, *, block: str, key: str, average: bool = False) -> None:
    """One coalesced all-reduce of the given gradients in place (flatten, reduce, copy back)."""
    if not tensors or _solo(group):
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    with comm_tag(block, key, "opt"):
        dist.all_reduce(flat, group=group)
    if average:
        flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
