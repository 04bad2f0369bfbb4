"""Compute cost model: how long a compute op (Gemm, Attention, Elementwise, OptimizerStep) takes on one GPU.

    GEMM         max(flops / (peak x eff(m, n, k)), bytes / (bw x bw_eff)) + launch
                 eff from sim/cost/gemm_efficiency.py; bytes = (2 (mk + kn) + out_bytes mn) batch (16-bit
                 operands; out_bytes 2, or 8 for a wgrad accumulating into the fp32 main grad).
    Attention    flops / (peak x attention_eff x width_factor x wave) + launch   (flash; flops in the
                 work: causal halving and the 2.5x backward are already there). width_factor: the
                 head width's MMA-to-softmax balance, 1 at head_dim 128 (sim/cost/attention_rate.py).
                 wave = CTA wave quantization with one CTA per (batch, head, 128-query block).
                 With attention dropout x dropout_factor (Philox per score); where TE runs FlashAttention 2
                 on sm_90+ (a deterministic run with dropout on Blackwell) at sm_80's MMA width
                 (attention_rate.legacy_mma_fraction, ComputeModel.fa2_rate_flops).
    Elementwise  (bytes_read + bytes_written) / (bw x elementwise_eff) + launch
    OptimizerStep  params x bytes_per_param / (bw x bw_eff) + launch, plus the host-updated share under
                 optimizer.cpu_offload (offload_step_s)

Defaults and sources (each overridable by scenario hardware.compute, else by a profile's compute section):
- gemm_efficiency: by GPU generation at the tensor cores' clock (sim/cost/gemm_ceiling.py GEMM_CEILING_BY_GPU):
  sustained, a training step's (the default; A100 0.78 and H100 0.68 fitted on training steps, B200 0.60 on the
  405B GB200 BF16 row, H200 0.70 from its measured 0.80 at H100's sustained clock), or burst, a lone kernel's
  (`clock="burst"`: A100 0.85 and H100 0.78 from FLUX's GEMM times, H200 0.80), which also divides the FP8 and
  attention rates (fitted on training steps) by the GPU's sustained_clock.
- mem_bw_efficiency 0.90: device-to-device copy at ~4.3 of 4.8 TB/s on the same H200 (GEMM operand traffic,
  the optimizer's streaming update).
- elementwise_efficiency ELEMENTWISE_EFFICIENCY: the fraction of HBM bandwidth of Elementwise kernels.
- attention_efficiency: by GPU generation (sim/cost/attention_rate.py: H100 / H200 0.43 and B200 / GB200
  0.55, fitted on the NeMo long-sequence tables); 0.50 for the others, derived: per score element flash
  attention does 4 x head_dim tensor-core FLOPs (QK^T and PV; 512 at head_dim 128) and one exp plus ~5
  FP32 ops on the SM's scalar units (exp on the SFU at 16/clk/SM, CUDA programming guide throughput table).
  On an H100 the 512 MMA FLOPs take ~0.65 ps at the 0.80 GEMM ceiling and the softmax work ~0.33 ps; not
  overlapped (FlashAttention-2) that is 512 / 0.98 ps ~ 0.53 of peak. Rounded to 0.50; used for the
  backward too (more GEMMs per exp, but atomic dQ accumulation).
- a deterministic attention backward (run.deterministic): where TE keeps cuDNN (sm_90; sm_100+ without
  dropout), cuDNN's dP-workspace path, dS through HBM and dQ as its own matmul (sim/cost/cudnn_deterministic.py);
  where it runs FlashAttention 2 instead (below sm_90; sm_100+ with dropout), FA2's deterministic grid
  (sim/cost/fa2_deterministic.py). deterministic_attention_slowdown 1.25 (an assumption,
  sim/schedule/run_settings.py) is left to the FP8 backward, a cuDNN node of its own.
- fill_uninitialized (run.deterministic): every fresh output is first filled by PyTorch's deterministic
  mode, + fill_bytes / (bw x mem_bw_eff) + launch per op (sim/cost/deterministic_fill.py).
- host_dispatch_us: CPU time to issue one op (sim/cost/host_dispatch.py; used by the engine, not here).
- launch_overhead_us 3.0: a dependent kernel's launch and ramp gap on the GPU when the host runs ahead
  (assumption, a few microseconds; `meshsim calibrate` measures it).
- tiles: best of 128x256, 256x128, 128x128 per shape unless tile_m / tile_n are set (sim/cost/gemm_efficiency.py).

FP8 GEMMs (Gemm.fp8, run.fp8) and FP8 attention (Attention.fp8): the same formulas at the GPU's FP8 peak
(its FP4 peak, with 0.5-byte operands and their scales, for run.fp8: nvfp4), with 1-byte A and B, the FP8 large-GEMM ceiling (sim/cost/fp8_gemm.py) and k_fill from the FP8 peak (the
ridge point doubles, so skinny-k FP8 GEMMs reach less of their peak than 16-bit ones). A profile's
gemm_table is 16-bit: FP8 GEMMs use the model.

A profile also supplies: gemm_table (nearest measured shape by log-distance in m, n, k, batch: its
TFLOP/s is used for this GEMM's FLOPs), elementwise_bw_gbps (replaces bw x eff for memory-bound
kernels), kernel_table (measured kernels by name, scaled by bytes, or by FLOPs for attention). Profile
GPU figures (peak, bandwidth) are already applied to `gpu` by scenarios/load.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from meshsim.scenarios.profile import GemmPoint, HardwareProfile, KernelPoint
from meshsim.scenarios.schema import ComputeTuning
from meshsim.sim.core.units import GB, US
from meshsim.sim.cost.attention_rate import (
    DEFAULT_ATTENTION_EFFICIENCY,
    attention_efficiency,
    dropout_factor,
    fa2_fraction,
    width_factor,
)
from meshsim.sim.cost.cudnn_deterministic import deterministic_backward_s
from meshsim.sim.cost.deterministic_fill import fill_bytes
from meshsim.sim.cost.fa2_deterministic import extra_dq_bytes, split_ratio, uses_fa2
from meshsim.sim.cost.fp8_gemm import (
    BLOCK_SCALED_RECIPES,
    block_scaled_rate,
    fp8_gemm_ceiling,
    fp8_peak_tflops,
    lowp_operand_bytes,
    lowp_peak_tflops,
    lowp_value_bytes,
)
from meshsim.sim.cost.gemm_ceiling import SUSTAINED, Clock, clock_factor, gemm_ceiling
from meshsim.sim.cost.gemm_efficiency import (
    DEFAULT_CEILING,
    DEFAULT_TILES,
    cublas_workspace_bytes,
    gemm_efficiency,
    k_tile,
)
from meshsim.sim.cost.gemm_efficiency import wave_efficiency as _wave
from meshsim.sim.cost.host_dispatch import HOST_DISPATCH_US
from meshsim.sim.cost.reference_rate import rate_scale
from meshsim.sim.schedule.ops import Attention, Collective, Elementwise, Gemm, OptimizerStep, Work
from meshsim.sim.schedule.optimizer_states import HOST_ADAM_TRAFFIC_BYTES, OFFLOAD_COPY_BYTES
from meshsim.sim.schedule.run_settings import DETERMINISTIC_ATTENTION_SLOWDOWN
from meshsim.topologies.gpus import GpuSpec

# Megatron's elementwise kernels (LayerNorm: two row reductions; dropout: Philox random numbers and a mask
# write; GELU: tanh/erf; fused softmax: max and sum passes; residual and bias-gradient kernels) reach less
# of HBM than a plain copy (0.90 on an H200, reference/modeling-facts.md, the upper bound). No kernel-level
# public figure in our set: fitted on the calibration set's three compute-only cases (one GPU or node, no
# communication on the critical path: 2020 A100 1.16B tp1, 2020 V100 1.16B tp1, NeMo 5B on 1 node), which
# would each be exact at 0.64, 0.85 and below 0.5; 0.65 is one value for every GPU (docs/cost-models.md section 10).
ELEMENTWISE_EFFICIENCY = 0.65
# tile_m / tile_n unset: best of DEFAULT_TILES per shape (sim/cost/gemm_efficiency.py); set: that tile only
DEFAULTS = ComputeTuning(gemm_efficiency=DEFAULT_CEILING, mem_bw_efficiency=0.90,
                         attention_efficiency=DEFAULT_ATTENTION_EFFICIENCY,
                         elementwise_efficiency=ELEMENTWISE_EFFICIENCY,
                         launch_overhead_us=3.0, host_dispatch_us=HOST_DISPATCH_US,
                         deterministic_attention_slowdown=DETERMINISTIC_ATTENTION_SLOWDOWN)
FLASH_BLOCK_Q = 128  # query rows per flash-attention CTA
TFLOPS = 1e12


def resolve_tuning(tuning: ComputeTuning | None, profile: HardwareProfile | None) -> ComputeTuning:
    """Each knob: the scenario's value, else the profile's, else DEFAULTS."""
    layers = [tuning, profile.compute if profile else None]
    values = {}
    for name in ComputeTuning.model_fields:
        found = (getattr(t, name) for t in layers if t is not None and getattr(t, name) is not None)
        values[name] = next(found, getattr(DEFAULTS, name))
    return ComputeTuning(**values)


def nearest_gemm(table: list[GemmPoint], g: Gemm) -> GemmPoint | None:
    """The measured shape nearest to g in log(m), log(n), log(k), log(batch)."""
    def dist(p: GemmPoint) -> float:
        return sum(math.log(a / b) ** 2 for a, b in ((p.m, g.m), (p.n, g.n), (p.k, g.k), (p.batch, g.batch)))
    return min(table, key=dist, default=None)


def nearest_kernel(table: list[KernelPoint], kernel: str, size: float, by: str) -> KernelPoint | None:
    """Measured points of `kernel`, nearest in log(bytes) or log(flops) (`by`)."""
    points = [p for p in table if p.kernel == kernel]

    def dist(p: KernelPoint) -> float:
        ref = getattr(p, by)
        return abs(math.log(ref / size)) if ref > 0 and size > 0 else math.inf
    return min(points, key=dist, default=None)


def _scaled_us(p: KernelPoint, size: float, by: str) -> float:
    ref = getattr(p, by)
    return p.time_us * size / ref if ref > 0 and size > 0 else p.time_us


@dataclass
class ComputeModel:
    """time_s(work) for compute works on `gpu`; pure and memoized per work."""

    gpu: GpuSpec
    tuning: ComputeTuning | None = None
    profile: HardwareProfile | None = None
    fill_uninitialized: bool = False  # run.deterministic: PyTorch fills fresh outputs (deterministic_fill.py)
    fp8_recipe: str = "off"  # run.fp8: block-scaled recipes reach less of the FP8 ceiling (fp8_gemm.py)
    # the software release's multiplier on the per-tensor FP8 ceiling (scenarios/releases.py); block-scaled
    # recipes keep the generation's (their rate was fitted on rows the release rate does not describe)
    fp8_gemm_rate: float = 1.0
    # the tensor cores' clock: a training step's sustained one (every scenario), or a lone kernel's burst
    # (benchmarks/accuracy's kernel and MoE-layer rows; sim/cost/gemm_ceiling.py)
    clock: Clock = SUSTAINED
    knobs: ComputeTuning = field(init=False)
    _memo: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.knobs = resolve_tuning(self.tuning, self.profile)
        clock = clock_factor(self.gpu.name, self.clock)  # 1 at the sustained clock the tables hold
        by_generation = {"gemm_efficiency": gemm_ceiling(self.gpu.name, self.clock),
                         "fp8_gemm_efficiency": fp8_gemm_ceiling(self.gpu.name) * clock
                         * block_scaled_rate(self.fp8_recipe, self.gpu.name)
                         * (1.0 if self.fp8_recipe in BLOCK_SCALED_RECIPES else self.fp8_gemm_rate),
                         "attention_efficiency": attention_efficiency(self.gpu.name) * clock}
        unstated = {knob: value * rate_scale(self.gpu, knob) for knob, value in by_generation.items()
                    if not self._stated(knob)}
        if unstated:  # no scenario or profile figure: the GPU generation's value (at its reference's rate)
            self.knobs = self.knobs.model_copy(update=unstated)

    def _stated(self, knob: str) -> bool:
        """Whether the scenario's hardware.compute or the profile's compute section sets `knob`."""
        layers = (self.tuning, self.profile.compute if self.profile else None)
        return any(t is not None and getattr(t, knob) is not None for t in layers)

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_tflops * TFLOPS

    @property
    def mem_bw_bytes_s(self) -> float:
        """Achievable bytes/s of streaming traffic (a GEMM's operands): bw x mem_bw_eff."""
        return self.gpu.mem_bw_gbps * GB * self.knobs.mem_bw_efficiency

    @property
    def optimizer_bw_bytes_s(self) -> float:
        """The optimizer's streaming update: the profile's measured memory-bound bandwidth, else mem_bw."""
        if self.profile is not None and self.profile.elementwise_bw_gbps:
            return self.profile.elementwise_bw_gbps * GB
        return self.mem_bw_bytes_s

    @property
    def elementwise_bw_bytes_s(self) -> float:
        """Achievable bytes/s of elementwise kernels: the profile's measured figure, else bw x elementwise_eff."""
        if self.profile is not None and self.profile.elementwise_bw_gbps:
            return self.profile.elementwise_bw_gbps * GB
        return self.gpu.mem_bw_gbps * GB * self.knobs.elementwise_efficiency

    @property
    def launch_s(self) -> float:
        return self.knobs.launch_overhead_us * US

    def time_s(self, work: Work) -> float:
        hit = self._memo.get(work)
        if hit is None:
            hit = self._memo[work] = self._time_s(work) + (self.fill_s(work) if self.fill_uninitialized else 0.0)
        return hit

    def fill_s(self, work: Work) -> float:
        """Deterministic mode's NaN fill of `work`'s fresh outputs: fill_bytes / (bw x mem_bw_eff) + launch,
        0 when it allocates nothing (sim/cost/deterministic_fill.py)."""
        nbytes = fill_bytes(work)
        return nbytes / self.mem_bw_bytes_s + self.launch_s if nbytes > 0 else 0.0

    def _time_s(self, work: Work) -> float:
        if isinstance(work, Gemm):
            return self.gemm_s(work)
        if isinstance(work, Attention):
            return self.attention_s(work)
        if isinstance(work, Elementwise):
            return self.elementwise_s(work)
        if isinstance(work, OptimizerStep):
            gpu = work.params * work.bytes_per_param / self.optimizer_bw_bytes_s + self.launch_s
            return gpu + (offload_step_s(work) if work.host_params else 0.0)
        if isinstance(work, Collective):
            raise TypeError("collectives are costed by sim/collectives, not the compute model")
        raise TypeError(f"unknown work {work!r}")

    def gemm_efficiency(self, g: Gemm) -> float:
        """Fraction of the GEMM's peak (the FP8 peak for an FP8 GEMM: sim/cost/fp8_gemm.py); a GEMM beside a
        userbuffers kernel (g.comm_sms) runs on the other SMs: their share of the peak, their waves."""
        k = self.knobs
        tiles = DEFAULT_TILES
        if k.tile_m or k.tile_n:
            tiles = ((k.tile_m or DEFAULT_TILES[0][0], k.tile_n or DEFAULT_TILES[0][1]),)
        knob = "fp8_gemm_efficiency" if g.fp8 else "gemm_efficiency"
        peak_tflops = lowp_peak_tflops(self.gpu, self.fp8_recipe) if g.fp8 else self.gpu.peak_tflops
        sustained_tflops = peak_tflops * rate_scale(self.gpu, knob)
        return gemm_efficiency(g.m, g.n, g.k, g.batch, ceiling=getattr(k, knob), tiles=tiles,
                               sm_count=self.gpu.sm_count, k_fill=sustained_tflops * 1e3 / self.gpu.mem_bw_gbps,
                               out_bytes=g.out_bytes, free_sms=self.gpu.sm_count - g.comm_sms,
                               workspace_bytes=cublas_workspace_bytes(self.gpu.compute_capability),
                               tile_k=k_tile(lowp_value_bytes(self.fp8_recipe) if g.fp8 else 2.0))

    def gemm_s(self, g: Gemm) -> float:
        if g.flops == 0:
            return 0.0
        if self.profile is not None and self.profile.gemm_table and not g.fp8:  # the table is 16-bit
            point = nearest_gemm(self.profile.gemm_table, g)
            return g.flops / (point.tflops * TFLOPS)
        operand = lowp_operand_bytes(self.fp8_recipe) if g.fp8 else 2.0
        nbytes = (operand * (g.m * g.k + g.k * g.n) + g.out_bytes * g.m * g.n) * g.batch
        peak = lowp_peak_tflops(self.gpu, self.fp8_recipe) * TFLOPS if g.fp8 else self.peak_flops
        compute = g.flops / (peak * self.gemm_efficiency(g))
        memory = nbytes / self.mem_bw_bytes_s
        return max(compute, memory) + self.launch_s

    def attention_s(self, a: Attention) -> float:
        kernel = "flash_attention_bwd" if a.backward else "flash_attention_fwd"
        if self.profile is not None:
            point = nearest_kernel(self.profile.kernel_table, kernel, a.flops, "flops")
            if point is not None:
                return _scaled_us(point, a.flops, "flops") * US
        peak = fp8_peak_tflops(self.gpu) * TFLOPS if a.fp8 else self.peak_flops
        width = 2.0 * (a.head_dim + (a.v_head_dim or a.head_dim))  # tensor FLOPs per score (attention_rate.py)
        rate = peak * self.knobs.attention_efficiency * width_factor(self.gpu, width, a.fp8)
        if self.runs_fa2(a):
            rate = self.fa2_rate_flops(a)
        elif a.dropout:
            rate *= dropout_factor(self.gpu, width, a.fp8)
        if a.backward and a.deterministic and uses_fa2(self.gpu, a.dropout):
            return self._fa2_deterministic_s(a, rate)
        ctas = a.batch * a.heads * math.ceil(a.seq / FLASH_BLOCK_Q)
        kernel_s = a.flops / (rate * _wave(ctas, self.gpu.sm_count)) + self.launch_s
        if a.backward and a.deterministic and not a.fp8:  # cuDNN's dP-workspace path (cudnn_deterministic.py)
            return deterministic_backward_s(kernel_s, a.batch, a.heads, a.kv_heads, a.seq, a.keys, a.head_dim,
                                            bw_bytes_s=self.mem_bw_bytes_s, fill=self.fill_uninitialized,
                                            gemm_flops_s=self.peak_flops * self.knobs.gemm_efficiency,
                                            launch_s=self.launch_s)
        slowdown = self.knobs.deterministic_attention_slowdown if a.backward and a.deterministic else 1.0
        return (kernel_s - self.launch_s) * slowdown + self.launch_s

    def runs_fa2(self, a: Attention) -> bool:
        """Whether TE runs this attention call as FlashAttention 2: a deterministic backward, or any call of a
        deterministic run (fill_uninitialized is run.deterministic; TE picks one backend for the forward
        and the backward), where TE's deterministic filter leaves FA2 (fa2_deterministic.uses_fa2); 16-bit."""
        deterministic = a.deterministic or self.fill_uninitialized
        return deterministic and not a.fp8 and uses_fa2(self.gpu, a.dropout)

    def fa2_rate_flops(self, a: Attention) -> float:
        """FlashAttention 2's FLOP/s: peak x attention_rate.fa2_fraction (its native rate up to sm_80, sm_80's
        MMA width above, at the part's reference rate)."""
        width = 2.0 * (a.head_dim + (a.v_head_dim or a.head_dim))
        scale = rate_scale(self.gpu, "attention_efficiency")
        return self.peak_flops * fa2_fraction(self.gpu, width, a.dropout, self.knobs.attention_efficiency, scale)

    def _fa2_deterministic_s(self, a: Attention, rate: float) -> float:
        """FlashAttention 2's deterministic backward (sim/cost/fa2_deterministic.py): the work at `rate`
        stretched by its grid's load balance, plus the extra fp32 dQ slices' traffic and their fill kernels'
        launches (the NaN fill and the zeros)."""
        sms = self.gpu.sm_count
        ratio = split_ratio(sms, a.batch, a.heads, a.seq, a.keys, a.head_dim, a.causal, a.window)
        extra = extra_dq_bytes(sms, a.batch, a.heads, a.seq, a.head_dim) / self.elementwise_bw_bytes_s
        return a.flops * ratio / rate + extra + 3 * self.launch_s

    def elementwise_s(self, e: Elementwise) -> float:
        nbytes = e.bytes_read + e.bytes_written
        if self.profile is not None:
            point = nearest_kernel(self.profile.kernel_table, e.kernel, nbytes, "bytes")
            if point is not None:
                return _scaled_us(point, nbytes, "bytes") * US
        return nbytes / self.elementwise_bw_bytes_s + self.launch_s


def offload_step_s(w: OptimizerStep) -> float:
    """Seconds of the host-updated share (sim/schedule/optimizer_states.py): gradients D2H and parameters
    H2D as fp32 over PCIe, the CPU Adam's 28 B per parameter of host DRAM traffic; serial, or pipelined
    over tensors with --overlap-cpu-optimizer-d2h-h2d (the largest of the three)."""
    d2h = h2d = w.host_params * OFFLOAD_COPY_BYTES / w.pcie_bytes_s
    cpu = w.host_params * HOST_ADAM_TRAFFIC_BYTES / w.host_bytes_s
    return max(d2h, cpu, h2d) if w.host_overlap else d2h + cpu + h2d
