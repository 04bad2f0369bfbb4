"""Rules for distributed-optimizer instances (`parallel.dist_opt_instances`, Megatron's
--num-distributed-optimizer-instances), one-line errors.

Sources (NVIDIA/Megatron-LM @d98e8a64): megatron/core/parallel_state.py L922-926 (dp x cp divisible by the
instances: "Data parallel size should be divisible by partial DistOpt shard factor") and L1447-1449 (the
expert data-parallel size too); megatron/core/distributed/param_and_grad_buffer.py L699-760 (the instances
shard the distributed optimizer: without it there is nothing to split); megatron/core/optimizer/__init__.py
L838-845 (the layer-wise distributed optimizer of an emerging optimizer such as Muon asserts one instance).
With parallel.fsdp the instances are Megatron-FSDP's hybrid sharding (HSDP, the default
--outer-dp-sharding-strategy no_shard; its "optim" variant, HFSDP, is not modelled).
"""

from __future__ import annotations

from collections.abc import Callable

from meshsim.scenarios.check_base import CheckContext, data_parallel, divisors, gpus_used, rule_error, use_in
from meshsim.scenarios.schema import Scenario


def check_instances_shard(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if p.dist_opt_instances == 1:
        return
    if not p.distributed_optimizer:
        raise rule_error(ctx, "parallel.dist_opt_instances", p.dist_opt_instances, "the instances split the "
                         "distributed optimizer's sharding, and it is off", "set parallel.distributed_optimizer: "
                         "true, or parallel.dist_opt_instances: 1")
    if s.optimizer.name == "muon":
        raise rule_error(ctx, "parallel.dist_opt_instances", p.dist_opt_instances, "Megatron's layer-wise "
                         "distributed optimizer (Muon's) runs one instance", "set parallel.dist_opt_instances: 1")


def check_instances_divide(s: Scenario, ctx: CheckContext) -> None:
    p, n = s.parallel, s.parallel.dist_opt_instances
    if n == 1:
        return
    gpus = gpus_used(s, ctx.topology_gpus)
    replicas = data_parallel(s, gpus) * p.cp
    if replicas % n:
        raise rule_error(ctx, "parallel.dist_opt_instances", n, f"each instance holds dp x cp / instances "
                         f"replicas, and {n} does not divide dp x cp = {replicas}",
                         use_in("parallel.dist_opt_instances", [d for d in divisors(replicas) if d > 1]))
    edp = gpus // (p.pp * p.etp * p.ep)
    if s.model.moe is not None and edp % n:
        raise rule_error(ctx, "parallel.dist_opt_instances", n, f"the experts' data-parallel group is cut into "
                         f"instances too, and {n} does not divide edp = {edp}",
                         use_in("parallel.dist_opt_instances", [d for d in divisors(edp) if d > 1
                                                                and replicas % d == 0]))


Rule = Callable[[Scenario, CheckContext], None]

INSTANCE_RULES: tuple[Rule, ...] = (check_instances_shard, check_instances_divide)
