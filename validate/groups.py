"""Process groups of the TP-innermost layout (scenarios/resolved.py), created the same way on every rank.

TP group i = ranks i*tp ... i*tp+tp-1; DP group t = ranks t, t+tp, t+2tp, ...; a GQA replica group
(kv_heads < tp) = a block of tp/kv consecutive ranks inside a TP group that hold the same KV head.
torch.distributed.new_group must be called by every rank for every group in the same order, so all
groups are created here, in a fixed order, and a rank keeps the ones it belongs to.
"""

from __future__ import annotations

import torch.distributed as dist

from meshsim.validate.layers import Mesh


def _new_groups(blocks: list[list[int]], rank: int):
    """Create every group of `blocks`; return the one holding `rank` (None if none does)."""
    mine = None
    for ranks in blocks:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def build_mesh(tp: int, dp: int, kv_blocks: list[list[int]] = ()) -> tuple[Mesh, dict[int, str]]:
    """This rank's Mesh and id(group) -> "tp" / "dp" / "kv" (groups of one rank are None)."""
    rank = dist.get_rank()
    if tp * dp != dist.get_world_size():
        raise ValueError(f"tp x dp = {tp} x {dp} but the world has {dist.get_world_size()} ranks")
    tp_group = _new_groups([list(range(i * tp, (i + 1) * tp)) for i in range(dp)], rank) if tp > 1 else None
    dp_group = _new_groups([[t + i * tp for i in range(dp)] for t in range(tp)], rank) if dp > 1 else None
    kv_group = None
    if kv_blocks and len(kv_blocks[0]) > 1:
        kv_group = _new_groups([[i * tp + r for r in blk] for i in range(dp) for blk in kv_blocks], rank)
    mesh = Mesh(tp, dp, rank % tp, rank // tp, tp_group, dp_group, kv_group)
    names = {id(g): n for g, n in ((tp_group, "tp"), (dp_group, "dp"), (kv_group, "kv")) if g is not None}
    return mesh, names
