"""Model states per GPU under FSDP (parallel.fsdp, Megatron-FSDP's ZeRO-3; schedule in sim/schedule/fsdp_ops.py).

A rank keeps 1/dp of the dense weights and main gradients (1/edp of the routed experts') and, while blocks
run, two whole units in the double buffer (Megatron-LM @d98e8a64 docs/user-guide/features/megatron_fsdp.md,
"Double Buffering": "no more than two FSDP units are un-sharded at any point"; the gradient side, "at least
two FSDP units worth of un-sharded gradient memory"). So weights and gradients are both held for

    resident = dense / dp + expert / edp + 2 x largest unit

(with parallel.dist_opt_instances I, Megatron-FSDP's hybrid sharding, dp / I and edp / I: each instance
holds a whole copy)

parameters, where a unit is one transformer layer, the embedding table, or the head (final norm, output
layer, and the MTP depths that run with it). The optimizer states are the distributed optimizer's (sharded
the same way). FP8 copies: with run.fp8_param_gather the FP8 weights are sharded and gathered like the
16-bit ones (their extra bytes scale by resident / held); without it TE casts each gathered weight in its
forward and keeps the FP8 copy for the backward of the micro-batch in flight, every layer's, as many bytes
as the distributed optimizer's cached copies (unscaled).
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.cost.layer_memory import layer_params
from meshsim.sim.cost.mtp_memory import mtp_extra_params
from meshsim.sim.schedule.layer_kinds import layer_kind, layer_plan
from meshsim.sim.schedule.mtp_ops import mtp_layer_ids
from meshsim.sim.schedule.shapes import layer_dims


def largest_unit_params(rs: ResolvedScenario) -> int:
    """Parameters of the largest FSDP unit on one rank: a layer (dense + routed experts), the embedding
    table, or the head with its MTP depths."""
    d, model = layer_dims(rs), rs.scenario.model
    plan = layer_plan(rs, d)
    per_layer = [sum(layer_params(plan, layer_kind(model, layer))) for layer in range(model.layers)]
    table = d.vocab * d.hidden
    mtp = sum(sum(layer_params(plan, layer_kind(model, layer))) for layer in mtp_layer_ids(model))
    head = table + d.norm_params + mtp_extra_params(rs) + mtp  # tied: the head gathers the shared table too
    return max([*per_layer, table, head])


def fsdp_resident_params(rs: ResolvedScenario, dense: int, expert: int) -> float:
    """Parameters whose weight and main gradient a rank holds under FSDP (module docstring); with nothing to
    shard (dp = edp = 1) the whole model, as without FSDP (nothing is gathered)."""
    shard, eshard = rs.instance_shards
    if shard == 1 and eshard == 1:
        return dense + expert
    return dense / shard + expert / eshard + 2 * largest_unit_params(rs)
