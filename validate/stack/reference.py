"""The single-process reference: the full model, no parallelism, no collectives, torch's own cross-entropy.

It shares no code with the parallel path except the attention core, the norm (and head_norm, the norm per
head) and the MoE router's top-k (which hold no parallel logic), so a wrong boundary, shard or reduction
shows up as a difference. An MoE layer is computed densely, with no permutation and no dispatch: every
expert runs on every token and
y = sum_e p[:, e] MLP_e(x) with the router's probabilities p (zero where a token does not go), plus the
shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from meshsim.sim.schedule.model_family import is_gated
from meshsim.sim.schedule.shapes import ModelDims
from meshsim.validate.stack.layers import attention_core, head_norm, mlp_activation, norm
from meshsim.validate.stack.moe_router import route
from meshsim.validate.stack.moe_shard import MoeLayout


@dataclass(frozen=True)
class Reference:
    token_losses: torch.Tensor  # [s, B] per-token loss, B = micro_batch x dp
    logits: torch.Tensor  # [s, B, V]
    grads: dict[str, torch.Tensor]  # d(loss)/d(weight), loss = mean over all s x B tokens


def _linear(x, w: dict, name: str) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def _mlp(y, w: dict, prefix: str, d: ModelDims) -> torch.Tensor:
    if is_gated(d.mlp):  # swiglu silu(g) u, quick_geglu g sigmoid(1.702 g) u (written apart from layers.py)
        g = _linear(y, w, prefix + "gate")
        y = (F.silu(g) if d.mlp == "swiglu" else g * torch.sigmoid(1.702 * g)) * _linear(y, w, prefix + "up")
    else:
        y = mlp_activation(d.mlp, _linear(y, w, prefix + "fc1"))
    return _linear(y, w, prefix + "fc2")


def _moe(y, w: dict, prefix: str, d: ModelDims, moe: MoeLayout) -> torch.Tensor:
    """Dense MoE: sum over every expert of its probability times its output, plus the shared expert."""
    t = y.reshape(-1, y.shape[-1])  # [tokens, h]
    probs, _ = route(_linear(t, w, prefix + "router"), moe.config)
    out = sum(probs[:, e:e + 1] * _mlp(t, w, f"{prefix}experts.{e}.", d) for e in range(moe.config.experts))
    if moe.config.shared_ffn_hidden:
        out = out + _mlp(t, w, prefix + "shared.", d)
    return out.view_as(y)


def _layer(x, w: dict, i: int, d: ModelDims, moe: MoeLayout | None) -> torch.Tensor:
    p = f"layers.{i}."
    y = norm(x, w, p + "ln1")
    q, k, v = (_linear(y, w, p + f"attn.{n}") for n in "qkv")
    if d.qk_norm:
        q, k = head_norm(q, w, p + "attn.q_norm", d.head_dim), head_norm(k, w, p + "attn.k_norm", d.head_dim)
    x = x + _linear(attention_core(q, k, v, d.head_dim), w, p + "attn.o")
    y = norm(x, w, p + "ln2")
    if moe is not None and moe.is_moe(i):
        return x + _moe(y, w, p, d, moe)
    return x + _mlp(y, w, p + "mlp.", d)


def reference(full: dict[str, torch.Tensor], tokens, labels, d: ModelDims, moe: MoeLayout | None = None) -> Reference:
    """Forward and backward of the full model on the whole batch (every DP rank's sequences)."""
    w = {n: t.clone().requires_grad_() for n, t in full.items()}
    x = F.embedding(tokens, w["embed.weight"])
    for i in range(d.layers):
        x = _layer(x, w, i, d, moe)
    x = norm(x, w, "final_ln")
    logits = F.linear(x, w["embed.weight"] if d.tied else w["head.weight"])
    losses = F.cross_entropy(logits.reshape(-1, d.vocab), labels.reshape(-1), reduction="none")
    losses.mean().backward()
    return Reference(losses.detach().view_as(labels), logits.detach(), {n: t.grad for n, t in w.items()})
