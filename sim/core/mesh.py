"""The device mesh's groups: Megatron's rank order with TP innermost, then DP, then PP.

A rank r of a tp x dp x pp mesh sits at tp position r mod tp, dp position (r // tp) mod dp and pipeline
stage r // (tp dp): r = tp_rank + tp (dp_rank + dp stage). Its groups:
- "tp": the tp consecutive ranks r // tp * tp ... (+tp - 1);
- "dp": the ranks of r's stage congruent to r mod tp, one per DP replica;
- "kv": the kv_replicas consecutive ranks of r's TP group that replicate one KV head (GQA with
  kv_heads < tp; kv_replicas = tp / kv_heads);
- "pp": the pp ranks at r's (tp, dp) position, one per stage, in stage order (P2P peers);
- "embed": the first and last of those (the tied-embedding gradient all-reduce).
The scenario (scenarios/resolved.py), the engine and validate's process groups all use this one rule.
"""

from __future__ import annotations


def mesh_group(kind: str, rank: int, tp: int, dp: int, kv_replicas: int = 1, pp: int = 1) -> tuple[int, ...]:
    """`rank`'s group of a symbolic kind ("tp", "dp", "kv", "pp" or "embed") on the mesh (module docstring)."""
    if kind == "tp":
        first = rank // tp * tp
        return tuple(range(first, first + tp))
    if kind == "kv":
        first = rank // kv_replicas * kv_replicas
        return tuple(range(first, first + kv_replicas))
    stage_size = tp * dp
    if kind == "pp":
        return tuple(rank % stage_size + s * stage_size for s in range(pp))
    if kind == "embed":
        return (rank % stage_size, rank % stage_size + (pp - 1) * stage_size)
    base = rank // stage_size * stage_size
    return tuple(base + rank % tp + d * tp for d in range(dp))
