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
  meshsim also needs the part's FP4 peak (topologies/gpus.py). TE's NVFP4 recipe quantizes no attention
  (recipe/__init__.py NVFP4BlockScaling.fp8_dpa = False, "Not applying quantization to attention for now"),
  so run.fp8_attention is refused with it; Megatron's FP4 primary weights (--fp4-param-gather,
  arguments.py L1104) are not modeled, so run.fp8_param_gather is refused with it too.
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
    if (s.model.moe is not None or s.model.mla is not None) and (r.fp8 == "delayed" or r.fp8_param_gather):
        field, value = ("run.fp8", r.fp8) if r.fp8 == "delayed" else ("run.fp8_param_gather", True)
        kind = "MoE" if s.model.moe is not None else "multi-head latent attention"
        raise _err(source, field, value, f"For {kind} models FP8 is modeled with current / block scaling and "
                   "16-bit parameter gathers (delayed scaling's amax bookkeeping of grouped experts and of MLA's "
                   "five projections, and FP8 weight gathers, are not)",
                   "use run.fp8: tensorwise, blockwise or mxfp8, without run.fp8_param_gather")
    if r.fp8_param_gather and not p.distributed_optimizer:
        raise _err(source, "run.fp8_param_gather", True, "Megatron keeps FP8 primary weights only with the "
                   "distributed optimizer", "set parallel.distributed_optimizer: true, or drop run.fp8_param_gather")
    if r.fp8_output_proj and (r.fp8 != "mxfp8" or s.model.tied_embeddings):
        raise _err(source, "run.fp8_output_proj", True, "Megatron runs the LM head in FP8 only under MXFP8 "
                   "(transformer_config.py L1569-1575) and only with its own weight (TELMHeadColumnParallelLinear "
                   "refuses skip_weight_param_allocation: no tied embeddings)",
                   "set run.fp8: mxfp8 and model.tied_embeddings: false, or drop run.fp8_output_proj")
    for field, value in (("fp8_attention", r.fp8_attention), ("fp8_param_gather", r.fp8_param_gather)):
        if r.fp8 == "nvfp4" and value:
            raise _err(source, f"run.{field}", True, "Transformer Engine's NVFP4 recipe quantizes no attention, "
                       "and meshsim does not model FP4 primary weights", f"drop run.{field}, or use run.fp8: mxfp8")
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
