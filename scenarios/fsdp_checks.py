"""Rules for fully sharded data parallelism (`parallel.fsdp`, Megatron-FSDP's ZeRO-3), one-line errors.

Sources (NVIDIA/Megatron-LM @d98e8a64): megatron/training/arguments.py L1118-1135 (Megatron-FSDP v1, the
default version, runs with the distributed optimizer: it turns --use-distributed-optimizer on itself) and
L1150-1151 (only the sgd and adam optimizers). What meshsim does not model is refused rather than guessed:
FSDP beside pipeline parallelism (each stage would shard its own layers over dp; the schedule of gathers
between the pipeline's interleaved forwards and backwards is not built) and beside the combined 1F1B of
`moe_ep_overlap` (sim/schedule/fsdp_ops.py walks the plain order of a micro-batch's blocks).
"""

from __future__ import annotations

from collections.abc import Callable

from meshsim.scenarios.check_base import CheckContext, rule_error
from meshsim.scenarios.schema import Scenario


def check_fsdp_optimizer(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if p.fsdp and not p.distributed_optimizer:
        raise rule_error(ctx, "parallel.distributed_optimizer", False, "Megatron-FSDP shards the optimizer "
                         "states with the distributed optimizer (it turns it on itself)",
                         "set parallel.distributed_optimizer: true, or parallel.fsdp: false")


def check_fsdp_layout(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if not p.fsdp:
        return
    if p.pp > 1:
        raise rule_error(ctx, "parallel.fsdp", True, f"meshsim models FSDP without pipeline parallelism "
                         f"(pp = {p.pp})", "set parallel.pp: 1, or parallel.fsdp: false (the distributed "
                         "optimizer shards the optimizer states under pipelining)")
    if p.moe_ep_overlap:
        raise rule_error(ctx, "parallel.fsdp", True, "meshsim models FSDP on the plain micro-batch order, not "
                         "the combined 1F1B of moe_ep_overlap", "set parallel.moe_ep_overlap: false, or "
                         "parallel.fsdp: false")


Rule = Callable[[Scenario, CheckContext], None]

FSDP_RULES: tuple[Rule, ...] = (check_fsdp_optimizer, check_fsdp_layout)
