"""The collective simulator (nccl-tests, simulated): NCCL algorithms as phase plans over the topology,
max-min fair link sharing, NCCL's protocol constants. docs/collectives.md describes the model."""

from meshsim.sim.cost.collectives.channels import kernel_channels, ring_channels
from meshsim.sim.cost.collectives.choose import ALGOS, OPS, algorithms_for
from meshsim.sim.cost.collectives.cost import CollectiveCost, busbw_factor, collective_cost
from meshsim.sim.cost.collectives.maxmin import maxmin_rates
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, NcclConstants

__all__ = [
    "ALGOS",
    "DEFAULT_CONSTANTS",
    "OPS",
    "CollectiveCost",
    "NcclConstants",
    "algorithms_for",
    "busbw_factor",
    "collective_cost",
    "kernel_channels",
    "maxmin_rates",
    "ring_channels",
]
