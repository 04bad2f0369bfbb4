"""The MoE router's math on real tensors, as Megatron-Core computes it (megatron/core/transformer/moe/
moe_utils.py topk_routing_with_score_function and group_limited_topk, at Megatron-LM d98e8a64), without its
fused kernels, input jitter, expert bias, score scaling or auxiliary losses (none is a scenario field):

- softmax (moe_router_pre_softmax off, Megatron's default): the top-k of the logits, then a softmax over
  those k scores;
- sigmoid: scores = sigmoid(logits), their top-k, normalised to sum 1 when k > 1 (+1e-20 in the divisor);
- group-limited routing (router_groups g, router_group_topk m): the experts split into g equal groups, a
  group's score is the sum of its top-(k / m) scores, the m best groups are kept and the top-k is taken
  among their experts only.

`route` returns the dense [T, E] probabilities (zero where a token does not go) and the routing map. It
holds no parallel logic, so the distributed MoE block and the single-process reference share it, as they
share the attention core and the norm.
"""

from __future__ import annotations

import torch

from meshsim.scenarios.schema import MoeConfig

SIGMOID_EPS = 1e-20  # moe_utils.py: scores / (scores.sum(-1) + 1e-20)


def group_limited_topk(scores: torch.Tensor, topk: int, groups: int, group_topk: int):
    """(values, indices) of the top-k among the experts of each token's `group_topk` best groups."""
    tokens, experts = scores.shape
    group_scores = scores.view(tokens, groups, -1).topk(topk // group_topk, dim=-1)[0].sum(dim=-1)
    picked = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter(1, picked, 1.0).bool()
    mask = mask.unsqueeze(-1).expand(tokens, groups, experts // groups).reshape(tokens, experts)
    return torch.topk(scores.masked_fill(~mask, float("-inf")), k=topk, dim=-1)


def _topk(scores: torch.Tensor, moe: MoeConfig):
    if moe.router_group_topk:
        return group_limited_topk(scores, moe.top_k, moe.router_groups, moe.router_group_topk)
    return torch.topk(scores, k=moe.top_k, dim=1)


def route(logits: torch.Tensor, moe: MoeConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities [T, E], routing map [T, E] bool) of the router logits [T, E] (module docstring)."""
    if moe.router == "softmax":
        top, index = _topk(logits, moe)
        probs = torch.softmax(top, dim=-1)
    else:
        top, index = _topk(torch.sigmoid(logits), moe)
        probs = top / (top.sum(dim=-1, keepdim=True) + SIGMOID_EPS) if moe.top_k > 1 else top
    dense = torch.zeros_like(logits).scatter(1, index, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, index, True)
    return dense, routing_map
