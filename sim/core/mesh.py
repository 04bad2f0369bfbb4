"""The device mesh's groups: Megatron's rank order with TP innermost, then DP.

A rank r of a tp x dp mesh sits at tp position r mod tp and dp position r // tp. Its groups:
- "tp": the tp consecutive ranks r // tp * tp ... (+tp - 1);
- "dp": the ranks congruent to r mod tp, one per DP replica;
- "kv": the kv_replicas consecutive ranks of r's TP group that replicate one KV head (GQA with
  kv_heads < tp; kv_replicas = tp / kv_heads).
The scenario (scenarios/resolved.py), the engine and validate's process groups all use this one rule.
"""

from __future__ import annotations


def mesh_group(kind: str, rank: int, tp: int, dp: int, kv_replicas: int = 1) -> tuple[int, ...]:
    """`rank`'s group of a symbolic kind ("tp", "dp" or "kv") on the TP-innermost mesh."""
    if kind == "tp":
        first = rank // tp * tp
        return tuple(range(first, first + tp))
    if kind == "kv":
        first = rank // kv_replicas * kv_replicas
        return tuple(range(first, first + kv_replicas))
    return tuple(rank % tp + d * tp for d in range(dp))
