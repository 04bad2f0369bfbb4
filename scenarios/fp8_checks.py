"""FP8 scenario checks (run.fp8 and its knobs): one small rule each, one line naming the field and the fix.

`check_fp8(scenario, gpu, source)` runs after the GPU is resolved (scenarios/load.resolve), because what
an FP8 recipe needs is a property of the GPU generation. Sources (commits of the snapshots read):
- FP8 tensor cores: Transformer Engine transformer_engine/pytorch/quantization.py `_compute_fp8_support`
  (TransformerEngine d0067d0d): compute capability >= 8.9 (Ada, Hopper and later); V100 (7.0) and A100
  (8.0) have none.
- `_compute_fp8_block_scaling_support` (same file): blockwise needs compute capability >= 9.0 (Hopper or
  later, CUDA >= 12.9); `_compute_mxfp8_support`: MXFP8 needs compute capability 10.x (Blackwell data
  centre parts; 12.0+ refused there).
- `_compute_nvfp4_support` (same file, L171-175): NVFP4 needs compute capability 10.0 or later (Blackwell);
  meshsim also needs the part's FP4 peak (topologies/gpus.py). TE's NVFP4 recipe defaults to 16-bit
  attention (recipe/__init__.py L571-572, fp8_dpa = False) but runs FP8 attention beside NVFP4 GEMMs when
  fp8_dpa is set: attention/dot_product_attention/dot_product_attention.py L189-224 (NVFP4 linears with
  FP8DS or FP8CS attention, NVTE_DPA_FP8_RECIPE), so run.fp8_attention is allowed with nvfp4 and priced as
  FP8 attention. Megatron's FP4 primary weights (--fp4-param-gather, arguments.py L1104) are not modeled,
  so run.fp8_param_gather is refused with nvfp4.
- Float8BlockScaling refuses FP8 attention (recipe/__init__.py L461-463, "FP8 attention is not supported
  for Float8BlockScaling."): run.fp8_attention is refused with blockwise.
- Delayed scaling with MoE and MLA runs (NeMo 25.04 trained Mixtral and Grok-1 with it): TE's GroupedLinear
  keeps per-GEMM quantizers and takes its per-GEMM path under DelayedScaling (module/grouped_linear.py
  L107-108, L132-152: only the grouped-tensor path is unsupported); Megatron drops save_original_input
  under delayed (transformer/attention.py L434, moe/shared_experts.py L149), which TE would refuse
  (grouped_linear.py L678-679). Priced with one amax set per expert GEMM (sim/schedule/fp8_rules.py
  delayed_fp8_gemms). Refused, as not modeled: delayed with parallel.moe_ep_overlap (combined 1F1B), and
  FP8 parameter gathers of MoE / MLA models.
- Megatron-LM megatron/training/arguments.py L1095-1097 (Megatron-LM d98e8a64): --fp8-param-gather only
  with the distributed optimizer (or FSDP, which runs the distributed optimizer too).
- FP8 dot-product attention is a fused-attention backend (TE DotProductAttention with fp8_dpa): it needs
  model.attention: flash (meshsim's name for the fused kernels).
"""

from __future__ import annotations

from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError
from meshsim.topologies.gpus import GpuSpec

FP8_MIN_CC = (8, 9)
BLOCKWISE_MIN_CC = (9, 0)
MXFP8_CC_MAJOR = 10
NVFP4_MIN_CC = (10, 0)


def _err(source: str, field: str, value: object, problem: str, fix: str) -> UserError:
    return UserError(field, value, fix, source=source, problem=problem)


def _needs_fp8(s: Scenario, source: str) -> None:
    """Knobs that only mean something with run.fp8 on."""
    r = s.run
    for field, value, default in (("fp8_param_gather", r.fp8_param_gather, False),
                                  ("fp8_attention", r.fp8_attention, False),
                                  ("fp8_first_last_layers_bf16", r.fp8_first_last_layers_bf16, False)):
        if value != default and not r.fp8_on:
            raise _err(source, f"run.{field}", value, "It applies to FP8 training, and run.fp8 is off",
                       "set run.fp8 (delayed, tensorwise, blockwise, mxfp8 or nvfp4), or remove the field")


def _bf16_layer_counts(s: Scenario, source: str) -> None:
    """Megatron reads --num-layers-at-start/end-in-bf16 only with --first-last-layers-bf16."""
    r = s.run
    for field, value in (("fp8_layers_at_start_in_bf16", r.fp8_layers_at_start_in_bf16),
                         ("fp8_layers_at_end_in_bf16", r.fp8_layers_at_end_in_bf16)):
        if value != 1 and not r.fp8_first_last_layers_bf16:
            raise _err(source, f"run.{field}", value, "It counts the layers kept in 16 bit, and "
                       "run.fp8_first_last_layers_bf16 is off", "set run.fp8_first_last_layers_bf16: true, or "
                       "remove the field")


def _delayed_only(s: Scenario, source: str) -> None:
    r = s.run
    for field, value, default in (("fp8_amax_history_len", r.fp8_amax_history_len, 1),
                                  ("fp8_amax_compute_algo", r.fp8_amax_compute_algo, "most_recent"),
                                  ("tp_only_amax_reduction", r.tp_only_amax_reduction, False)):
        if value != default and r.fp8 != "delayed":
            raise _err(source, f"run.{field}", value, f"It sets delayed scaling's amax history, and run.fp8 is "
                       f"{r.fp8}", "set run.fp8: delayed, or remove the field")


def _layers_and_modes(s: Scenario, source: str) -> None:
    r, p = s.run, s.parallel
    if (s.model.moe is not None or s.model.mla is not None) and r.fp8_param_gather:
        kind = "MoE" if s.model.moe is not None else "multi-head latent attention"
        raise _err(source, "run.fp8_param_gather", True, f"FP8 parameter gathers of {kind} models (grouped "
                   "expert weights, MLA's projections) are not modeled; their FP8 GEMMs are",
                   "drop run.fp8_param_gather (the gathers stay 16-bit)")
    if r.fp8 == "delayed" and s.model.moe is not None and s.parallel.moe_ep_overlap:
        raise _err(source, "run.fp8", r.fp8, "Delayed scaling's per-pass amax reduction is not modeled inside "
                   "the combined 1F1B schedule of parallel.moe_ep_overlap (Megatron runs it: "
                   "pipeline_parallel/combined_1f1b.py L444-449 wraps the pass in one FP8 context)",
                   "use run.fp8: tensorwise, blockwise or mxfp8 with parallel.moe_ep_overlap, or drop the overlap")
    if r.fp8 == "blockwise" and r.fp8_attention:
        raise _err(source, "run.fp8_attention", True, "Transformer Engine refuses FP8 attention under "
                   "Float8BlockScaling (common/recipe/__init__.py L461-463: \"FP8 attention is not supported for "
                   "Float8BlockScaling.\")", "drop run.fp8_attention, or use run.fp8: tensorwise, delayed or mxfp8")
    if r.fp8_param_gather and not p.distributed_optimizer:
        raise _err(source, "run.fp8_param_gather", True, "Megatron keeps FP8 primary weights only with the "
                   "distributed optimizer", "set parallel.distributed_optimizer: true, or drop run.fp8_param_gather")
    if r.fp8_output_proj and (r.fp8 != "mxfp8" or s.model.tied_embeddings):
        raise _err(source, "run.fp8_output_proj", True, "Megatron runs the LM head in FP8 only under MXFP8 "
                   "(transformer_config.py L1569-1575) and only with its own weight (TELMHeadColumnParallelLinear "
                   "refuses skip_weight_param_allocation: no tied embeddings)",
                   "set run.fp8: mxfp8 and model.tied_embeddings: false, or drop run.fp8_output_proj")
    if r.fp8 == "nvfp4" and r.fp8_param_gather:
        raise _err(source, "run.fp8_param_gather", True, "meshsim does not model Megatron's FP4 primary weights "
                   "(--fp4-param-gather)", "drop run.fp8_param_gather, or use run.fp8: mxfp8")
    if r.fp8_attention and s.model.attention != "flash":
        raise _err(source, "run.fp8_attention", True, "FP8 attention is a fused-attention kernel, and "
                   "model.attention is unfused", "set model.attention: flash, or drop run.fp8_attention")


def _gpu_supports(s: Scenario, gpu: GpuSpec, source: str) -> None:
    r, cc = s.run, gpu.compute_capability
    if not r.fp8_on:
        return
    if cc < FP8_MIN_CC or gpu.fp8_peak_tflops <= 0:
        raise _err(source, "run.fp8", r.fp8, f"The {gpu.name} has no FP8 tensor cores (compute capability "
                   f"{cc[0]}.{cc[1]}; FP8 needs 8.9 or later: H100, H200, B200, GB200, B300, GB300)",
                   "set run.fp8: off, or use an FP8 GPU (hardware.gpu / topology.preset)")
    if r.fp8 == "blockwise" and cc < BLOCKWISE_MIN_CC:
        raise _err(source, "run.fp8", r.fp8, f"Blockwise FP8 GEMMs need compute capability 9.0 or later, the "
                   f"{gpu.name} has {cc[0]}.{cc[1]}", "use run.fp8: delayed or tensorwise")
    if r.fp8 == "mxfp8" and cc[0] != MXFP8_CC_MAJOR:
        raise _err(source, "run.fp8", r.fp8, f"MXFP8 needs a Blackwell GPU (compute capability 10.x), the "
                   f"{gpu.name} has {cc[0]}.{cc[1]}", "use run.fp8: tensorwise, delayed or blockwise, or a "
                   "B200 / GB200 / B300 / GB300")
    if r.fp8 == "nvfp4" and (cc < NVFP4_MIN_CC or gpu.fp4_peak_tflops <= 0):
        raise _err(source, "run.fp8", r.fp8, f"NVFP4 needs FP4 tensor cores (Blackwell, compute capability 10.0 "
                   f"or later), the {gpu.name} has {cc[0]}.{cc[1]}", "use run.fp8: mxfp8, tensorwise or blockwise, "
                   "or a B200 / GB200 / B300 / GB300 (or set hardware.fp4_peak_tflops)")


def check_fp8(s: Scenario, gpu: GpuSpec, source: str) -> None:
    """Every FP8 rule in order; the first violation is raised as a UserError."""
    _needs_fp8(s, source)
    _bf16_layer_counts(s, source)
    _delayed_only(s, source)
    _layers_and_modes(s, source)
    _gpu_supports(s, gpu, source)
