"""The scenario schema: a frozen, validated description of model, hardware, topology and parallelism.

Field-by-field documentation (units, defaults) lives in docs/scenarios.md; keep the two in step.
Cross-field checks (tp divides heads, ...) live in scenarios/checks.py; loading in scenarios/load.py.
"""

from typing import Annotated, Literal

from pydantic import Field

from meshsim.scenarios.model_schema import (
    GATED_MLP_NAMES,
    Frozen,
    MlaConfig,
    ModelConfig,
    MoeConfig,
    defaults_of,
)
from meshsim.sim.core.engines import DEFAULT_ENGINE, EngineName
from meshsim.sim.core.quantities import (
    BucketMiB,
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

# the model section's names, defined in model_schema.py, are imported from here by the rest of meshsim
__all__ = [
    "GATED_MLP_NAMES",
    "ComputeTuning",
    "FabricConfig",
    "Frozen",
    "HardwareConfig",
    "MlaConfig",
    "ModelConfig",
    "MoeConfig",
    "NetworkTuning",
    "OptimizerConfig",
    "ParallelConfig",
    "RunConfig",
    "Scenario",
    "SweepConfig",
    "TopologyConfig",
    "defaults_of",
]


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
