"""One rank's shapes of an MoE layer (Megatron-Core MoELayer, megatron/core/transformer/moe/ at Megatron-LM
d98e8a64): how many tokens it routes, sends, receives and runs through each local expert.

With attention tp > 1 the layer input is sequence-sharded (moe_layer.py L636: MoE + TP needs SP), so a
rank routes T = s b / (cp tp) tokens: context parallelism leaves each rank s / cp tokens of every sequence
(its two load-balanced chunks) and SP splits those over tp (s b / cp with tp = 1). Each token picks top_k
experts (router.py), so the alltoall dispatcher permutes T k rows (moe_utils.permute, one row per token-expert pair) and sends them
over the ep group (token_dispatcher.py L705); the busiest rank receives T k x load rows, where
load = model.moe.imbalance (max / mean tokens received over the ep ranks), capped at the capacity factor
when tokens are dropped and equal to it when experts are padded to capacity (moe_utils.get_capacity:
ceil(tokens k / experts x capacity_factor) per expert). With etp > 1 the received rows are all-gathered
over etp (token_dispatcher.py L741-751): each expert-TP rank runs etp T k load rows through its
experts / ep local experts, in ffn_hidden / etp columns. Balanced routing gives every local expert the
same count, rows / local experts (experts.py TEGroupedMLP: one grouped GEMM over the local experts).

The flex dispatcher (DeepEP / HybridEP, fused_a2a.py) sends a token once per destination rank, not once
per expert: `distinct_ranks` is the expected number of ep ranks a token's top_k experts fall on under
uniform routing (force-balanced routing draws random logits, router.py L861-863), group-limited when
router_groups is set (moe_utils.group_limited_topk); `distinct_nodes` counts nodes likewise (DeepEP's
internode kernels cross RDMA once per node, then forward over NVLink).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import MoeConfig
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.mla_ops import mla_dims
from meshsim.sim.schedule.model_family import fc1_width, has_linear_bias
from meshsim.sim.schedule.ops import Gemm
from meshsim.sim.schedule.optimizer_states import main_grad_bytes
from meshsim.sim.schedule.shapes import LayerDims

ROUTING_MAP_BYTES = 1  # bool per (token, expert)
PROB_BYTES = 4  # fp32 routing probabilities (Megatron keeps probs in fp32)
COUNT_BYTES = 8  # int64 token counts per expert

# What each alltoall-dispatcher collective of sim/schedule/moe_ops.py carries, by op key: token rows in the
# model dtype, routing probabilities in fp32, token counts in int64 (validate turns bytes into elements).
ROW_KEYS = (K.MOE_DISPATCH, K.MOE_COMBINE, K.EXPERT_GATHER, K.EXPERT_SCATTER, K.MOE_GATHER, K.MOE_SCATTER)
PROB_KEYS = (K.MOE_DISPATCH_PROBS, K.EXPERT_GATHER_PROBS)
COUNT_KEYS = (K.MOE_META,)


def element_bytes(key: str, dtype_bytes: int) -> int | None:
    """Bytes per element of the MoE collective with op key `key` (above); None for any other key."""
    if key in ROW_KEYS:
        return dtype_bytes
    if key in PROB_KEYS:
        return PROB_BYTES
    return COUNT_BYTES if key in COUNT_KEYS else None


@dataclass(frozen=True)
class MoeDims:
    """Per-rank MoE shapes (module docstring); `ffn`, `fc1_n` are one expert's share on this etp rank."""

    tokens: int  # T: tokens this rank routes
    hidden: int
    experts: int
    local_experts: int  # experts / ep
    top_k: int
    ffn: int  # moe.ffn_hidden / etp
    fc1_n: int  # fc1 columns of one expert on this rank (gate + up when gated)
    shared_ffn: int  # moe.shared_ffn_hidden / tp; 0 = no shared expert
    shared_fc1_n: int
    tp: int
    ep: int
    etp: int
    load: float  # rows the busiest rank receives / mean
    dispatcher: str  # alltoall | allgather | flex
    flex_backend: str  # deepep | hybridep
    mlp: str
    sigmoid: bool  # router score function
    distinct_ranks: float  # flex: expected ep ranks one token goes to
    distinct_nodes: float  # flex: expected nodes one token goes to
    dtype_bytes: int = 2
    grad_fusion: bool = True
    main_grad_bytes: int = 4  # the main-grad element a fused wgrad accumulates into (optimizer_states.py)
    bias: bool = False
    fp8: bool = False  # run.fp8: the experts' and the shared expert's TE linears run FP8 GEMMs (moe_ops.py)
    eager_clamp: bool = False  # quick_geglu with activation_clamp: the clamps run eagerly (moe_act.py)

    @property
    def sent_rows(self) -> int:
        """Token-expert rows this rank permutes and sends: T k."""
        return self.tokens * self.top_k

    @property
    def received_rows(self) -> int:
        """Rows the busiest rank receives from the dispatch: ceil(T k load)."""
        return math.ceil(self.sent_rows * self.load)

    @property
    def expert_rows(self) -> int:
        """Rows through this rank's local experts: etp x received (after the etp all-gather)."""
        return self.etp * self.received_rows

    @property
    def rows_per_expert(self) -> int:
        return math.ceil(self.expert_rows / self.local_experts)

    @property
    def row_bytes(self) -> int:
        return self.hidden * self.dtype_bytes

    @property
    def dispatch_bytes(self) -> int:
        """Bytes of the token all-to-all per rank (nccl-tests size: the whole send buffer), busiest rank."""
        return self.received_rows * self.row_bytes

    @property
    def flex_bytes(self) -> int:
        """The flex dispatcher's bytes per rank: one row per token and destination rank, busiest rank."""
        return math.ceil(self.tokens * self.distinct_ranks * self.load) * self.row_bytes

    def fc1_gemm(self) -> Gemm:
        """All local experts' fc1 as one grouped GEMM (TEGroupedMLP): per expert [rows, h] x [h, fc1_n]."""
        return Gemm(self.rows_per_expert, self.fc1_n, self.hidden, self.local_experts, fp8=self.fp8)

    def fc2_gemm(self) -> Gemm:
        return Gemm(self.rows_per_expert, self.hidden, self.ffn, self.local_experts, fp8=self.fp8)

    def router_gemm(self) -> Gemm:
        """The router's linear: [T, h] x [h, experts] (router.py gating; replicated weight). 16-bit or fp32
        under run.fp8 too: router_gating_linear is Megatron's own autograd function, not a TE module."""
        return Gemm(self.tokens, self.experts, self.hidden)

    def shared_fc1_gemm(self) -> Gemm:
        """The shared expert's fc1 on the gathered sequence (an attention-TP MLP, shared_experts.py)."""
        return Gemm(self.tokens * self.tp, self.shared_fc1_n, self.hidden, fp8=self.fp8)

    def shared_fc2_gemm(self) -> Gemm:
        return Gemm(self.tokens * self.tp, self.hidden, self.shared_ffn, fp8=self.fp8)

    @property
    def expert_params(self) -> int:
        """This rank's routed-expert parameters in one layer: local experts x (fc1 + fc2 shards)."""
        per = self.hidden * self.fc1_n + self.ffn * self.hidden + ((self.fc1_n + self.hidden) if self.bias else 0)
        return self.local_experts * per

    @property
    def linear_weights(self) -> int:
        """Weights (no biases) of this rank's FP8 linears in the MoE block: local experts' fc1 and fc2 and the
        shared expert's (what FP8 casts once per step)."""
        experts = self.local_experts * (self.hidden * self.fc1_n + self.ffn * self.hidden)
        return experts + self.hidden * self.shared_fc1_n + self.shared_ffn * self.hidden

    @property
    def shared_params(self) -> int:
        """The shared expert's fc1 and fc2 shards on this TP rank, with their biases when the model has them
        (SharedExpertMLP is a Megatron MLP: add_bias_linear; fc2's bias is replicated)."""
        if not self.shared_ffn:
            return 0
        biases = self.shared_fc1_n + self.hidden if self.bias else 0
        return self.hidden * self.shared_fc1_n + self.shared_ffn * self.hidden + biases

    @property
    def router_params(self) -> int:
        """The router's replicated [experts, h] weight, and its [experts] bias with add_bias_linear (router.py
        Router.__init__)."""
        return self.hidden * self.experts + (self.experts if self.bias else 0)


def load_factor(moe: MoeConfig) -> float:
    """Rows the busiest rank processes / mean: the imbalance, capped by the capacity factor (tokens past
    capacity are dropped), or the capacity factor itself when experts are padded to capacity."""
    if moe.capacity_factor is None:
        return moe.imbalance
    return moe.capacity_factor if moe.pad_to_capacity else min(moe.imbalance, moe.capacity_factor)


def _p_none(pool: int, mine: int, k: int) -> float:
    """P(none of `mine` experts among k drawn without replacement from `pool`): C(pool-mine, k)/C(pool, k)."""
    if mine <= 0:
        return 1.0
    if pool - mine < k:
        return 0.0
    return math.comb(pool - mine, k) / math.comb(pool, k)


def distinct_holders(moe: MoeConfig, holders: int) -> float:
    """Expected number of `holders` (equal contiguous blocks of the experts: ep ranks, or nodes) a token's
    top_k experts fall on, under uniform routing, group-limited when router_groups is set (module doc)."""
    e, k, per = moe.experts, moe.top_k, moe.experts // holders
    groups, picked = moe.router_groups, moe.router_group_topk
    if not groups or not picked:
        return holders * (1.0 - _p_none(e, per, k))
    size = e // groups
    pool = picked * size
    if size % per == 0:  # a holder lies inside one group
        return holders * (picked / groups) * (1.0 - _p_none(pool, per, k))
    if per % size == 0:  # a holder spans per / size whole groups: how many of them are picked is hypergeometric
        n = per // size
        total = 0.0
        for j in range(0, min(n, picked) + 1):
            p = math.comb(n, j) * math.comb(groups - n, picked - j) / math.comb(groups, picked)
            total += p * (1.0 - _p_none(pool, j * size, k))
        return holders * total
    return holders * (1.0 - _p_none(e, per, k))  # blocks straddle groups unevenly: ungrouped estimate


def moe_dims(rs: ResolvedScenario) -> MoeDims | None:
    """This rank's MoE shapes, or None for a dense model."""
    s = rs.scenario
    moe, m, p = s.model.moe, s.model, s.parallel
    if moe is None:
        return None
    tokens = m.seq_len // rs.cp * p.micro_batch // (rs.tp if p.sp and rs.tp > 1 else 1)
    ffn = moe.ffn_hidden // rs.etp
    shared = (moe.shared_ffn_hidden or 0) // rs.tp
    ep_per_node = max(1, rs.topology.gpus_per_node // rs.etp) if rs.ep * rs.etp > rs.topology.gpus_per_node else rs.ep
    nodes = max(1, rs.ep // ep_per_node)
    return MoeDims(
        tokens=tokens, hidden=m.hidden, experts=moe.experts, local_experts=moe.experts // rs.ep, top_k=moe.top_k,
        ffn=ffn, fc1_n=fc1_width(m.mlp, ffn), shared_ffn=shared, shared_fc1_n=fc1_width(m.mlp, shared),
        tp=rs.tp, ep=rs.ep, etp=rs.etp, load=load_factor(moe), dispatcher=p.moe_dispatcher,
        flex_backend=p.moe_flex_backend, mlp=m.mlp, sigmoid=moe.router == "sigmoid",
        distinct_ranks=distinct_holders(moe, rs.ep), distinct_nodes=distinct_holders(moe, nodes),
        dtype_bytes=m.dtype_bytes, grad_fusion=s.run.grad_accumulation_fusion, bias=has_linear_bias(m),
        main_grad_bytes=main_grad_bytes(s.optimizer, s.run.grad_reduce_dtype),
        fp8=s.run.fp8_on, eager_clamp=m.mlp == "quick_geglu" and m.activation_clamp is not None)


def fp8_linear_weights(rs: ResolvedScenario, d: LayerDims, layers: Sequence[int], head: bool = False) -> int:
    """Weights (no biases) of the FP8 linears on one rank over the layers numbered `layers`, 0 when 16-bit:
    qkv, proj, fc1, fc2 of a dense layer; qkv, proj, the local experts' and the shared expert's of an MoE
    layer (what TE caches as FP8 copies and casts once per step); with `head`, the LM head's too when
    run.fp8_output_proj runs it in FP8. Layers kept in 16 bit (run.fp8_first_last_layers_bf16) count none."""
    if not d.fp8.on:
        return 0
    run, n_layers = rs.scenario.run, rs.scenario.model.layers
    layers = [layer for layer in layers if not run.bf16_layer(layer, n_layers)]  # 16-bit first / last layers
    moe, m, mla = rs.scenario.model.moe, moe_dims(rs), rs.scenario.model.mla
    n_moe = sum(1 for layer in layers if moe is not None and moe.is_moe_layer(layer))
    dense_attention = sum(g.k * g.n for g in (d.qkv_gemm(), d.proj_gemm()))
    attention = mla_dims(d, mla).linear_weights(d.hidden) if mla is not None else dense_attention  # MLA: 5 linears
    moe_weights = n_moe * (attention + m.linear_weights) if m is not None else 0
    lm_head = d.vocab * d.hidden if head and d.fp8.output_proj else 0
    return (len(layers) - n_moe) * (d.linear_weights - dense_attention + attention) + moe_weights + lm_head
