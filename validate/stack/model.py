"""The whole TP/SP model on one rank: weights sliced from one seeded full model, forward to a loss,
and the gradient reductions that follow backward.

Forward: vocab-parallel embedding -> exit boundary (g, or sp_scatter under SP) -> layers -> final norm ->
entry boundary (f / sp_gather) fused with the vocab-parallel head GEMM -> vocab-parallel cross-entropy
-> mean loss. After backward (Megatron's finalize-grads order; names as in sim/schedule/dp_ops.py):
- "opt.ln_grad": under SP, one coalesced TP all-reduce of every SP-region parameter's gradient (norms
  and row-parallel biases see only s/t tokens per rank); without SP, of model.qk_norm's q and k norms
  alone when tp > 1 (each rank normalizes only its own heads);
- "opt.kv_grad": GQA with kv < tp, one coalesced all-reduce of the K/V weight (and bias) gradients over
  the ranks replicating each KV head (each holds only its own query heads' contribution);
- "dp.bucketN.all_reduce": dp > 1, the DP average in buckets of dp_ops.bucket_bytes (dp_bucket_mib MiB, else Megatron-Core's default), in
  the order backward produces them (reverse parameter order); a bucket closes once it reaches the size;
  MoE models: the routed experts' gradients in buckets of their own over the expert-data-parallel group
  (edp > 1), summed there and scaled by 1 / dp like the dense ones (Megatron-Core DDP: expert
  gradient_scaling_factor = 1 / data-parallel size), all buckets in the order backward completes them
  (dp_ops.all_buckets, the simulator's rule);
- "opt.embed_grad": pp > 1 with tied embeddings, the all-reduce of the embedding table's gradient between
  the first stage (input embedding) and the last (its copy used by the output layer).
With pp > 1 `w` holds only the stage's parameters (validate/stack/pipeline.py) and each reduction covers those.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.dp_ops import all_buckets, bucket_bytes, make_buckets
from meshsim.sim.schedule.shapes import ModelDims
from meshsim.validate.stack.comm import all_reduce_grads, apply_boundary, column_linear
from meshsim.validate.stack.decoder import transformer_layer
from meshsim.validate.stack.layers import Mesh, Plan, norm
from meshsim.validate.stack.moe_shard import ExpertMesh, MoeLayout, expert_of, holds
from meshsim.validate.stack.shard import (
    full_shapes,
    kv_replica_groups,
    qk_norm_param_names,
    sequence_parallel_params,
    shard,
)
from meshsim.validate.stack.xent import VocabParallelCrossEntropy


def init_full_weights(d: ModelDims, seed: int, dtype=torch.float32, moe: MoeLayout | None = None) -> dict[str, torch.Tensor]:
    """The full model from `seed`: linear weights N(0, 1/fan_in), embeddings N(0, 1), norm weights
    1 + N(0, 0.1^2), every bias N(0, 0.1^2) (non-trivial, so their gradients are checked meaningfully)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in full_shapes(d, moe).items():
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
        if name.endswith(".bias"):
            t = 0.1 * t
        elif len(shape) == 1:
            t = 1.0 + 0.1 * t
        elif "embed" not in name:
            t = t / shape[-1] ** 0.5
        weights[name] = t.to(dtype)
    return weights


def make_batch(d: ModelDims, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels), each [s, micro_batch x dp] (all DP ranks' sequences), from `seed + 1`."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, d.vocab, (d.seq + 1, d.batch), generator=gen)
    return ids[:-1], ids[1:]


def local_weights(full: dict[str, torch.Tensor], d: ModelDims, tp_rank: int, moe: MoeLayout | None = None,
                  experts: ExpertMesh | None = None) -> dict[str, torch.Tensor]:
    """This rank's shards (by TP rank, and for MoE experts by place on the expert mesh; other ranks' experts
    left out) as fresh leaf tensors that require grad."""
    return {n: shard(n, t, d, tp_rank, experts).clone().requires_grad_() for n, t in full.items()
            if holds(n, moe, experts)}


def embed(tokens, w: dict, d: ModelDims, mesh: Mesh, exit_: str) -> torch.Tensor:
    """Vocab-parallel embedding of [s, b] tokens, then the exit boundary: [s (/t under SP), b, h]."""
    rows = d.vocab // d.tp
    local = tokens - mesh.tp_rank * rows
    outside = (local < 0) | (local >= rows)
    out = F.embedding(local.clamp(0, rows - 1), w["embed.weight"]) * (~outside).unsqueeze(-1)
    return apply_boundary(exit_, out, mesh.tp_group, K.EMBED_BLOCK, K.EMBED_OUT)


def forward(w: dict, tokens, labels, plan: Plan, mesh: Mesh) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over this rank's tokens, logits [s, b, V/t]) for this rank's [s, b] slice of the batch."""
    x = embed(tokens, w, plan.dims, mesh, plan.boundaries[1])
    for i in range(plan.dims.layers):
        x = transformer_layer(x, w, i, plan, mesh)
    return head_loss(x, w, labels, plan, mesh)


def head_loss(x, w: dict, labels, plan: Plan, mesh: Mesh, table: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Final norm -> entry boundary + vocab-parallel output layer -> cross-entropy: (mean loss, logits
    [s, b, V/t]). The output layer's weight is `table` (default: the embedding when tied, else the head)."""
    d = plan.dims
    x = norm(x, w, "final_ln")
    table = table or ("embed.weight" if d.tied else "head.weight")
    logits = column_linear(plan.boundaries[0], x, w[table], None, mesh.tp_group, K.HEAD_BLOCK, K.HEAD_IN)
    losses = VocabParallelCrossEntropy.apply(logits, labels, mesh.tp_rank * (d.vocab // d.tp), mesh.tp_group)
    return losses.mean(), logits


def dp_buckets(names: list[str], w: dict, nbytes: int) -> list[list[str]]:
    """The schedule's bucketing rule (sim/dp_ops.make_buckets) over the parameters in reverse order: a
    bucket closes once it holds >= nbytes of fp32 gradients."""
    order = list(reversed(names))
    buckets = make_buckets([(i, w[n].numel()) for i, n in enumerate(order)], nbytes)
    return [[order[i] for i in b.producers] for b in buckets]


def grad_buckets(names: list[str], w: dict, nbytes: int, dp: int, edp: int) -> list[tuple[str, list[str]]]:
    """(group, parameter names) of every gradient bucket: the dense ones over "dp" (dp > 1), the routed
    experts' over "edp" (edp > 1), in the order backward (reverse parameter order) completes them."""
    order = list(reversed(names))
    dense = [(i, w[n].numel()) for i, n in enumerate(order) if expert_of(n) is None]
    routed = [(i, w[n].numel()) for i, n in enumerate(order) if expert_of(n) is not None]
    return [(b.group, [order[i] for i in b.producers]) for b in all_buckets(dense, routed, nbytes, dp, edp)]


def _reduce_buckets(w: dict, mesh: Mesh, bucket_mib: float | None) -> None:
    """The DP (and expert-DP) bucket all-reduces; the experts' gradients are then scaled by 1 / dp."""
    edp = mesh.experts.edp if mesh.experts is not None else 1
    for i, (group, bucket) in enumerate(grad_buckets(list(w), w, bucket_bytes(bucket_mib, mesh.dp), mesh.dp, edp)):
        all_reduce_grads([w[n].grad for n in bucket], mesh.dp_group if group == "dp" else mesh.experts.edp_group,
                         block=f"dp.bucket{i}", key="all_reduce", average=group == "dp")
    if mesh.dp > 1:
        for n, t in w.items():
            if expert_of(n) is not None and t.grad is not None:
                t.grad /= mesh.dp


def sync_grads(w: dict, plan: Plan, mesh: Mesh, bucket_mib: float | None = None) -> None:
    """The post-backward reductions of the module docstring, in that order."""
    d = plan.dims
    replicated = sequence_parallel_params(d, plan.moe) if d.sp else qk_norm_param_names(d) if d.tp > 1 else []
    if replicated and "no_ln_allreduce" not in plan.faults:
        all_reduce_grads([w[n].grad for n in replicated if n in w], mesh.tp_group, block=K.OPT_BLOCK, key=K.LN_GRAD)
    if kv_replica_groups(d):
        kv = [n for n in w if ".attn.k." in n or ".attn.v." in n]
        all_reduce_grads([w[n].grad for n in kv], mesh.kv_group, block=K.OPT_BLOCK, key=K.KV_GRAD)
    _reduce_buckets(w, mesh, bucket_mib)
    if d.tied and mesh.embed_group is not None and "embed.weight" in w:
        all_reduce_grads([w["embed.weight"].grad], mesh.embed_group, block=K.OPT_BLOCK, key=K.EMBED_GRAD)
