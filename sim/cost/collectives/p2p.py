"""The cost of one pipeline-parallel send/recv over the topology's real route.

NCCL runs send/recv (ncclSend/ncclRecv; PyTorch's batch_isend_irecv) with the Simple protocol over one
channel set between the two GPUs, so a transfer of S bytes from src to dst costs

    latency_s   = Simple base latency (protocols.BASE_US ring/simple, per launch) + the route's wire
                  and switch latency (sum of its links' latency_us);
    bandwidth_s = S / rate,

where `rate` is this flow's max-min fair rate (maxmin.py) on the links of `topology.route(src, dst)`,
each of capacity peak x link efficiency (protocols.NcclConstants.efficiencies), shared with the
`concurrent` copies: the same transfer between the other (tp, dp) positions of the two stages, which
run at the same moment (NVLink inside a node; the NIC rails and the fabric across nodes).

link_load[l] = (bytes every copy puts on l / capacity_l) / bandwidth_s, the busy fraction of l while the
bandwidth part drains alone; the engine's arbiter shares it with concurrent collectives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from meshsim.sim.core.units import GB
from meshsim.sim.cost.collectives.maxmin import maxmin_rates
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, NcclConstants
from meshsim.topologies.model import Topology


@dataclass(frozen=True)
class P2PCost:
    latency_s: float
    bandwidth_s: float
    rate_gbps: float  # GB/s this flow gets
    link_load: Mapping[int, float] = field(default_factory=dict, hash=False, compare=False)

    @property
    def time_s(self) -> float:
        return self.latency_s + self.bandwidth_s


def p2p_cost(topo: Topology, src: int, dst: int, nbytes: int, *, concurrent: Sequence[tuple[int, int]] = (),
             constants: NcclConstants | None = None, tuning=None) -> P2PCost:
    """Time of one send of `nbytes` from rank src to rank dst (module docstring)."""
    if src == dst or nbytes == 0:
        return P2PCost(0.0, 0.0, 0.0, {})
    consts = (constants or DEFAULT_CONSTANTS).with_tuning(tuning)
    eff = consts.efficiencies(topo.gpu)
    pairs = [(src, dst)] + [pair for pair in concurrent if pair != (src, dst) and pair[0] != pair[1]]
    routes = topo.routes(pairs)
    capacity = {li: topo.links[li].bw_gbps * GB * eff[topo.links[li].kind] for route in routes for li in route}
    rates = maxmin_rates([dict.fromkeys(route, 1.0) for route in routes], capacity)
    rate = rates[0]
    bandwidth_s = nbytes / rate
    busy: dict[int, float] = {}
    for route, r in zip(routes, rates, strict=True):
        for li in route:
            busy[li] = busy.get(li, 0.0) + r
    load = {li: min(1.0, used / capacity[li]) for li, used in busy.items()}
    latency_s = consts.base_s("ring", "simple") + sum(topo.links[li].latency_us for li in routes[0]) * 1e-6
    return P2PCost(latency_s, bandwidth_s, rate / GB, load)
