"""Megatron-Core's rules for the optimizer section (precision-aware states, CPU offload), one-line errors.

Sources (NVIDIA/Megatron-LM @d98e8a64): megatron/core/optimizer/optimizer_config.py L468-480 (a dtype
other than fp32 needs --use-precision-aware-optimizer), megatron/training/arguments.py L1883-1887
(--optimizer-cpu-offload needs --use-precision-aware-optimizer, "as the hybrid device optimizer reuses
the code path of this flag") and L1208-1211 (--main-grads-dtype bf16 cannot accumulate and reduce
gradients in fp32), L1724-1741 (an emerging optimizer such as Muon: not with Megatron-FSDP or torch FSDP2;
with --use-distributed-optimizer it runs the layer-wise distributed optimizer). The offload's bandwidth fields
describe the offloaded step only. Muon with the precision-aware or offloaded Adam is refused: meshsim
does not model those states for its parameters.
"""

from __future__ import annotations

from collections.abc import Callable

from meshsim.scenarios.check_base import CheckContext, rule_error
from meshsim.scenarios.schema import Scenario

DTYPE_FIELDS = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
OFFLOAD_FIELDS = ("pcie_gbps", "host_mem_gbps")


def check_precision_aware_dtypes(s: Scenario, ctx: CheckContext) -> None:
    o = s.optimizer
    if o.precision_aware:
        return
    for name in DTYPE_FIELDS:
        if getattr(o, name) != "fp32":
            raise rule_error(ctx, f"optimizer.{name}", getattr(o, name), "Megatron keeps optimizer tensors "
                             "in fp32 unless the precision-aware optimizer is on",
                             f"set optimizer.precision_aware: true, or optimizer.{name}: fp32")


def check_cpu_offload(s: Scenario, ctx: CheckContext) -> None:
    o = s.optimizer
    if o.cpu_offload and not o.precision_aware:
        raise rule_error(ctx, "optimizer.cpu_offload", True, "Megatron's optimizer CPU offload runs on the "
                         "precision-aware optimizer's code path", "set optimizer.precision_aware: true")
    if o.cpu_offload:
        return
    for name in (*OFFLOAD_FIELDS, "overlap_cpu_d2h_h2d"):
        if getattr(o, name):
            raise rule_error(ctx, f"optimizer.{name}", getattr(o, name), "it describes the CPU-offloaded "
                             "optimizer step, which is off", f"set optimizer.cpu_offload: true, or remove optimizer.{name}")


def check_main_grads_reduce(s: Scenario, ctx: CheckContext) -> None:
    if s.optimizer.main_grads_dtype == "bf16" and s.run.grad_reduce_dtype == "fp32":
        raise rule_error(ctx, "run.grad_reduce_dtype", "fp32", "bf16 main gradients cannot be accumulated "
                         "and reduced in fp32", "remove run.grad_reduce_dtype, or set optimizer.main_grads_dtype: fp32")


def check_muon(s: Scenario, ctx: CheckContext) -> None:
    o = s.optimizer
    if o.name != "muon":
        if o.muon_ns_steps != 5:
            raise rule_error(ctx, "optimizer.muon_ns_steps", o.muon_ns_steps, "it sets Muon's Newton-Schulz "
                             "iterations, and optimizer.name is adam", "set optimizer.name: muon, or remove the field")
        return
    if s.parallel.fsdp:
        raise rule_error(ctx, "optimizer.name", "muon", "Megatron's emerging optimizers do not run under "
                         "Megatron-FSDP (arguments.py L1740)", "set parallel.fsdp: false, or optimizer.name: adam")
    if o.precision_aware or o.cpu_offload:
        field = "optimizer.precision_aware" if o.precision_aware else "optimizer.cpu_offload"
        raise rule_error(ctx, field, True, "meshsim models Muon with Megatron's default fp32 states, not "
                         "the precision-aware or offloaded Adam", f"remove {field}, or set optimizer.name: adam")


Rule = Callable[[Scenario, CheckContext], None]

OPTIMIZER_RULES: tuple[Rule, ...] = (check_precision_aware_dtypes, check_cpu_offload, check_main_grads_reduce,
                                     check_muon)
