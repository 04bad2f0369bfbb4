"""The model's dimensions, once: ModelDims (the whole model, as validate builds it) and its per-rank view
LayerDims (one TP rank's shapes, which every op template and the memory model use).

t = tp. Heads, KV heads (replicated when kv_heads < t: each rank keeps max(1, kv_heads / t)), FFN width
and the (padded) vocabulary are sharded by t; under SP the norm/dropout/residual kernels see s*b/t tokens.
Context parallelism (cp > 1) gives each rank s / cp tokens of every sequence (chunks i and 2 cp - 1 - i of
2 cp, sim/schedule/cp_ops.py): LayerDims.seq is that local length, so every op outside the attention core
runs on s / cp tokens, and the core's own ops (cp_ops.py) see the whole sequence through `cp`.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.cp_checks import a2a_size
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import ParallelConfig, Scenario
from meshsim.sim.schedule.fp8_rules import Fp8Plan, non_tn_fp8_gemm
from meshsim.sim.schedule.model_family import (
    fc1_width,
    has_linear_bias,
    norm_has_bias,
    norm_params,
    qk_norm_params,
)
from meshsim.sim.schedule.ops import Attention, Gemm
from meshsim.sim.schedule.optimizer_states import main_grad_bytes

# tp_comm_overlap: Transformer Engine's userbuffers with its default configuration (transformer_engine/
# pytorch/module/base.py @d0067d0, initialize_ub get_default_config; comm_gemm_overlap.cpp): the gathers
# before qkv / fc1 and before the proj / fc2 dgrad run as a ring exchange in tp steps over the copy engine
# (num_splits = tp, no SMs held); the reduce-scatters after proj / fc2 as a pipeline of 4 GEMM chunks
# (num_splits 4) and the column-parallel layers' dgrad / wgrad overlap their collective whole ("bulk"),
# both with a 16-SM userbuffers kernel beside GEMMs that run on the other SMs (set_sm_margin).
# A pipeline chunk's collective is priced as its share of the whole message's NCCL time (the userbuffers
# kernel streams every chunk at the rate of the whole, with no per-chunk protocol ramp): Collective.kernel
# USERBUFFERS (sim/results/costers.py).
UB_PIPELINE_SPLITS = 4
UB_COMM_SMS = 16
USERBUFFERS = "userbuffers"


# Megatron-Core's --recompute-modules under --recompute-granularity selective (megatron/core/transformer/
# moe/README.md "Fine-grained Recomputation"; transformer_config.py recompute_modules, default ["core_attn"]):
# what each one stops keeping for backward and re-runs there (sim/cost/layer_memory.py, the templates):
# - core_attn: the attention core (unfused: its scores; flash keeps none) - its forward again;
# - mla_up_proj: MLA's query / key-value up projections and RoPE (Q, K, V) - the up GEMMs (with their SP
#   gathers of the latents) and RoPE again before the attention backward;
# - mlp: a dense layer's MLP (fc1 and activation outputs; standard checkpointing) - its forward again
#   (modeled with its norm and residual, a few elementwise kernels more than Megatron's checkpoint);
# - moe_act: the experts' activation output - the activation again before the fc2 backward;
# - layernorm: the output of a norm Megatron runs as its own module (an MoE layer's pre-MLP norm, MLA's input
#   norm; a norm fused into its linear, TE's LayerNormLinear, is an IdentityOp and has none to drop) - the
#   norm again when the block's backward starts (transformer_layer.py L470-530: CheckpointWithoutOutput
#   registered on the block's output).
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe_act", "layernorm")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def recompute_modules(p: ParallelConfig) -> frozenset[str]:
    return frozenset(DEFAULT_RECOMPUTE_MODULES if p.recompute_modules is None else p.recompute_modules)


@dataclass(frozen=True)
class LayerDims:
    """Per-rank shapes of one layer and the head. heads/kv_heads/ffn/vocab are this rank's share.

    Model-family rules (norm kind, biases, gated MLP) come from sim/schedule/model_family.py."""

    seq: int
    micro_batch: int
    hidden: int
    tp: int
    sp: bool
    heads: int
    kv_heads: int  # max(1, kv_heads / tp): KV heads are replicated when kv_heads < tp
    head_dim: int
    ffn: int  # ffn_hidden / tp
    vocab: int  # padded vocab / tp
    mlp: str
    flash: bool
    dropout: bool
    recompute: str
    chunks: int  # tp_comm_overlap: ring-exchange steps of the gathers, tp (1 = no overlap)
    bias: bool
    norm_params: int  # parameters of one norm (2h LayerNorm, h RMSNorm)
    dtype_bytes: int = 2
    grad_fusion: bool = True  # run.grad_accumulation_fusion (sim/schedule/run_settings.py)
    main_grad_bytes: int = 4  # the main-grad element a fused wgrad accumulates into (optimizer_states.py)
    deterministic: bool = False  # run.deterministic
    rs_chunks: int = 1  # tp_comm_overlap: the reduce-scatters' pipelined GEMM chunks, UB_PIPELINE_SPLITS
    comm_sms: int = 0  # tp_comm_overlap: SMs the userbuffers kernel holds beside a pipeline or bulk GEMM
    tp_grad_overlap: bool = True  # run.tp_grad_reduce_overlap (sim/schedule/run_settings.py)
    window: int | None = None  # sliding-window attention on this layer (model.sliding_window)
    fp8: Fp8Plan = Fp8Plan()  # run.fp8: the four linears' GEMMs in FP8 (sim/schedule/fp8_rules.py)
    recompute_modules: frozenset[str] = frozenset({"core_attn"})  # recompute "selective": parallel.recompute_modules
    qk_norm_params: int = 0  # model.qk_norm: the q and k norms' parameters (model_family.qk_norm_params); 0 = none

    def recomputes(self, module: str) -> bool:
        """Selective recompute re-runs `module` in backward (RECOMPUTE_MODULES)."""
        return self.recompute == "selective" and module in self.recompute_modules
    cp: int = 1  # context parallel: `seq` is this rank's s / cp tokens of each sequence
    cp_comm: str = "p2p"  # parallel.cp_comm
    cp_a2a: int = 1  # ranks of the all-to-all level (cp for a2a, hierarchical_cp[0] for a2a+p2p, else 1)

    @property
    def tokens(self) -> int:
        return self.seq * self.micro_batch

    @property
    def tokens_out(self) -> int:
        """Tokens on this rank outside TP regions: s*b/t under SP, s*b otherwise."""
        return self.tokens // self.tp if self.sp else self.tokens

    @property
    def act_bytes(self) -> int:
        """A full [s, b, h] 16-bit activation: the payload of every boundary collective."""
        return self.tokens * self.hidden * self.dtype_bytes

    @property
    def fc1_n(self) -> int:
        return fc1_width(self.mlp, self.ffn)

    def qkv_gemm(self) -> Gemm:
        return Gemm(self.tokens, (self.heads + 2 * self.kv_heads) * self.head_dim, self.hidden, fp8=self.fp8.on)

    def proj_gemm(self) -> Gemm:
        return Gemm(self.tokens, self.hidden, self.heads * self.head_dim, fp8=self.fp8.on)

    def fc1_gemm(self) -> Gemm:
        return Gemm(self.tokens, self.fc1_n, self.hidden, fp8=self.fp8.on)

    def fc2_gemm(self) -> Gemm:
        return Gemm(self.tokens, self.hidden, self.ffn, fp8=self.fp8.on)

    def attention(self, backward: bool) -> Attention:
        return Attention(self.micro_batch, self.heads, self.kv_heads, self.seq, self.head_dim, True, backward,
                         backward and self.deterministic, self.window, fp8=self.fp8.attention, dropout=self.dropout)

    def params(self, g: Gemm) -> int:
        """Weight [k, n] of a linear, plus its bias [n] (n = h for row-parallel: replicated)."""
        return g.k * g.n + (g.n if self.bias else 0)

    @property
    def linear_weights(self) -> int:
        """Weights (no biases) of the layer's four linears on this rank: what FP8 quantizes and caches."""
        return sum(g.k * g.n for g in (self.qkv_gemm(), self.proj_gemm(), self.fc1_gemm(), self.fc2_gemm()))

    @property
    def qk_norm(self) -> bool:
        """model.qk_norm: each query and key head is normalized before the attention core."""
        return self.qk_norm_params > 0

    @property
    def norm_params_per_layer(self) -> int:
        """ln1, ln2 and model.qk_norm's q and k norms."""
        return 2 * self.norm_params + self.qk_norm_params

    @property
    def layer_params(self) -> int:
        gemms = (self.qkv_gemm(), self.proj_gemm(), self.fc1_gemm(), self.fc2_gemm())
        return sum(self.params(g) for g in gemms) + self.norm_params_per_layer

    @property
    def sp_params_per_layer(self) -> int:
        """Replicated params whose grads are partial per sequence shard under SP: norms, row biases."""
        return self.norm_params_per_layer + (2 * self.hidden if self.bias else 0)


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x tp (default 128) so
    every shard is whole and aligned (megatron/training/tokenizer: _vocab_size_with_padding)."""
    step = divisible_by * tp
    return -(-vocab // step) * step


@dataclass(frozen=True)
class ModelDims:
    """The whole model as the scenario describes it (unsharded widths) and its TP/DP layout; validate builds
    full tensors from it and `per_rank` is the simulator's view of one TP rank (LayerDims)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    mlp: str
    linear_bias: bool  # sim/schedule/model_family.has_linear_bias
    norm_bias: bool  # sim/schedule/model_family.norm_has_bias (LayerNorm weight+bias; RMSNorm weight only)
    seq: int
    vocab: int
    micro_batch: int
    tied: bool
    tp: int
    dp: int
    sp: bool
    recompute: str
    pp: int = 1  # pipeline stages
    micro_batches: int = 1  # per DP rank and step (> 1 only with pp > 1: the pipeline's m)
    cp: int = 1  # context parallel: each rank holds seq / cp tokens of a sequence
    qk_norm: bool = False  # model.qk_norm (standard attention; with MLA the latent norms, always run)

    @classmethod
    def from_scenario(cls, s: Scenario, dp: int | None = None) -> ModelDims:
        m, p = s.model, s.parallel
        dp = dp if dp is not None else (p.dp if isinstance(p.dp, int) else 1)
        micro_batches = p.global_batch // (p.micro_batch * dp) if p.pp > 1 else 1
        return cls(m.layers, m.hidden, m.heads, m.num_kv_heads, m.kv_channels, m.ffn, m.mlp,
                   has_linear_bias(m), norm_has_bias(m), m.seq_len,
                   m.vocab, p.micro_batch, m.tied_embeddings, p.tp, dp, p.sp, p.recompute, p.pp, micro_batches,
                   p.cp, qk_norm_params(m) > 0)

    @property
    def batch(self) -> int:
        """Sequences in one step over all DP ranks (micro_batches micro-batches each)."""
        return self.micro_batch * self.micro_batches * self.dp

    def columns(self, dp_rank: int, micro_batch: int = 0) -> slice:
        """validate's batch columns of one DP rank's micro-batch: DP rank-major, then micro-batch."""
        first = (dp_rank * self.micro_batches + micro_batch) * self.micro_batch
        return slice(first, first + self.micro_batch)

    def per_rank(self, s: Scenario, tp: int | None = None, any_layout_fp8: bool = False) -> LayerDims:
        """One TP rank's share (LayerDims): heads, KV heads (replicated when kv_heads < tp), FFN width and the
        padded vocabulary divided by tp; run settings (attention kernel, dropout, dtype, overlap) from `s`."""
        m, p = s.model, s.parallel
        t = self.tp if tp is None else tp
        overlap = p.tp_comm_overlap and t > 1 and self.sp  # SP: scenarios/checks.py check_tp_comm_overlap
        return LayerDims(
            seq=self.seq // self.cp, micro_batch=self.micro_batch, hidden=self.hidden, tp=t, sp=self.sp and t > 1,
            heads=self.heads // t, kv_heads=max(1, self.kv_heads // t), head_dim=self.head_dim,
            ffn=self.ffn // t, vocab=padded_vocab(self.vocab, t, m.vocab_divisible_by) // t, mlp=self.mlp,
            flash=m.attention == "flash", dropout=m.dropout, recompute=self.recompute,
            chunks=t if overlap else 1, rs_chunks=UB_PIPELINE_SPLITS if overlap else 1,
            comm_sms=UB_COMM_SMS if overlap else 0,
            bias=self.linear_bias, norm_params=norm_params(m), qk_norm_params=qk_norm_params(m),
            dtype_bytes=m.dtype_bytes,
            grad_fusion=s.run.grad_accumulation_fusion, deterministic=s.run.deterministic,
            main_grad_bytes=main_grad_bytes(s.optimizer, s.run.grad_reduce_dtype),
            tp_grad_overlap=s.run.tp_grad_reduce_overlap,
            fp8=Fp8Plan(s.run.fp8, s.run.fp8_wgrad, s.run.fp8_on and s.run.fp8_attention, any_layout_fp8,
                        s.run.fp8_on and s.run.fp8_output_proj),
            recompute_modules=recompute_modules(p), cp=self.cp, cp_comm=p.cp_comm,
            cp_a2a=a2a_size(s) if self.cp > 1 else 1)


def layer_dims(rs: ResolvedScenario, tp: int | None = None) -> LayerDims:
    """Per-rank shapes for `rs` (or for the same model at another tp, e.g. tp=1 for unsharded FLOPs)."""
    return ModelDims.from_scenario(rs.scenario, rs.dp).per_rank(rs.scenario, rs.tp if tp is None else tp,
                                                                non_tn_fp8_gemm(rs.gpu.compute_capability))
