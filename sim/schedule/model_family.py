"""Model-family rules: which norm, which biases and which MLP activation a model has. One definition,
used by the simulator (sim/shapes.py, sim/flops.py, sim/memory.py) and by the real stack (validate/).

Defaults when the scenario leaves `model.norm` / `model.bias` unset (so scenarios written before these
fields existed keep their figures): a swiglu model is Llama style (RMSNorm with a weight only, no linear
biases); gelu and relu2 models are GPT / Megatron / Nemotron style (LayerNorm with weight and bias, a bias
on every linear). An explicit field always wins.

MLP activations (fc1 -> act -> fc2, ffn = f):
- gelu:   act(x) = gelu(x)                 fc1 width f,  forward GEMM FLOPs per token 4hf
- relu2:  act(x) = relu(x)^2 (squared ReLU, So et al. 2021 "Primer"; Nemotron-4), non-gated: as gelu
- swiglu: act(g, u) = silu(g) * u (Shazeer 2020), gated: fc1 computes gate and up, width 2f, 6hf
- quick_geglu: act(g, u) = g sigmoid(1.702 g) * (u + offset) (Megatron --quick-geglu, --glu-linear-offset;
  GPT-OSS), gated: as swiglu. Its kernels move the same bytes; what differs is which of them Megatron fuses
  (sim/schedule/moe_act.py: the clamp of --activation-func-clamp-value runs eagerly before quick-GEGLU)
"""

from __future__ import annotations

from meshsim.scenarios.schema import GATED_MLP_NAMES, ModelConfig

GATED_MLPS = frozenset(GATED_MLP_NAMES)


def is_gated(mlp: str) -> bool:
    """True when fc1 computes two projections (gate and up) that the activation multiplies."""
    return mlp in GATED_MLPS


def fc1_width(mlp: str, ffn: int) -> int:
    """Output columns of fc1: 2 f for a gated MLP, f otherwise."""
    return 2 * ffn if is_gated(mlp) else ffn


def mlp_flops_per_token(mlp: str, hidden: int, ffn: int) -> float:
    """Forward GEMM FLOPs of one MLP per token: 2 h fc1_width + 2 f h."""
    return 2.0 * hidden * fc1_width(mlp, ffn) + 2.0 * ffn * hidden


def norm_kind(m: ModelConfig) -> str:
    """'layernorm' or 'rmsnorm': model.norm, else rmsnorm for gated (Llama-style) MLPs."""
    return m.norm or ("rmsnorm" if is_gated(m.mlp) else "layernorm")


def has_linear_bias(m: ModelConfig) -> bool:
    """model.bias, else True except for gated (Llama-style) MLPs."""
    return m.bias if m.bias is not None else not is_gated(m.mlp)


def norm_has_bias(m: ModelConfig) -> bool:
    """LayerNorm carries weight and bias; RMSNorm a weight only."""
    return norm_kind(m) == "layernorm"


def norm_params(m: ModelConfig) -> int:
    """Parameters of one norm: 2 h (LayerNorm) or h (RMSNorm)."""
    return 2 * m.hidden if norm_has_bias(m) else m.hidden


def qk_norm_params(m: ModelConfig) -> int:
    """Parameters of a layer's two model.qk_norm norms (Megatron's q_layernorm and k_layernorm, each over one
    head's kv_channels, shared by the heads): 2 x (2 d or d); 0 without them, and 0 with model.mla, where
    Megatron's flag selects the latent norms that meshsim's MLA always runs (sim/schedule/mla_ops.py)."""
    if not m.qk_norm or m.mla is not None:
        return 0
    return 2 * (2 * m.kv_channels if norm_has_bias(m) else m.kv_channels)
