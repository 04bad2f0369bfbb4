"""Process groups of the TP-innermost layout (scenarios/resolved.py), created the same way on every rank.

TP group i = ranks i*tp ... i*tp+tp-1; DP group t = ranks t, t+tp, t+2tp, ...; a GQA replica group
(kv_heads < tp) = a block of tp/kv consecutive ranks inside a TP group that hold the same KV head; an MoE
model's expert groups (ep, etp, etp_ep, edp) follow the same module's expert mesh.
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
from meshsim.validate.stack.moe_shard import ExpertMesh

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


def _blocks(kind: str, tp: int, dp: int, pp: int, ep: int = 1, etp: int = 1) -> list[list[int]]:
    """Every distinct group of `kind` (sim/core/mesh.py's rule), in order of its lowest rank."""
    seen: dict[tuple[int, ...], None] = {}
    for r in range(tp * dp * pp):
        seen.setdefault(mesh_group(kind, r, tp, dp, pp=pp, ep=ep, etp=etp), None)
    return [list(g) for g in seen]


def build_expert_mesh(tp: int, dp: int, pp: int, ep: int, etp: int, *, cpu: bool = False
                      ) -> tuple[ExpertMesh, dict[int, str]]:
    """This rank's place on the expert mesh etp x ep x edp of its stage (sim/core/mesh.py expert_group) with
    its "ep", "etp", "etp_ep" and "edp" groups (None when of one rank), and id(group) -> name."""
    rank = dist.get_rank()
    groups = {}
    for kind in ("ep", "etp", "etp_ep", "edp"):
        blocks = _blocks(kind, tp, dp, pp, ep, etp)
        groups[kind] = new_groups(blocks, rank, cpu=cpu) if len(blocks[0]) > 1 else None
    place = {k: mesh_group(k, rank, tp, dp, pp=pp, ep=ep, etp=etp) for k in ("ep", "etp")}
    mesh = ExpertMesh(ep, etp, tp * dp // (ep * etp), place["ep"].index(rank), place["etp"].index(rank),
                      groups["ep"], groups["etp"], groups["etp_ep"], groups["edp"])
    return mesh, {id(g): k for k, g in groups.items() if g is not None}


def build_mesh(tp: int, dp: int, kv_blocks: list[list[int]] = (), *, pp: int = 1,
               cpu: bool = False, experts: tuple[int, int] | None = None) -> tuple[Mesh, dict[int, str]]:
    """This rank's Mesh and id(group) -> "tp" / "dp" / "kv" / "embed" (groups of one rank are None).
    With pp > 1 the mesh is tp x dp x pp (TP innermost, then DP, then the stage) and the "embed" group
    joins the first and last stage. experts = (ep, etp) for an MoE model adds the expert mesh
    (build_expert_mesh). cpu=True for a mesh whose collectives carry CPU tensors (numerics), see
    new_groups."""
    rank = dist.get_rank()
    if tp * dp * pp != dist.get_world_size():
        raise ValueError(f"tp x dp x pp = {tp} x {dp} x {pp} but the world has {dist.get_world_size()} ranks")
    tp_group = new_groups(_blocks("tp", tp, dp, pp), rank, cpu=cpu) if tp > 1 else None
    dp_group = new_groups(_blocks("dp", tp, dp, pp), rank, cpu=cpu) if dp > 1 else None
    kv_group = None
    if kv_blocks and len(kv_blocks[0]) > 1:
        kv_group = new_groups([[i * tp + r for r in blk] for i in range(dp * pp) for blk in kv_blocks], rank,
                              cpu=cpu)
    embed_group = new_groups(_blocks("embed", tp, dp, pp), rank, cpu=cpu) if pp > 1 else None
    expert_mesh, expert_names = build_expert_mesh(tp, dp, pp, *experts, cpu=cpu) if experts else (None, {})
    mesh = Mesh(tp, dp, rank % tp, rank // tp % dp, tp_group, dp_group, kv_group, pp, rank // (tp * dp),
                embed_group, expert_mesh)
    names = {id(g): n for g, n in ((tp_group, "tp"), (dp_group, "dp"), (kv_group, "kv"), (embed_group, "embed"))
             if g is not None}
    return mesh, {**names, **expert_names}
