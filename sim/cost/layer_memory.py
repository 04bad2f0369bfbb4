"""Per-layer parameters and activations by layer kind (sim/schedule/layer_kinds.py): a dense layer keeps the
formulas of sim/cost/memory.py; MLA attention and MoE feed-forward blocks are counted here.

Parameters of one layer on one rank, split into the dense part (reduced and sharded over dp) and the
routed experts (over edp): attention (MHA / GQA projections, or MLA's down and up projections, latent
norms and output projection), the two norms, and a dense MLP, or an MoE block's router, shared expert and
local experts (experts / ep of them, each split over etp).

Activations kept for backward, per micro-batch (16-bit activations, fp32 routing probabilities):
- MLA attention, per token outside TP regions (/t under SP): ln1 input 2h, its output (the down
  projections' input) 2h (none under recompute of `layernorm`), the two latents before and after their
  norms 2 (2 q_lora + 2 kv_lora); inside (this rank's heads): Q 2 a_t (d_qk + d_rope), K as much, V 2 a_t d_v, the output projection's input
  2 a_t d_v (flash attention keeps no scores); recompute of mla_up_proj keeps only the last (Q, K, V are
  computed again before the attention backward).
- MoE block: ln2 input 2h and its output 2h per token (/t under SP; the output not under recompute of
  `layernorm`), the dropout mask h; the router's
  probabilities and routing map, T E (4 + 1); per routed row the experts keep fc1's input 2h, fc1's output
  2 fc1_n, the activation's output 2 f_e and the row's probability 4 (expert_rows rows; the probabilities
  multiply the activation inside the experts, experts.py activation_func_with_probs, so the unpermute is
  a plain scatter-add that keeps nothing; recompute of moe_act drops the activation's output; quick-GEGLU's
  eager clamp makes the fused activation keep the clamped copy of fc1's output, 2 fc1_n more, unless
  moe_act is recomputed: sim/schedule/moe_act.py); the shared expert keeps its fc1 output and activation output on the gathered
  tokens, 2 (shared_fc1_n + f_s) per token x tp.
"""

from __future__ import annotations

from meshsim.sim.schedule.layer_kinds import LayerKind, LayerPlan
from meshsim.sim.schedule.moe_shapes import PROB_BYTES, ROUTING_MAP_BYTES


def attention_params(plan: LayerPlan) -> int:
    d = plan.d
    if plan.mla is not None:
        return plan.mla.layer_params(d.hidden)
    return d.params(d.qkv_gemm()) + d.params(d.proj_gemm())


def layer_params(plan: LayerPlan, kind: LayerKind) -> tuple[int, int]:
    """(dense, routed-expert) parameters of one layer of `kind` on this rank."""
    d = plan.d
    dense = attention_params(plan) + d.norm_params_per_layer
    if not kind.moe:
        return dense + d.params(d.fc1_gemm()) + d.params(d.fc2_gemm()), 0
    m = plan.moe
    return dense + m.router_params + m.shared_params, m.expert_params


def norm_kept_bytes(plan: LayerPlan) -> int:
    """Bytes per token of a separate norm's output kept for backward: 2h, none under recompute of
    `layernorm` (sim/schedule/shapes.RECOMPUTE_MODULES)."""
    return 0 if plan.d.recomputes("layernorm") else 2 * plan.d.hidden


def mla_activation_bytes(plan: LayerPlan) -> int:
    d, a = plan.d, plan.mla
    outside = 2 * d.hidden + norm_kept_bytes(plan) + 4 * ((a.q_lora or 0) + a.kv_lora) + (d.hidden if d.dropout else 0)
    qkv = 2 * a.heads * (2 * (a.qk + a.rope) + a.v)
    inside = 2 * a.heads * a.v + (0 if d.recomputes("mla_up_proj") else qkv)
    return d.tokens_out * outside + d.tokens * inside


def moe_activation_bytes(plan: LayerPlan) -> int:
    d, m = plan.d, plan.moe
    outside = 2 * d.hidden + norm_kept_bytes(plan) + (d.hidden if d.dropout else 0)
    router = m.tokens * m.experts * (PROB_BYTES + ROUTING_MAP_BYTES)
    act_out = 0 if d.recomputes("moe_act") else 2 * m.ffn + (2 * m.fc1_n if m.eager_clamp else 0)
    experts = m.expert_rows * (2 * m.hidden + 2 * m.fc1_n + act_out + PROB_BYTES)
    shared = m.tokens * m.tp * 2 * (m.shared_fc1_n + m.shared_ffn) if m.shared_ffn else 0
    return d.tokens_out * outside + router + experts + shared
