"""Which slice of each full-model tensor a TP rank holds (Megatron's partitioning).

Full tensors follow torch's Linear layout [out_features, in_features]:
- embed.weight, head.weight [vocab, h]: rows by vocabulary (vocab-parallel), V/t rows per rank;
- layers.i.attn.q.weight [heads*hd, h]: rows of this rank's query heads heads/t * r ... ;
- layers.i.attn.k/v.weight [kv*hd, h]: rows of the KV heads this rank's query heads use: kv/t per rank
  when kv >= t, else the single head r*kv//t, replicated on t/kv consecutive ranks (GQA with kv < t);
- layers.i.attn.o.weight [h, heads*hd]: columns of this rank's query heads (row-parallel);
- layers.i.mlp.fc1 / gate / up [ffn, h]: rows (column-parallel); layers.i.mlp.fc2 [h, ffn]: columns;
- biases (gelu models only): column-parallel ones (q, k, v, fc1) sliced like their weight's rows;
  row-parallel ones (o, fc2) and the norms' weights / biases replicated;
- layers.i.attn.q_norm / k_norm [hd] (model.qk_norm): replicated (every head shares them).

MoE layers (model.moe.is_moe_layer) have a router, routed experts and a shared expert instead of the MLP:
validate/stack/moe_shard.py names and slices them (experts by expert-parallel and expert-tensor position).

The dimensions are sim/schedule/shapes.py's ModelDims (the whole model; the simulator's LayerDims is its
per-rank view); model-family rules (norm kind, biases, gated MLP) are sim/schedule/model_family.py's.
"""

from __future__ import annotations

from meshsim.sim.schedule.model_family import is_gated
from meshsim.sim.schedule.shapes import ModelDims
from meshsim.validate.stack.moe_shard import (
    ExpertMesh,
    MoeLayout,
    is_moe_param,
    moe_shapes,
    moe_shard,
    moe_sp_params,
)


def _norm(prefix: str, d: ModelDims, width: int | None = None) -> dict[str, tuple[int, ...]]:
    out = {prefix + ".weight": (width or d.hidden,)}
    if d.norm_bias:
        out[prefix + ".bias"] = (width or d.hidden,)
    return out


def _linears(prefix: str, linears: dict[str, tuple[int, int]], d: ModelDims) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in linears.items():
        out[f"{prefix}{name}.weight"] = shape
        if d.linear_bias:
            out[f"{prefix}{name}.bias"] = (shape[0],)
    return out


def full_shapes(d: ModelDims, moe: MoeLayout | None = None) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of the full (unsharded) model; MoE layers per `moe`."""
    h, q, kv = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (d.vocab, h)}
    mlp_in = ("gate", "up") if is_gated(d.mlp) else ("fc1",)
    for i in range(d.layers):
        pre = f"layers.{i}."
        shapes.update(_norm(pre + "ln1", d))
        shapes.update(_linears(pre, {"attn.q": (q, h), "attn.k": (kv, h), "attn.v": (kv, h), "attn.o": (h, q)}, d))
        if d.qk_norm:  # one norm over a head's width for every query head, one for every key head
            shapes.update({**_norm(pre + "attn.q_norm", d, d.head_dim), **_norm(pre + "attn.k_norm", d, d.head_dim)})
        shapes.update(_norm(pre + "ln2", d))
        if moe is not None and moe.is_moe(i):
            shapes.update(moe_shapes(pre, moe.config, h, d.mlp, d.linear_bias))
            continue
        mlp = {f"mlp.{n}": (d.ffn, h) for n in mlp_in}
        shapes.update(_linears(pre, {**mlp, "mlp.fc2": (h, d.ffn)}, d))
    shapes.update(_norm("final_ln", d))
    if not d.tied:
        shapes["head.weight"] = (d.vocab, h)
    return shapes


def q_heads(d: ModelDims, tp_rank: int) -> range:
    per = d.heads // d.tp
    return range(tp_rank * per, (tp_rank + 1) * per)


def kv_heads(d: ModelDims, tp_rank: int) -> range:
    if d.kv_heads >= d.tp:
        per = d.kv_heads // d.tp
        return range(tp_rank * per, (tp_rank + 1) * per)
    head = tp_rank * d.kv_heads // d.tp
    return range(head, head + 1)


def kv_replica_groups(d: ModelDims) -> list[list[int]]:
    """TP ranks sharing one KV head (kv < tp): consecutive blocks of tp/kv ranks; [] when kv >= tp."""
    if d.kv_heads >= d.tp:
        return []
    per = d.tp // d.kv_heads
    return [list(range(k * per, (k + 1) * per)) for k in range(d.kv_heads)]


def sequence_parallel_params(d: ModelDims, moe: MoeLayout | None = None) -> list[str]:
    """Replicated parameters living in the SP region (their gradients need a TP all-reduce under SP):
    the norms and the row-parallel biases (added after the exit boundary, on s/t tokens), and MoE layers'
    router and shared fc2 bias (moe_shard.moe_sp_params); model.qk_norm's q and k norms too (each TP rank
    normalizes only its own heads)."""
    names = list(full_shapes(d, moe))
    moe_sp = set(moe_sp_params(names))
    return [n for n in names if n.split(".")[-2] in ("ln1", "ln2", "final_ln", "q_norm", "k_norm")
            or n.endswith(("attn.o.bias", "mlp.fc2.bias")) or n in moe_sp]


def qk_norm_param_names(d: ModelDims) -> list[str]:
    """model.qk_norm's norms: their gradients are summed over tp even without SP (Megatron-LM
    finalize_model_grads.py L451-454 @d98e8a64)."""
    return [n for n in full_shapes(d) if n.split(".")[-2] in ("q_norm", "k_norm")]


def _rows(full, part: range, unit: int):
    return full[part.start * unit: part.stop * unit]


def shard(name: str, full, d: ModelDims, tp_rank: int, experts: ExpertMesh | None = None):
    """This rank's slice of the full tensor `name` (a view): by TP rank, and for MoE parameters by its place
    on the expert mesh too (moe_shard.moe_shard)."""
    if is_moe_param(name):
        return moe_shard(name, full, d.tp, tp_rank, experts)
    key = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else name.split(".")[0]
    if name in ("embed.weight", "head.weight"):
        return _rows(full, range(tp_rank, tp_rank + 1), d.vocab // d.tp)
    if key == "q":
        return _rows(full, q_heads(d, tp_rank), d.head_dim)
    if key in ("k", "v"):
        return _rows(full, kv_heads(d, tp_rank), d.head_dim)
    if name.endswith(("o.bias", "fc2.bias")):
        return full  # row-parallel bias: replicated
    if key == "o":
        heads = q_heads(d, tp_rank)
        return full[:, heads.start * d.head_dim: heads.stop * d.head_dim]
    if key in ("fc1", "gate", "up"):
        return _rows(full, range(tp_rank, tp_rank + 1), d.ffn // d.tp)
    if key == "fc2":
        per = d.ffn // d.tp
        return full[:, tp_rank * per: (tp_rank + 1) * per]
    return full  # LayerNorm: replicated
