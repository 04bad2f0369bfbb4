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
token); selective the attention core (4 s a d per token per layer) when core_attn is among
parallel.recompute_modules (the default). The other modules' recomputed GEMMs (mla_up_proj, mlp) are not
added here (the schedule runs them; HFU understates them).

MoE and MLA models are counted as Megatron-LM's num_floating_point_operations does (megatron/training/
training.py L802-1310 at d98e8a64), which Megatron-Bridge's "Model TFLOP/sec/GPU" follows (its
Qwen3-30B-A3B rows: 23.0 GFLOP per token, 203 TFLOP/s at 8,826 tokens/s/GPU, reference section 1.3):
active parameters only (top_k routed experts and the shared expert per token), the attention core
causal-halved, the padded vocabulary, per token and layer x 3 (fwd + dgrad + wgrad) x 2 (FMA):
    MLP      h f g (dense layers) | h (f_moe k + f_shared) g (MoE layers),   g = 3 swiglu, 2 otherwise
             (Megatron keys g on --swiglu, so a gated quick-GEGLU model counts 2: GPT-OSS-120B then has
             2.716e10 FLOPs per token; Bridge's H100 row, 158 TFLOP/s at 5,824 tokens/s, 2.713e10, section 1.3)
    MHA/GQA  h (q + 2 kv) + q h (projections) + s q (core; q = heads x kv_channels, kv = groups x kv_channels)
    MLA      q_lora (h + a (d_qk + d_rope) + 1) [or h a (d_qk + d_rope)] + kv_lora (h + a (d_qk + d_v) + 1)
             + h d_rope + a d_v h (projections) + s a (d_qk + d_rope + d_v) / 2 (core)
    logits   h V_padded
(sliding windows are not discounted there either).

Multi-token prediction (model.mtp_layers = D; sim/schedule/mtp_ops.py) adds per token, as Megatron's count
does (training.py L1042-1046, L1288-1303): D more layers of the last layer's kind, D eh_proj GEMMs
(2h x h: 2 h^2 multiply-accumulates, plus 3h for its norms in Megatron's count) and D more logits GEMMs.
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import ModelConfig, ParallelConfig
from meshsim.sim.schedule.model_family import mlp_flops_per_token
from meshsim.sim.schedule.mtp_ops import mtp_layer_ids
from meshsim.sim.schedule.shapes import padded_vocab, recompute_modules


def layer_forward_flops_per_token(m: ModelConfig) -> float:
    h, a, kv, d, f = m.hidden, m.heads, m.num_kv_heads, m.kv_channels, m.ffn
    mlp = mlp_flops_per_token(m.mlp, h, f)
    return 2.0 * h * (a + 2 * kv) * d + 2.0 * a * d * h + attention_core_flops_per_token(m) + mlp


def attention_core_flops_per_token(m: ModelConfig) -> float:
    """QK^T and scores x V over the full s x s matrix: 4 s a d."""
    return 4.0 * m.seq_len * m.heads * m.kv_channels


def megatron_convention(m: ModelConfig) -> bool:
    """MoE and MLA models are counted as Megatron-LM / Megatron-Bridge count them (module docstring)."""
    return m.moe is not None or m.mla is not None


def _attention_terms(m: ModelConfig) -> tuple[float, float]:
    """(projection, core per sequence position) multiply-accumulates per token of one layer, Megatron's count."""
    h, s = m.hidden, m.seq_len
    if m.mla is not None:
        a, mla = m.heads, m.mla
        rope_qk = mla.qk_head_dim + mla.qk_rope_head_dim
        q = mla.q_lora_rank * (h + a * rope_qk + 1) if mla.q_lora_rank else h * a * rope_qk
        kv = mla.kv_lora_rank * (h + a * (mla.qk_head_dim + mla.v_head_dim) + 1) + h * mla.qk_rope_head_dim
        return q + kv + a * mla.v_head_dim * h, s * a * (rope_qk + mla.v_head_dim) / 2.0
    q, kv = m.kv_channels * m.heads, m.kv_channels * m.num_kv_heads
    return h * (q + 2 * kv) + q * h, s * q


def megatron_flops_per_token(rs: ResolvedScenario) -> float:
    """Model FLOPs per token, Megatron-LM's num_floating_point_operations (module docstring)."""
    m = rs.scenario.model
    g, mtp, layers = 3 if m.mlp == "swiglu" else 2, m.mtp_layers, m.layers + m.mtp_layers
    moe_layers = sum(1 for layer in range(m.layers) if m.moe is not None and m.moe.is_moe_layer(layer))
    moe_layers += sum(1 for layer in mtp_layer_ids(m) if m.moe is not None and m.moe.is_moe_layer(layer))
    mlp = m.hidden * m.ffn * g * (layers - moe_layers)
    if m.moe is not None:
        mlp += m.hidden * (m.moe.ffn_hidden * m.moe.top_k + (m.moe.shared_ffn_hidden or 0)) * g * moe_layers
    proj, core = _attention_terms(m)
    vocab = padded_vocab(m.vocab, rs.tp, m.vocab_divisible_by)
    eh_proj = mtp * (3 * m.hidden + 2 * m.hidden * m.hidden)
    return 6.0 * (mlp + layers * (proj + core) + eh_proj + m.hidden * vocab * (1 + mtp))


def model_flops_per_step(rs: ResolvedScenario) -> float:
    m = rs.scenario.model
    tokens = rs.scenario.parallel.global_batch * m.seq_len
    if megatron_convention(m):
        return tokens * megatron_flops_per_token(rs)
    mtp = m.mtp_layers
    return 3.0 * tokens * ((m.layers + mtp) * layer_forward_flops_per_token(m) + 2.0 * m.hidden * m.vocab * (1 + mtp)
                           + 4.0 * m.hidden * m.hidden * mtp)


def _recomputes_core(p: ParallelConfig) -> bool:
    """Selective recompute re-runs the attention core (Megatron's default module list)."""
    return "core_attn" in recompute_modules(p)


def hardware_flops_per_step(rs: ResolvedScenario) -> float:
    m, p = rs.scenario.model, rs.scenario.parallel
    tokens = p.global_batch * m.seq_len
    layers = m.layers + m.mtp_layers  # an MTP layer recomputes as the decoder's do
    if megatron_convention(m):
        per_layer = megatron_flops_per_token(rs) / 3.0 / layers  # one forward, averaged over layers
        core = 2.0 * _attention_terms(m)[1]
        extra = {"full": per_layer, "selective": core if _recomputes_core(p) else 0.0}
        return model_flops_per_step(rs) + tokens * layers * extra.get(p.recompute, 0.0)
    extra = {"full": layer_forward_flops_per_token(m),
             "selective": attention_core_flops_per_token(m) if _recomputes_core(p) else 0.0}
    return model_flops_per_step(rs) + tokens * layers * extra.get(p.recompute, 0.0)
