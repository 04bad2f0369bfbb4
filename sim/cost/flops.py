"""Model FLOPs per step (MFU convention: no recompute) and hardware FLOPs (recompute included).

Counting the GEMMs of one layer's forward per token (unsharded: h hidden, a heads of d = h/a, n_kv KV
heads, f ffn_hidden, s sequence):
    qkv 2h(a + 2 n_kv)d + proj 2(a d)h + attention 2 s a d (QK^T) + 2 s a d (scores x V)
    + MLP: gelu/relu2 2hf + 2fh = 4hf; swiglu 2h(2f) + 2fh = 6hf (sim/schedule/model_family.py).
The output layer adds 2hV per token. Backward is twice the forward (dgrad + wgrad), so per step
    model = 3 B s (l F_layer + 2 h V),   B = global batch (sequences), V unpadded.
For n_kv = a, a d = h, gelu with f = 4h: F_layer = 24h^2 + 4sh and model = 72 B l s h^2 (1 + s/(6h)
+ V/(12 l h)) (Narayanan et al. 2021; reference/hardware-facts.md). The attention term counts the full
s x s score matrix (no causal halving), as that formula does. Embedding lookups, norms, softmax and
other elementwise work are not counted.

Hardware FLOPs add what recompute runs again: full recompute one more layer forward (l F_layer per
token); selective the attention core (4 s a d per token per layer).
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import ModelConfig
from meshsim.sim.schedule.model_family import mlp_flops_per_token


def layer_forward_flops_per_token(m: ModelConfig) -> float:
    h, a, kv, d, f = m.hidden, m.heads, m.num_kv_heads, m.kv_channels, m.ffn
    mlp = mlp_flops_per_token(m.mlp, h, f)
    return 2.0 * h * (a + 2 * kv) * d + 2.0 * a * d * h + attention_core_flops_per_token(m) + mlp


def attention_core_flops_per_token(m: ModelConfig) -> float:
    """QK^T and scores x V over the full s x s matrix: 4 s a d."""
    return 4.0 * m.seq_len * m.heads * m.kv_channels


def model_flops_per_step(rs: ResolvedScenario) -> float:
    m = rs.scenario.model
    tokens = rs.scenario.parallel.global_batch * m.seq_len
    return 3.0 * tokens * (m.layers * layer_forward_flops_per_token(m) + 2.0 * m.hidden * m.vocab)


def hardware_flops_per_step(rs: ResolvedScenario) -> float:
    m, p = rs.scenario.model, rs.scenario.parallel
    tokens = p.global_batch * m.seq_len
    extra = {"full": layer_forward_flops_per_token(m), "selective": attention_core_flops_per_token(m)}
    return model_flops_per_step(rs) + tokens * m.layers * extra.get(p.recompute, 0.0)
