"""The scenario schema's base and its model section: the strict frozen base every section derives from, and
the model (dense shape, MoE, MLA). scenarios/schema.py assembles the whole scenario from these and the
hardware, topology, parallel, run and optimizer sections; import any of them from there.

Field-by-field documentation (units, defaults) lives in docs/scenarios.md; keep the two in step.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshsim.sim.core.quantities import CapacityFactor


class Frozen(BaseModel):
    """Strict: `true` is not a count and 4.0 is not an int; .inf and .nan are refused in number fields.

    Start-up (every `meshsim` command builds these classes): defer_build builds a model's validator when it
    first validates, not when its class is defined, so a section validated only inside a Scenario is built
    once, inside the Scenario's validator; and the module has no `from __future__ import annotations`, so
    pydantic reads each field's type as it is instead of evaluating its text. The same validation."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False, defer_build=True)


def defaults_of(section: type[Frozen]):
    """A section field's default, the section with every field at its default: made by `model_construct` when
    a scenario leaves the section out (a default is never validated), so defining a class, or loading a
    scenario, builds no section's own validator (a default instance, `= Section()`, would build one at import:
    ~10 ms of every command's start-up). Equal (==, hash, dumps, fields set: none) to `Section()`."""
    return Field(default_factory=section.model_construct)


class MoeConfig(Frozen):
    """Mixture of experts (Megatron-Core MoELayer). docs/scenarios.md gives each field's Megatron flag."""

    experts: int = Field(gt=0)  # --num-experts
    top_k: int = Field(gt=0)  # --moe-router-topk
    ffn_hidden: int = Field(gt=0)  # per expert: --moe-ffn-hidden-size
    shared_ffn_hidden: int | None = Field(default=None, gt=0)  # --moe-shared-expert-intermediate-size; unset: none
    dense_layers: int = Field(default=0, ge=0)  # the first N layers are dense (--moe-layer-freq [0]*N+[1]*...)
    every: int = Field(default=1, gt=0)  # after those, MoE every k-th layer (1 = all)
    router: Literal["softmax", "sigmoid"] = "softmax"  # --moe-router-score-function
    router_groups: int | None = Field(default=None, gt=0)  # --moe-router-num-groups (group-limited routing)
    router_group_topk: int | None = Field(default=None, gt=0)  # --moe-router-group-topk
    capacity_factor: CapacityFactor | None = None  # --moe-expert-capacity-factor; unset: dropless
    pad_to_capacity: bool = False  # --moe-pad-expert-input-to-capacity
    # max over expert-parallel ranks of tokens received / mean (1.0: force-balanced routing)
    imbalance: float = Field(default=1.0, ge=1.0, le=1024.0)

    def is_moe_layer(self, layer: int) -> bool:
        """Layer `layer` (0-based) is an MoE layer: past the dense ones, every `every`-th."""
        return layer >= self.dense_layers and (layer - self.dense_layers) % self.every == 0


class MlaConfig(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3; Megatron --multi-latent-attention)."""

    q_lora_rank: int | None = Field(default=None, gt=0)  # --q-lora-rank; unset: a plain q projection
    kv_lora_rank: int = Field(gt=0)  # --kv-lora-rank
    qk_head_dim: int = Field(gt=0)  # --qk-head-dim
    qk_rope_head_dim: int = Field(gt=0)  # --qk-pos-emb-head-dim
    v_head_dim: int = Field(gt=0)  # --v-head-dim

    @property
    def q_head_dim(self) -> int:
        """Query / key head width: the no-position part plus the rotary part."""
        return self.qk_head_dim + self.qk_rope_head_dim


# gated MLP activations: fc1 computes gate and up (sim/schedule/model_family.py states the rules)
GATED_MLP_NAMES = ("swiglu", "quick_geglu")


class ModelConfig(Frozen):
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(default=None, gt=0)  # default: = heads (multi-head attention)
    ffn_hidden: int | None = Field(default=None, gt=0)  # default: 4*hidden (gelu, relu2), 8/3*hidden rounded (gated)
    # relu2: non-gated squared ReLU (Nemotron); quick_geglu: Megatron --quick-geglu (GPT-OSS), gated
    mlp: Literal["gelu", "swiglu", "relu2", "quick_geglu"] = "gelu"
    # Megatron --activation-func-clamp-value: gated MLPs clamp gate and up to it first (GPT-OSS: 7.0)
    activation_clamp: float | None = Field(default=None, ge=1e-3, le=1e6)
    norm: Literal["layernorm", "rmsnorm"] | None = None  # default: sim/schedule/model_family.py (rmsnorm for gated)
    bias: bool | None = None  # biases on every linear; default: sim/schedule/model_family.py (none for gated)
    seq_len: int = Field(gt=0)
    vocab: int = Field(gt=0)
    dtype: Literal["bf16", "fp16"] = "bf16"
    attention: Literal["flash", "unfused"] = "flash"
    dropout: bool = True  # Megatron-style hidden/attention dropout kernels present
    tied_embeddings: bool = False
    vocab_divisible_by: int = Field(default=128, gt=0)  # Megatron --make-vocab-size-divisible-by (x tp)
    head_dim: int | None = Field(default=None, gt=0)  # Megatron --kv-channels; default hidden / heads
    moe: MoeConfig | None = None  # mixture of experts; unset: every layer dense
    mla: MlaConfig | None = None  # multi-head latent attention; unset: MHA / GQA
    # --qk-layernorm: a norm of the model's kind over each query and key head (Qwen3, OLMo 2, Gemma 3)
    qk_norm: bool = False
    sliding_window: int | None = Field(default=None, gt=0)  # --window-size (tokens) on windowed layers
    sliding_window_skip_every: int = Field(default=2, gt=0)  # --window-attn-skip-freq: every k-th layer full
    # Megatron --mtp-num-layers: multi-token prediction depths after the decoder (DeepSeek-V3: 1)
    mtp_layers: int = Field(default=0, ge=0, le=8)

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        return 256 * ((8 * self.hidden // 3 + 255) // 256) if self.mlp in GATED_MLP_NAMES else 4 * self.hidden

    @property
    def kv_channels(self) -> int:
        """Per-head width of Q, K and V: model.head_dim, else hidden / heads (Megatron arguments.py)."""
        return self.head_dim or self.hidden // self.heads

    def windowed(self, layer: int) -> bool:
        """Layer `layer` attends within model.sliding_window: all but every sliding_window_skip_every-th
        layer (Megatron's window_attn_skip_freq: layer l is full when (l + 1) % freq == 0)."""
        return self.sliding_window is not None and (layer + 1) % self.sliding_window_skip_every != 0

    @property
    def dtype_bytes(self) -> int:
        return 2
