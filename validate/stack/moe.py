"""An MoE layer's feed-forward block on real tensors: Megatron-Core's MoELayer with the alltoall token
dispatcher (megatron/core/transformer/moe/ moe_layer.py, token_dispatcher.py MoEAlltoAllTokenDispatcher,
moe_utils.py permute / unpermute / sort_chunks_by_idxs, experts.py TEGroupedMLP, at Megatron-LM d98e8a64),
the op order of sim/schedule/moe_ops.py:

ln2 -> shared expert (an attention-TP MLP: layers.tp_mlp, keys SHARED_IN / SHARED_OUT) -> router GEMM ->
top-k (moe_router.route) -> every rank's tokens per expert all-gathered over etp x ep (MOE_META) ->
permute: the T k (token, expert) rows grouped by expert, tokens in order (the argsort of the transposed
routing map), with their probabilities -> all-to-all of the rows and of the probabilities over ep
(MOE_DISPATCH, MOE_DISPATCH_PROBS) -> etp > 1: all-gathers of both over etp (EXPERT_GATHER,
EXPERT_GATHER_PROBS) -> more than one local expert: the chunks (etp member, ep source, local expert)
sorted by local expert -> per local expert ONE computation over all its rows: fc1 (this etp rank's rows
of it), activation, x probability, fc2 (+ its bias x probability) -> unsort -> etp > 1: reduce-scatter
over etp (EXPERT_SCATTER) -> all-to-all back over ep (MOE_COMBINE) -> unpermute (scatter-add of each
token's k rows) -> + shared expert -> residual add. Dropless: every routed row is computed.
Backward is autograd's, through the dispatcher's collectives (validate/stack/moe_comm.py).

Faults (negative controls, validate/numerics/check.py): "wrong_permute" fills every permuted row with the
token of the row before it (the routing, the probabilities and the unpermute stay right); "wrong_combine"
reassembles the rows the combine all-to-all returns in reversed source-rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.model_family import is_gated
from meshsim.validate.stack.layers import Mesh, Plan, fused, mlp_activation, norm, tp_mlp
from meshsim.validate.stack.moe_comm import AllToAll, GatherRows, ScatterRows, gather_counts
from meshsim.validate.stack.moe_router import route
from meshsim.validate.stack.moe_shard import ExpertMesh, MoeLayout


@dataclass(frozen=True)
class Routing:
    """Where this rank's permuted rows go and where the expert rows come from (the dispatcher's preprocess)."""

    flat: torch.Tensor  # [T k] positions in the flattened [E, T] routing map: expert = p // T, token = p % T
    input_splits: list[int]  # rows sent to each ep rank
    output_splits: list[int]  # rows received from each ep rank (at this etp position)
    tp_splits: list[int]  # rows each etp member receives from the all-to-all
    chunks: list[int]  # rows per (etp member, ep source, local expert), in that order


def plan_routing(routing_map: torch.Tensor, layout: MoeLayout, em: ExpertMesh, block: str) -> Routing:
    """Megatron's preprocess: counts per expert, gathered over etp x ep (group order: etp innermost)."""
    tokens, experts = routing_map.shape
    flat = routing_map.T.reshape(-1).to(torch.int8).argsort(descending=True, stable=True)
    flat = flat[:tokens * layout.config.top_k]
    counts = routing_map.sum(dim=0)
    group = gather_counts(counts, em.etp_ep_group, block) if em.ep * em.etp > 1 else counts.view(1, -1)
    mine = group.view(em.ep, em.etp, experts).transpose(0, 1)[:, :, layout.local(em.ep_rank)]  # [etp, ep, L]
    per_rank = mine.sum(dim=2)
    return Routing(flat, counts.view(em.ep, -1).sum(dim=1).tolist(), per_rank[em.etp_rank].tolist(),
                   per_rank.sum(dim=1).tolist(), mine.reshape(-1).tolist())


def sort_chunks(x: torch.Tensor, sizes: list[int], order: list[int]) -> torch.Tensor:
    """The chunks of x (split by `sizes`) concatenated in `order` (moe_utils.sort_chunks_by_idxs)."""
    parts = x.split(sizes)
    return torch.cat([parts[i] for i in order])


def by_local_expert(chunks: int, local: int) -> list[int]:
    """Chunk order that groups (member, source, expert) chunks by expert: Megatron's
    sort_input_by_local_experts, arange(n).reshape(-1, local).T.ravel()."""
    return [c * local + e for e in range(local) for c in range(chunks // local)]


def _expert(x: torch.Tensor, p: torch.Tensor, w: dict, prefix: str, mlp: str) -> torch.Tensor:
    """One expert over its rows: fc2(act(fc1 x) p) + fc2's bias x p (experts.py bias_act_func, _apply_bias)."""
    names = [prefix + n for n in (("gate", "up") if is_gated(mlp) else ("fc1",))]
    scale = p.unsqueeze(-1)
    y = mlp_activation(mlp, F.linear(x, fused(w, names, "weight"), fused(w, names, "bias"))) * scale
    out = F.linear(y, w[prefix + "fc2.weight"])
    bias = w.get(prefix + "fc2.bias")
    return out if bias is None else out + bias * scale


def run_experts(rows, probs, r: Routing, w: dict, pre: str, plan: Plan, em: ExpertMesh) -> torch.Tensor:
    """Sort by local expert, one computation per local expert, unsort."""
    local = plan.moe.local_experts
    order = by_local_expert(len(r.chunks), local)
    if local > 1:
        rows, probs = sort_chunks(rows, r.chunks, order), sort_chunks(probs, r.chunks, order)
    per_expert = [sum(r.chunks[c] for c in order[e * len(order) // local:(e + 1) * len(order) // local])
                  for e in range(local)]
    outs = [_expert(x, p, w, f"{pre}experts.{e}.", plan.dims.mlp)
            for e, x, p in zip(plan.moe.local(em.ep_rank), rows.split(per_expert), probs.split(per_expert),
                               strict=True)]
    out = torch.cat(outs)
    if local > 1:
        sorted_sizes = [r.chunks[c] for c in order]
        out = sort_chunks(out, sorted_sizes, sorted(range(len(order)), key=order.__getitem__))
    return out


def dispatch_and_combine(tokens, probs, routing_map, w: dict, pre: str, block: str, plan: Plan,
                         em: ExpertMesh) -> torch.Tensor:
    """Routed experts' output [T, h] for this rank's tokens [T, h] (module docstring)."""
    r = plan_routing(routing_map, plan.moe, em, block)
    token_of = r.flat % tokens.shape[0]
    rows = tokens.index_select(0, token_of.roll(1) if "wrong_permute" in plan.faults else token_of)
    p = probs.T.reshape(-1)[r.flat]
    if em.ep > 1:
        rows = AllToAll.apply(rows, r.output_splits, r.input_splits, em.ep_group, block, K.MOE_DISPATCH)
        p = AllToAll.apply(p, r.output_splits, r.input_splits, em.ep_group, block, K.MOE_DISPATCH_PROBS)
    if em.etp > 1:
        rows = GatherRows.apply(rows, r.tp_splits, em.etp_rank, em.etp_group, block, K.EXPERT_GATHER)
        p = GatherRows.apply(p, r.tp_splits, em.etp_rank, em.etp_group, block, K.EXPERT_GATHER_PROBS)
    out = run_experts(rows, p, r, w, pre, plan, em)
    if em.etp > 1:
        out = ScatterRows.apply(out, r.tp_splits, em.etp_rank, em.etp_group, block, K.EXPERT_SCATTER)
    if em.ep > 1:
        out = AllToAll.apply(out, r.input_splits, r.output_splits, em.ep_group, block, K.MOE_COMBINE)
        if "wrong_combine" in plan.faults:
            out = torch.cat(out.split(r.input_splits)[::-1])
    return tokens.new_zeros(tokens.shape).index_add(0, token_of, out)


def moe_block(x, w: dict, i: int, plan: Plan, mesh: Mesh) -> torch.Tensor:
    """x [s (/tp under SP), b, h] -> x + routed experts (+ shared expert) of ln2(x)."""
    pre, block, moe = f"layers.{i}.", K.layer_block(i), plan.moe.config
    y = norm(x, w, pre + "ln2")
    shared = tp_mlp(y, w, pre + "shared.", plan, mesh, block, (K.SHARED_IN, K.SHARED_OUT)) \
        if moe.shared_ffn_hidden else None
    tokens = y.reshape(-1, y.shape[-1])
    probs, routing_map = route(F.linear(tokens, w[pre + "router.weight"], w.get(pre + "router.bias")), moe)
    out = dispatch_and_combine(tokens, probs, routing_map, w, pre, block, plan, mesh.experts).view_as(y)
    return x + (out if shared is None else out + shared)
