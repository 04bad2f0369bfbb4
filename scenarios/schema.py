"""The scenario schema: a frozen, validated description of model, hardware, topology and parallelism.

Field-by-field documentation (units, defaults) lives in docs/scenarios.md; keep the two in step.
Cross-field checks (tp divides heads, ...) live in scenarios/checks.py; loading in scenarios/load.py.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from meshsim.sim.core.engines import DEFAULT_ENGINE, EngineName
from meshsim.sim.core.quantities import (
    BucketMiB,
    CapacityFactor,
    Efficiency,
    Fraction,
    Gbitps,
    GBps,
    LatencyUs,
    MemGB,
    Oversubscription,
    Slowdown,
    TFLOPs,
)


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


class ComputeTuning(Frozen):
    """Compute cost-model knobs; defaults and their sources are in sim/cost/compute.py and docs/cost-models.md."""

    gemm_efficiency: Efficiency | None = None  # large-GEMM fraction of peak
    # large FP8 GEMM fraction of the FP8 peak; default by GPU generation (sim/cost/fp8_gemm.py)
    fp8_gemm_efficiency: Efficiency | None = None
    mem_bw_efficiency: Efficiency | None = None  # achievable fraction of HBM bandwidth
    # fraction of HBM bandwidth Megatron's elementwise kernels reach (norms, dropout, activations, softmax)
    elementwise_efficiency: Efficiency | None = None
    attention_efficiency: Efficiency | None = None  # flash-attention fraction of peak
    deterministic_attention_slowdown: Slowdown | None = None  # run.deterministic (sim/schedule/run_settings.py)
    launch_overhead_us: LatencyUs | None = None
    host_dispatch_us: LatencyUs | None = None  # CPU time to issue one op (sim/cost/host_dispatch.py)
    tile_m: int | None = Field(default=None, gt=0)
    tile_n: int | None = Field(default=None, gt=0)
    # load kappa a collective's bandwidth part puts on its rank's compute resource (0 = none; sim/engine/events.py)
    comm_interference: Fraction | None = None


class NetworkTuning(Frozen):
    """Collective cost-model knobs; defaults and sources in sim/cost/collectives/protocols.py."""

    link_efficiency: Efficiency | None = None  # achievable fraction of link peak
    algo: Literal["auto", "ring", "tree", "nvls", "nvls_tree", "hierarchical"] = "auto"
    protocol: Literal["auto", "ll", "ll128", "simple"] = "auto"


class HardwareConfig(Frozen):
    gpu: str | None = None  # GPU preset; default: the topology preset's GPU
    profile: str | None = None  # path to a calibration profile YAML (meshsim calibrate); relative to the scenario
    # software-release family whose constants apply (scenarios/profiles/<name>.yaml, scenarios/releases.py);
    # unset: the newest calibrated release. A calibrated profile's figures override the release's.
    release: str | None = Field(default=None, min_length=1, max_length=64)
    peak_tflops: TFLOPs | None = None
    fp8_peak_tflops: TFLOPs | None = None  # FP8 dense TFLOP/s; default: the GPU preset's
    fp4_peak_tflops: TFLOPs | None = None  # FP4 (NVFP4) dense TFLOP/s; default: the GPU preset's
    mem_bw_gbps: GBps | None = None
    mem_gb: MemGB | None = None
    compute: ComputeTuning = defaults_of(ComputeTuning)
    network: NetworkTuning = defaults_of(NetworkTuning)


class FabricConfig(Frozen):
    """InfiniBand fabric joining nodes: one NIC per GPU, rail-optimized two-level fat tree."""

    nic_gbitps: Gbitps | None = None  # NIC line rate Gb/s; default from the preset
    switch_latency_us: LatencyUs = 0.5
    oversubscription: Oversubscription = 1.0  # leaf uplink : downlink capacity ratio 1:x


class TopologyConfig(Frozen):
    preset: str | None = None  # a preset name (meshsim topologies) ...
    file: str | None = None  # ... or a custom topology YAML (relative to the scenario)
    nodes: int = Field(default=1, gt=0)
    fabric: FabricConfig = defaults_of(FabricConfig)
    nvlink_gbps: GBps | None = None  # override NVLink bandwidth per GPU (what-ifs)
    # rack-scale presets (NVL72): the GPUs of each rack the job uses; default: parallel.gpus spread evenly over
    # the nodes when they divide (256 GPUs on 4 racks: 64 each), else all 72 (scenarios/load.py)
    gpus_per_node: int | None = Field(default=None, gt=0)


RecomputeModule = Literal["core_attn", "mla_up_proj", "mlp", "moe_act", "layernorm"]


class ParallelConfig(Frozen):
    tp: int = Field(default=1, gt=0)
    sp: bool = False
    pp: int = Field(default=1, gt=0)  # pipeline stages (sim/schedule/pipeline.py)
    vp: int = Field(default=1, gt=0)  # virtual stages (model chunks) per rank: > 1 = interleaved 1F1B
    microbatch_group_size: int | None = Field(default=None, gt=0)  # interleaved: N, default pp
    first_stage_layers: int | None = Field(default=None, ge=0)  # uneven split (vp = 1): layers on stage 0
    last_stage_layers: int | None = Field(default=None, ge=0)  # ... and on the last stage
    account_for_embedding_in_split: bool = False  # the embedding counts as one layer of stage 0
    account_for_loss_in_split: bool = False  # the output layer + loss count as one layer of the last stage
    # Megatron --pipeline-model-parallel-layout ("Et|(tt|)*30mL"): layers per virtual stage (scenarios/pipeline_split.py)
    pipeline_layout: str | None = Field(default=None, min_length=1, max_length=4096)
    p2p_overlap: bool = True  # interleaved: isend/irecv overlapped with compute (Megatron --overlap-p2p-comm)
    # 2021-2022 Megatron-LM --scatter-gather-tensors-in-pipeline (on by default there; not in Megatron-Core): each TP
    # rank sends 1/tp of the P2P tensor, the receiver all-gathers it over TP; ignored under SP or at tp 1
    p2p_scatter_gather: bool = False
    dp: int | Literal["auto"] = "auto"
    gpus: int | None = Field(default=None, gt=0)  # default: every GPU of the topology
    micro_batch: int = Field(default=1, gt=0)
    global_batch: int = Field(gt=0)
    recompute: Literal["none", "selective", "full"] = "none"
    # selective: the modules recomputed in backward (Megatron --recompute-modules; unset: ["core_attn"], its
    # default); sim/schedule/shapes.RECOMPUTE_MODULES says what each drops and re-runs
    recompute_modules: list[RecomputeModule] | None = None
    tp_comm_overlap: bool = False
    dp_overlap: bool = True
    # distributed optimizer: the updated parameters' all-gather overlaps the next step's forward (Megatron
    # --overlap-param-gather); None = dp_overlap. False: it trails the optimizer step, exposed.
    overlap_param_gather: bool | None = None
    distributed_optimizer: bool = False
    # Megatron-FSDP, ZeRO-3 (--use-megatron-fsdp, --data-parallel-sharding-strategy optim_grads_params): weights
    # and gradients sharded over dp too; each layer's weights all-gathered before its forward and its backward,
    # its gradients reduce-scattered after its backward, every micro-batch (sim/schedule/fsdp_ops.py)
    fsdp: bool = False
    # distributed-optimizer instances (--num-distributed-optimizer-instances): the data-parallel group is cut
    # into this many contiguous instances; gradients are reduce-scattered inside an instance and their shards
    # all-reduced across instances, the optimizer state is sharded inside one (sim/schedule/dp_ops.py)
    dist_opt_instances: int = Field(default=1, gt=0)
    # gradient bucket size (MiB of fp32 gradients) for the DP reduction; None: Megatron-Core's max(40M, 1M x dp)
    # parameters (sim/schedule/dp_ops.bucket_bytes)
    dp_bucket_mib: BucketMiB | None = None
    ep: int = Field(default=1, gt=0)  # expert parallel: --expert-model-parallel-size
    etp: int = Field(default=1, gt=0)  # expert tensor parallel: --expert-tensor-parallel-size
    moe_dispatcher: Literal["alltoall", "allgather", "flex"] = "alltoall"  # --moe-token-dispatcher-type
    moe_flex_backend: Literal["deepep", "hybridep"] = "deepep"  # --moe-flex-dispatcher-backend
    moe_flex_sms: int | None = Field(default=None, gt=0)  # --moe-flex-dispatcher-num-sms; default per backend
    moe_ep_overlap: bool = False  # --overlap-moe-expert-parallel-comm
    delay_wgrad_compute: bool = False  # --delay-wgrad-compute (with moe_ep_overlap)
    # context parallel (Megatron --context-parallel-size): the sequence split over cp ranks (tp-cp-dp-pp order)
    cp: int = Field(default=1, gt=0)
    cp_comm: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = "p2p"  # --cp-comm-type
    # --hierarchical-context-parallel-sizes for a2a+p2p: [a2a size (inner), p2p ring size (outer)]
    hierarchical_cp: list[Annotated[int, Field(gt=0)]] | None = Field(default=None, min_length=2, max_length=2)

    @property
    def param_gather_overlapped(self) -> bool:
        """Whether the distributed optimizer's parameter all-gather overlaps the next forward."""
        return self.dp_overlap if self.overlap_param_gather is None else self.overlap_param_gather


class SweepConfig(Frozen):
    """Sweep axes (meshsim sweep); command-line flags override these."""

    tp: list[int] | None = None
    pp: list[int] | None = None
    vp: list[int] | None = None
    sp: list[bool] | None = None
    micro_batch: list[int] | None = None
    tp_comm_overlap: list[bool] | None = None
    recompute: list[Literal["none", "selective", "full"]] | None = None
    ep: list[int] | None = None
    etp: list[int] | None = None
    fp8: list[Literal["off", "delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]] | None = None
    cp: list[int] | None = None
    fsdp: list[bool] | None = None
    dist_opt_instances: list[Annotated[int, Field(gt=0)]] | None = None


class RunConfig(Frozen):
    """Run settings that change speed but not the math (sim/schedule/run_settings.py documents each effect)."""

    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None  # default: fp32 for bf16, fp16 for fp16
    deterministic: bool = False  # Megatron --deterministic-mode: deterministic attention backward
    grad_accumulation_fusion: bool = True  # wgrad GEMM accumulates into the fp32 main grad (no extra add)
    cuda_device_max_connections: int = Field(default=8, gt=0)  # CUDA_DEVICE_MAX_CONNECTIONS
    cuda_graphs: bool = False  # the step is captured as CUDA graphs: no per-op host dispatch
    # the input-gradient TP collective overlaps the weight-gradient GEMM (Megatron since 2021); False: 2020 code
    tp_grad_reduce_overlap: bool = True
    engine: EngineName = DEFAULT_ENGINE  # the event loop (sim/engine/simpy_loop.py); identical figures
    # FP8 training through Transformer Engine (sim/schedule/fp8_rules.py documents each rule and its source):
    # Megatron --fp8-recipe; off = 16-bit GEMMs
    # nvfp4 = Megatron --fp4-format e2m1 --fp4-recipe nvfp4 (TE NVFP4BlockScaling; FP4 and FP8 exclude each other)
    fp8: Literal["off", "delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"] = "off"
    fp8_format: Literal["hybrid", "e4m3"] = "hybrid"  # --fp8-format: hybrid = E4M3 forward, E5M2 gradients
    fp8_param_gather: bool = False  # --fp8-param-gather: FP8 primary weights, 1-byte DP parameter all-gather
    fp8_attention: bool = False  # --fp8-dot-product-attention: the attention core in FP8 too
    fp8_output_proj: bool = False  # --fp8-output-proj: the LM head (output layer) in MXFP8 too (mxfp8 only)
    fp8_wgrad: bool = True  # --no-fp8-wgrad sets False: weight-gradient GEMMs in 16 bit
    # --first-last-layers-bf16 with --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16: those decoder
    # layers run their linears in 16 bit (Megatron fp8_utils.is_first_last_bf16_layer; fp4_utils alike)
    fp8_first_last_layers_bf16: bool = False
    fp8_layers_at_start_in_bf16: int = Field(default=1, ge=0)
    fp8_layers_at_end_in_bf16: int = Field(default=1, ge=0)

    def bf16_layer(self, layer: int, layers: int) -> bool:
        """Decoder layer `layer` of `layers` runs 16-bit under an FP8 / NVFP4 recipe (first / last N kept in bf16)."""
        if not (self.fp8_on and self.fp8_first_last_layers_bf16) or not 0 <= layer < layers:
            return False
        return layer < self.fp8_layers_at_start_in_bf16 or layer >= layers - self.fp8_layers_at_end_in_bf16
    fp8_amax_history_len: int = Field(default=1, gt=0, le=65536)  # --fp8-amax-history-len (delayed)
    fp8_amax_compute_algo: Literal["most_recent", "max"] = "most_recent"  # --fp8-amax-compute-algo (delayed)
    fp8_margin: int = Field(default=0, ge=0, le=64)  # --fp8-margin: scale = fp8_max / amax / 2^margin
    tp_only_amax_reduction: bool = False  # --tp-only-amax-red: delayed scaling reduces amaxes over TP only

    @property
    def fp8_on(self) -> bool:
        return self.fp8 != "off"


class OptimizerConfig(Frozen):
    """Adam's state precision and placement (Megatron-Core OptimizerConfig, megatron/core/optimizer/
    optimizer_config.py @d98e8a64); memory and step cost in sim/cost/optimizer_states.py; Muon in
    sim/schedule/muon.py."""

    name: Literal["adam", "muon"] = "adam"  # --optimizer (muon: Adam for embeddings, norms and biases)
    muon_ns_steps: int = Field(default=5, ge=1, le=20)  # --muon-num-ns-steps
    precision_aware: bool = False  # --use-precision-aware-optimizer (TE FusedAdam)
    main_grads_dtype: Literal["fp32", "bf16"] = "fp32"  # --main-grads-dtype
    main_params_dtype: Literal["fp32", "fp16"] = "fp32"  # --main-params-dtype
    exp_avg_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp32"  # --exp-avg-dtype
    exp_avg_sq_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp32"  # --exp-avg-sq-dtype
    store_param_remainders: bool = True  # OptimizerConfig.store_param_remainders (TE >= 2.1)
    cpu_offload: bool = False  # --optimizer-cpu-offload
    offload_fraction: float = Field(default=1.0, ge=0, le=1)  # --optimizer-offload-fraction
    overlap_cpu_d2h_h2d: bool = False  # --overlap-cpu-optimizer-d2h-h2d
    # achieved per-GPU figures of the offloaded step; unset: sim/cost/optimizer_states.py's defaults
    pcie_gbps: GBps | None = None  # GPU <-> pinned host copies, each direction
    host_mem_gbps: GBps | None = None  # host DRAM bandwidth one rank's CPU Adam gets


class Scenario(Frozen):
    name: str
    description: str = ""
    model: ModelConfig
    hardware: HardwareConfig = defaults_of(HardwareConfig)
    topology: TopologyConfig
    parallel: ParallelConfig
    run: RunConfig = defaults_of(RunConfig)
    optimizer: OptimizerConfig = defaults_of(OptimizerConfig)
    sweep: SweepConfig | None = None
