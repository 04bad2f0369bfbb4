"""One Megatron TP/SP transformer layer on real tensors: LayerNorm, attention by head (GQA), MLP.

Each block is norm -> entry boundary fused with the column-parallel GEMM (qkv, or fc1 / gate+up) -> core
-> row-parallel GEMM -> exit boundary -> replicated bias -> residual add (sim/schedule/layer_ops.py's op
order). The boundaries are the duality table's (entry, exit) pair: (f, g) without SP, (sp_gather,
sp_scatter) with SP (sim/schedule/duality.py region_boundaries). Under SP the LayerNorms and residual
adds see s/t tokens of an [s, b, h] activation.

Recompute (Korthikanti et al. 2022): "selective" checkpoints the attention core (QK^T, softmax, PV);
"full" checkpoints the whole layer (validate/stack/decoder.py), so its forward collectives run again
during backward. An MoE layer's feed-forward block is validate/stack/moe.py's.
Dropout is absent (numerics compare deterministic math).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.duality import CONJUGATE, region_boundaries
from meshsim.sim.schedule.model_family import is_gated
from meshsim.sim.schedule.shapes import ModelDims
from meshsim.validate.stack.comm import apply_boundary, column_linear, comm_tag, current_phase
from meshsim.validate.stack.moe_shard import ExpertMesh, MoeLayout

LN_EPS = 1e-5


@dataclass(frozen=True)
class Mesh:
    """This process's place in the TP-innermost layout and its process groups (None when of size 1)."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: object = None
    dp_group: object = None
    kv_group: object = None  # ranks sharing this rank's replicated KV head (GQA with kv < tp)
    pp: int = 1
    stage: int = 0  # pipeline stage: rank // (tp dp)
    embed_group: object = None  # first and last stage at this (tp, dp) position (tied embeddings, pp > 1)
    experts: ExpertMesh | None = None  # the expert mesh (MoE models)

    def stage_rank(self, stage: int) -> int:
        """The global rank of `stage` at this rank's (tp, dp) position (sim/core/mesh.py: P2P peers)."""
        return self.tp_rank + self.tp * (self.dp_rank + self.dp * stage)


@dataclass(frozen=True)
class Plan:
    dims: ModelDims
    faults: frozenset[str] = field(default_factory=frozenset)
    moe: MoeLayout | None = None  # the MoE layers (validate/stack/moe.py); None: a dense model

    @property
    def boundaries(self) -> tuple[str, str]:
        """(entry, exit) boundary names; the swap_fg fault uses each one's conjugate instead."""
        entry, exit_ = (b.name for b in region_boundaries(self.dims.sp))
        if "swap_fg" in self.faults:
            return CONJUGATE[entry], CONJUGATE[exit_]
        return entry, exit_


def checkpointed(fn, *args):
    """torch.utils.checkpoint (non-reentrant, without early stop so the whole block, trailing collectives
    included, runs again as Megatron's recompute does); the rerun inside backward is tagged 'recompute'."""

    def run(*inner):
        with comm_tag(phase="recompute" if current_phase() == "bwd" else None):
            return fn(*inner)

    with set_checkpoint_early_stop(False):
        return checkpoint(run, *args, use_reentrant=False)


def norm(x: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    """LayerNorm when the norm has a bias (sim/schedule/model_family.norm_has_bias), RMSNorm x / rms(x) * weight otherwise."""
    weight, bias = w[prefix + ".weight"], w.get(prefix + ".bias")
    if bias is not None:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=LN_EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LN_EPS) * weight


def head_norm(x: torch.Tensor, w: dict, prefix: str, head_dim: int) -> torch.Tensor:
    """model.qk_norm: `norm` over each head's head_dim slice of [s, b, heads * head_dim]."""
    s, b, width = x.shape
    return norm(x.reshape(s, b, width // head_dim, head_dim), w, prefix).reshape(s, b, width)


def fused(w: dict, names: list[str], kind: str) -> torch.Tensor | None:
    """Concatenate the rows of several column-parallel weights (or biases) into one GEMM operand."""
    parts = [w[f"{n}.{kind}"] for n in names if f"{n}.{kind}" in w]
    return torch.cat(parts) if parts else None


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Causal softmax(QK^T/sqrt(d))V per head. [s, b, n*hd] in, [s, b, nq*hd] out; each KV head serves
    nq/nkv consecutive query heads (GQA)."""
    s, b, _ = q.shape
    q, k, v = (t.reshape(s, b, -1, head_dim).permute(1, 2, 0, 3) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def _row_exit(y, w: dict, name: str, exit_: str, mesh: Mesh, block: str, key: str) -> torch.Tensor:
    """Row-parallel linear: partial sums -> exit boundary -> replicated bias (after the sum)."""
    out = apply_boundary(exit_, F.linear(y, w[name + ".weight"]), mesh.tp_group, block, key)
    bias = w.get(name + ".bias")
    return out if bias is None else out + bias


def attention_block(x, w: dict, i: int, plan: Plan, mesh: Mesh) -> torch.Tensor:
    pre, d, block = f"layers.{i}.", plan.dims, K.layer_block(i)
    entry, exit_ = plan.boundaries
    y = norm(x, w, pre + "ln1")
    names = [pre + f"attn.{n}" for n in "qkv"]
    qkv = column_linear(entry, y, fused(w, names, "weight"), fused(w, names, "bias"), mesh.tp_group,
                        block, K.ATTN_IN)
    q_width, kv_width = (w[n + ".weight"].shape[0] for n in names[:2])
    q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
    if d.qk_norm:
        q, k = head_norm(q, w, pre + "attn.q_norm", d.head_dim), head_norm(k, w, pre + "attn.k_norm", d.head_dim)
    if d.recompute == "selective":
        ctx = checkpointed(attention_core, q, k, v, d.head_dim)
    else:
        ctx = attention_core(q, k, v, d.head_dim)
    return x + _row_exit(ctx, w, pre + "attn.o", exit_, mesh, block, K.ATTN_OUT)


def tp_mlp(y, w: dict, prefix: str, plan: Plan, mesh: Mesh, block: str, keys: tuple[str, str]) -> torch.Tensor:
    """A TP MLP on the normed input y: entry boundary + column-parallel fc1 (gate+up) -> activation ->
    row-parallel fc2 -> exit boundary; its weights are `prefix` + fc1 / gate / up / fc2, its collectives
    keyed keys = (entry key, exit key)."""
    entry, exit_ = plan.boundaries
    names = [prefix + n for n in (("gate", "up") if is_gated(plan.dims.mlp) else ("fc1",))]
    y = column_linear(entry, y, fused(w, names, "weight"), fused(w, names, "bias"), mesh.tp_group, block, keys[0])
    return _row_exit(mlp_activation(plan.dims.mlp, y), w, prefix + "fc2", exit_, mesh, block, keys[1])


def mlp_block(x, w: dict, i: int, plan: Plan, mesh: Mesh) -> torch.Tensor:
    pre = f"layers.{i}."
    y = norm(x, w, pre + "ln2")
    return x + tp_mlp(y, w, pre + "mlp.", plan, mesh, K.layer_block(i), (K.MLP_IN, K.MLP_OUT))


def mlp_activation(mlp: str, y: torch.Tensor) -> torch.Tensor:
    """The MLP activation of sim/schedule/model_family.py: swiglu silu(gate) * up on fc1's [gate | up] columns
    (this rank's shard of each), quick_geglu gate sigmoid(1.702 gate) * up (Megatron's quick_geglu with its
    default linear offset 0; the clamp is not applied: it changes which kernels run, not the layout's
    numerics), relu2 relu(y)^2, gelu gelu(y)."""
    if is_gated(mlp):
        gate, up = y.chunk(2, dim=-1)
        if mlp == "quick_geglu":
            return gate * torch.sigmoid(1.702 * gate) * up
        return F.silu(gate) * up
    if mlp == "relu2":
        return torch.relu(y).square()
    return F.gelu(y)

