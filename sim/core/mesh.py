"""The device mesh's groups: Megatron's rank order with TP innermost, then CP, then DP, then PP.

A rank r of a tp x cp x dp x pp mesh sits at tp position r mod tp, cp position (r // tp) mod cp, dp
position (r // (tp cp)) mod dp and pipeline stage r // (tp cp dp): r = tp_rank + tp (cp_rank + cp (dp_rank
+ dp stage)) (Megatron-Core's RankGenerator order "tp-cp-ep-dp-pp", megatron/core/parallel_state.py L617
at Megatron-LM d98e8a64; ep folds away on the decoder mesh). Its groups:
- "tp": the tp consecutive ranks r // tp * tp ... (+tp - 1);
- "cp": the cp ranks of r's block of tp cp consecutive ranks congruent to r mod tp (L1117, get_ranks('cp'));
  the KV ring runs over them in cp order, rank i sending to i + 1 (TE context_parallel.py L1418);
- "cp_a2a" / "cp_p2p" (cp_comm a2a+p2p, hierarchical sizes [a, cp / a]): the a consecutive members of the
  cp group around r (the all-to-all level) and the cp / a members at stride a (the ring level), Megatron's
  create_hierarchical_groups (L378-400) with the first size innermost;
- "dp": the ranks of r's stage congruent to r mod tp, one per (DP replica, CP rank): Megatron's data-parallel
  group with context parallelism ("dp-cp", L963), over which gradients are reduced and the distributed
  optimizer shards (with cp = 1 the plain DP group);
- "kv": the kv_replicas consecutive ranks of r's TP group that replicate one KV head (GQA with
  kv_heads < tp; kv_replicas = tp / kv_heads);
- "pp": the pp ranks at r's (tp, dp) position, one per stage, in stage order (P2P peers);
- "embed": the first and last of those (the tied-embedding gradient all-reduce);
- "stage": all tp x cp x dp ranks of r's pipeline stage (FP8 delayed scaling's amax reduction group,
  Megatron-Core parallel_state.get_amax_reduction_group: the tensor-and-data-parallel group).

Experts live on a second mesh over the same ranks, Megatron-Core's "parallel folding"
(megatron/core/parallel_state.py L859-907 at Megatron-LM d98e8a64: a decoder RankGenerator over
tp-cp-dp-pp and an expert RankGenerator over tp-ep-dp-pp with tp = etp, cp = 1, and the same pp groups).
Inside a stage of S = tp dp ranks, rank r sits at expert-tensor position r mod etp, expert-parallel
position (r // etp) mod ep and expert-data position (r mod S) // (etp ep), with edp = S / (etp ep):
- "etp": the etp consecutive ranks around r (the expert linears' tensor-parallel group);
- "ep": the ep ranks of r's block of etp ep congruent to r mod etp (the token all-to-all);
- "etp_ep": the whole block of etp ep consecutive ranks (the all-gather dispatcher's group, Megatron's tp_ep);
- "edp": the edp ranks of r's stage at r's (etp, ep) position (the expert gradients' data parallelism).
With etp = tp the expert TP groups are the attention ones; ep then folds over dp.

Distributed-optimizer instances (parallel.dist_opt_instances = I > 1, Megatron's
--num-distributed-optimizer-instances, parallel_state.py L984-996 and L1474-1497 at d98e8a64): each
data-parallel group is cut into I contiguous pieces, Megatron's create_hierarchical_groups with sizes
[size / I, I], and the distributed optimizer shards inside a piece:
- "dp_in" / "edp_in": the dp / edp members of r's piece (its instance);
- "dp_out": the I ranks of r's stage at stride S / I, one per instance at r's place in it: the second
  level of both hierarchies (the dense and the expert pieces of a rank lie in the same instance, so they
  share it: get_inter_distributed_optimizer_instance_group, L2457).
The scenario (scenarios/resolved.py), the engine and validate's process groups all use this one rule.
"""

from __future__ import annotations

EXPERT_KINDS = ("etp", "ep", "etp_ep", "edp")
CP_KINDS = ("cp", "cp_a2a", "cp_p2p")
INSTANCE_KINDS = ("dp_in", "edp_in", "dp_out")


def cp_group(kind: str, rank: int, tp: int, cp: int, cp_a2a: int = 1) -> tuple[int, ...]:
    """`rank`'s group of a context-parallel kind ("cp", "cp_a2a" or "cp_p2p"; module docstring)."""
    block = tp * cp
    base = rank // block * block + rank % tp
    pos = rank // tp % cp
    if kind == "cp":
        return tuple(base + i * tp for i in range(cp))
    if kind == "cp_a2a":
        first = pos // cp_a2a * cp_a2a
        return tuple(base + (first + i) * tp for i in range(cp_a2a))
    if kind == "cp_p2p":
        return tuple(base + (pos % cp_a2a + j * cp_a2a) * tp for j in range(cp // cp_a2a))
    raise ValueError(f"unknown context-parallel group kind {kind!r}")


def expert_group(kind: str, rank: int, stage_size: int, ep: int, etp: int) -> tuple[int, ...]:
    """`rank`'s group of an expert-mesh kind ("etp", "ep", "etp_ep" or "edp"; module docstring)."""
    block = etp * ep
    if kind == "etp":
        first = rank // etp * etp
        return tuple(range(first, first + etp))
    first = rank // block * block
    if kind == "ep":
        return tuple(first + rank % etp + i * etp for i in range(ep))
    if kind == "etp_ep":
        return tuple(range(first, first + block))
    if kind == "edp":
        base = rank // stage_size * stage_size
        return tuple(base + rank % block + j * block for j in range(stage_size // block))
    raise ValueError(f"unknown expert group kind {kind!r}")


def stage_groups(kind: str, base: int, stage_size: int, tp: int, cp: int, cp_a2a: int, ep: int, etp: int
                 ) -> tuple[tuple[int, ...], ...] | None:
    """The distinct groups of an expert kind, "stage" or a context-parallel kind among the ranks base ...
    base + stage_size - 1 of one stage, in the order the ranks first reach them (dict.fromkeys(group of r
    for r in the stage), the long way), by arithmetic on the mesh: blocks of etp ep (expert kinds) or tp cp
    (context-parallel kinds) ranks, each block's groups in the order of the first rank that reaches them.
    None where the stage is not whole blocks, or the all-to-all level does not divide cp (then the long way)."""
    block = etp * ep if kind in EXPERT_KINDS else tp * cp if kind in CP_KINDS else stage_size
    if kind not in EXPERT_KINDS and kind not in CP_KINDS and kind != "stage" or min(block, stage_size, cp_a2a) < 1 \
            or stage_size % block or base % stage_size or kind in CP_KINDS and cp % cp_a2a:
        return None
    starts = range(base, base + stage_size, block)
    if kind == "stage":
        return (tuple(range(base, base + stage_size)),)
    if kind == "etp":
        return tuple(tuple(range(f, f + etp)) for f in range(base, base + stage_size, etp))
    if kind == "ep":
        return tuple(tuple(range(f + o, f + block, etp)) for f in starts for o in range(etp))
    if kind == "etp_ep":
        return tuple(tuple(range(f, f + block)) for f in starts)
    if kind == "edp":
        return tuple(tuple(range(base + o, base + stage_size, block)) for o in range(block))
    if kind == "cp":
        return tuple(tuple(range(f + o, f + block, tp)) for f in starts for o in range(tp))
    if kind == "cp_a2a":
        return tuple(tuple(f + o + (first + i) * tp for i in range(cp_a2a))
                     for f in starts for first in range(0, cp, cp_a2a) for o in range(tp))
    return tuple(tuple(f + o + (p + j * cp_a2a) * tp for j in range(cp // cp_a2a))  # cp_p2p
                 for f in starts for p in range(cp_a2a) for o in range(tp))


def instance_group(kind: str, rank: int, domain: tuple[int, ...], stage_size: int, instances: int
                   ) -> tuple[int, ...]:
    """`rank`'s "dp_in" / "edp_in" piece of its `domain` group (dp or edp), or its "dp_out" group across the
    `instances` pieces (module docstring)."""
    if kind == "dp_out":
        stride, base = stage_size // instances, rank // stage_size * stage_size
        return tuple(base + (rank - base) % stride + j * stride for j in range(instances))
    k = len(domain) // instances
    first = domain.index(rank) // k * k
    return domain[first:first + k]


def mesh_group(kind: str, rank: int, tp: int, dp: int, kv_replicas: int = 1, pp: int = 1, ep: int = 1,
               etp: int = 1, cp: int = 1, cp_a2a: int = 1, instances: int = 1) -> tuple[int, ...]:
    """`rank`'s group of a symbolic kind ("tp", "dp", "kv", "pp", "embed", a context-parallel, an expert or
    a distributed-optimizer-instance kind) on the mesh (module docstring)."""
    if kind in INSTANCE_KINDS:
        domain = mesh_group("edp" if kind == "edp_in" else "dp", rank, tp, dp, pp=pp, ep=ep, etp=etp, cp=cp)
        return instance_group(kind, rank, domain, tp * dp * cp, instances)
    if kind in CP_KINDS:
        return cp_group(kind, rank, tp, cp, cp_a2a)
    dp = dp * cp  # the stage's replicas of a tp group: its dp x cp positions
    if kind in EXPERT_KINDS:
        return expert_group(kind, rank, tp * dp, ep, etp)
    if kind == "tp":
        first = rank // tp * tp
        return tuple(range(first, first + tp))
    if kind == "kv":
        first = rank // kv_replicas * kv_replicas
        return tuple(range(first, first + kv_replicas))
    stage_size = tp * dp
    if kind == "stage":
        base = rank // stage_size * stage_size
        return tuple(range(base, base + stage_size))
    if kind == "pp":
        return tuple(rank % stage_size + s * stage_size for s in range(pp))
    if kind == "embed":
        return (rank % stage_size, rank % stage_size + (pp - 1) * stage_size)
    base = rank // stage_size * stage_size
    return tuple(base + rank % tp + d * tp for d in range(dp))
