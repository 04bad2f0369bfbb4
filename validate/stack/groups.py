"""Process groups of the TP-innermost layout (scenarios/resolved.py), created the same way on every rank.

TP group i = ranks i*tp ... i*tp+tp-1; DP group t = ranks t, t+tp, t+2tp, ...; a GQA replica group
(kv_heads < tp) = a block of tp/kv consecutive ranks inside a TP group that hold the same KV head.
torch.distributed.new_group must be called by every rank for every group in the same order, so all
groups are created here, in a fixed order, and a rank keeps the ones it belongs to.

Every group of validate/ (these meshes and calibration's blocks) is made by `new_groups`, which gives it
the process-group timeout that validate/launch/launch.py's init_process_group recorded with `set_timeout`
(without it torch's default applies to subgroups: 30 min for gloo, 10 min for NCCL). Groups for CPU
tensors (`cpu=True`: the numerics model) use gloo when the default backend is NCCL, which handles only
CUDA tensors.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

from meshsim.sim.core.mesh import mesh_group
from meshsim.validate.stack.layers import Mesh

_timeout: datetime.timedelta | None = None  # the default group's timeout; None: torch's default


def set_timeout(timeout: datetime.timedelta | None) -> None:
    """Record the default process group's timeout so every later subgroup gets the same one."""
    global _timeout
    _timeout = timeout


def group_backend(cpu: bool) -> str | None:
    """The backend for a new group: gloo for CPU tensors under NCCL, else None (the default backend)."""
    return "gloo" if cpu and dist.get_backend() == "nccl" else None


def new_groups(blocks: list[list[int]], rank: int, *, cpu: bool = False):
    """Create every group of `blocks` (same order on every rank), each with the recorded timeout and
    group_backend(cpu); return the one holding `rank` (None if none does)."""
    backend = group_backend(cpu)
    mine = None
    for ranks in blocks:
        group = dist.new_group(ranks, timeout=_timeout, backend=backend)
        if rank in ranks:
            mine = group
    return mine


def build_mesh(tp: int, dp: int, kv_blocks: list[list[int]] = (), *,
               cpu: bool = False) -> tuple[Mesh, dict[int, str]]:
    """This rank's Mesh and id(group) -> "tp" / "dp" / "kv" (groups of one rank are None).
    cpu=True for a mesh whose collectives carry CPU tensors (numerics), see new_groups."""
    rank = dist.get_rank()
    if tp * dp != dist.get_world_size():
        raise ValueError(f"tp x dp = {tp} x {dp} but the world has {dist.get_world_size()} ranks")
    tp_blocks = [list(mesh_group("tp", i * tp, tp, dp)) for i in range(dp)]
    dp_blocks = [list(mesh_group("dp", t, tp, dp)) for t in range(tp)]
    tp_group = new_groups(tp_blocks, rank, cpu=cpu) if tp > 1 else None
    dp_group = new_groups(dp_blocks, rank, cpu=cpu) if dp > 1 else None
    kv_group = None
    if kv_blocks and len(kv_blocks[0]) > 1:
        kv_group = new_groups([[i * tp + r for r in blk] for i in range(dp) for blk in kv_blocks], rank, cpu=cpu)
    mesh = Mesh(tp, dp, rank % tp, rank // tp, tp_group, dp_group, kv_group)
    names = {id(g): n for g, n in ((tp_group, "tp"), (dp_group, "dp"), (kv_group, "kv")) if g is not None}
    return mesh, names
