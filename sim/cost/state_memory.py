"""Model states per GPU: the 16-bit weights (and their FP8 copies), the main gradients and the optimizer states
of the parameters one rank holds (sim/cost/memory.py adds the activations and the workspace).

    weights   = held x 2 B + FP8 copies (sim/cost/fp8_memory.py)
    grads     = held x main-gradient bytes (4, or 2 with optimizer.main_grads_dtype: bf16)
    optimizer = owned x state bytes (sim/schedule/optimizer_states.py), Muon's parameters at 8 B
                (sim/schedule/muon.py); host_gb the CPU-offloaded share

`held` is every parameter of the rank (FSDP: its shards plus two whole blocks, sim/cost/fsdp_memory.py),
`owned` the optimizer's share (1 / dp of the dense ones and 1 / edp of the routed experts' under the
distributed optimizer, all of them otherwise; with parallel.dist_opt_instances I, 1 / (dp / I) and
1 / (edp / I): each instance holds a whole copy of the states).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.core.units import BF16_BYTES, GB
from meshsim.sim.cost.fp8_memory import fp8_weight_extra_bytes
from meshsim.sim.cost.fsdp_memory import fsdp_resident_params
from meshsim.sim.schedule.moe_shapes import fp8_linear_weights
from meshsim.sim.schedule.muon import owned_muon_params
from meshsim.sim.schedule.optimizer_states import main_grad_bytes, state_bytes
from meshsim.sim.schedule.shapes import layer_dims

WEIGHT_BYTES = BF16_BYTES


def fp8_weights_gb(rs: ResolvedScenario, layers: Sequence[int], head: bool = False) -> float:
    """GB the FP8 copies add to the 16-bit weights of `layers` (`head`: an FP8 LM head's too; fp8_memory.py)."""
    d = layer_dims(rs)
    return fp8_weight_extra_bytes(d, fp8_linear_weights(rs, d, layers, head), rs.scenario.run.fp8_param_gather) / GB


def model_states_gb(rs: ResolvedScenario, params: int, expert_params: int, layers: Sequence[int],
                    head: bool) -> tuple[float, float, float, float]:
    """(weights, grads, GPU optimizer, host optimizer) GB of `params` dense and `expert_params` routed-expert
    parameters, `layers` transformer layers and `head` the LM head (module docstring)."""
    opt, bf16 = rs.scenario.optimizer, rs.scenario.model.dtype == "bf16"
    shard, eshard = rs.instance_shards if rs.scenario.parallel.distributed_optimizer else (1, 1)
    held = params + expert_params
    resident = fsdp_resident_params(rs, params, expert_params) if rs.scenario.parallel.fsdp else held
    owned = params / shard + expert_params / eshard
    gpu_opt, host_opt = state_bytes(opt, bf16, owned, owned_muon_params(rs, layer_dims(rs), layers))
    fp8_scale = resident / held if rs.scenario.run.fp8_param_gather and held else 1.0  # fsdp_memory.py
    weights = resident * WEIGHT_BYTES / GB + fp8_weights_gb(rs, layers, head) * fp8_scale
    return weights, resident * main_grad_bytes(opt, rs.scenario.run.grad_reduce_dtype) / GB, gpu_opt / GB, host_opt / GB
