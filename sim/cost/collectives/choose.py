"""Which (algorithm, protocol) pairs a call may use: applicability, user overrides, the auto candidates.

Like NCCL, `auto` considers every applicable algorithm with every protocol it supports and keeps the one
with the smallest predicted time (cost.py); NCCL_ALGO / NCCL_PROTO-style overrides restrict the choice.
- An explicit `algo=` / `protocol=` argument that does not apply (NVLS on a switch without in-network
  reduction or across nodes, tree for all-gather, LL with NVLS, ...) is a UserError.
- A scenario's `hardware.network.algo` (NetworkTuning) is a preference, used when the argument is "auto":
  it applies to the ops and groups it can serve and the others fall back to auto (a scenario asking for
  tree still runs its all-gathers on rings); only NVLS on a topology without any NVLS switch is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshsim.sim.core.errors import UserError, unknown_name_error
from meshsim.sim.cost.collectives.hierarchical import hierarchical_applies
from meshsim.sim.cost.collectives.nvls import NVLS_OPS, nvls_switches, topology_has_nvls
from meshsim.sim.cost.collectives.nvls_tree import nvls_tree_applies
from meshsim.sim.cost.collectives.protocols import IDEAL, protocols_for
from meshsim.topologies.model import Topology

# send_recv: the ring shift of context parallelism's KV ring (direct.shift_plan)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
ALGOS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical", "direct")
PROTOCOL_NAMES = ("ll", "ll128", "simple", IDEAL)


def algorithms_for(topo: Topology, op: str, ranks: Sequence[int]) -> list[str]:
    """Algorithms that can run `op` on this group, in preference order for ties."""
    if op in ("all_to_all", "send_recv"):
        return ["direct"]
    algos = ["ring"]
    if op == "all_reduce":
        algos.append("tree")
    if op in NVLS_OPS and len(ranks) >= 2 and nvls_switches(topo, ranks):
        algos.append("nvls")
    if nvls_tree_applies(topo, op, ranks):
        algos.append("nvls_tree")
    if op == "all_reduce" and hierarchical_applies(topo, ranks):
        algos.append("hierarchical")
    return algos


def _why_not(topo: Topology, op: str, algo: str) -> str:
    if algo == "nvls" and not topology_has_nvls(topo):
        return f"{topo.name} has no NVSwitch with in-network reduction (NVLS)"
    if algo == "nvls" and op in NVLS_OPS:
        return "NVLS needs every rank on the same NVLS switch (one NVLink domain)"
    if algo == "nvls_tree" and op == "all_reduce":
        return "nvls_tree needs >= 2 nodes, each an NVLS domain holding >= 2 of the ranks, and NICs"
    if algo == "hierarchical" and op == "all_reduce":
        return "hierarchical needs >= 2 ranks on each of >= 2 nodes"
    return f"{algo} does not implement {op}"


def _pick_algos(topo: Topology, op: str, ranks: Sequence[int], algo: str, tuning: Any) -> list[str]:
    usable = algorithms_for(topo, op, ranks)
    if algo != "auto":
        if algo not in ALGOS:
            raise unknown_name_error("algo", algo, ("auto", *ALGOS))
        if algo not in usable:
            raise UserError("algo", algo, f"use auto or one of: {', '.join(usable)}", problem=_why_not(topo, op, algo))
        return [algo]
    preferred = getattr(tuning, "algo", "auto") if tuning is not None else "auto"
    if preferred == "nvls" and not topology_has_nvls(topo):
        raise UserError("hardware.network.algo", preferred, "use auto, ring, tree or hierarchical",
                        problem=_why_not(topo, op, "nvls"))
    return [preferred] if preferred in usable else usable


def candidates(topo: Topology, op: str, ranks: Sequence[int], algo: str = "auto", protocol: str = "auto",
               tuning: Any = None) -> list[tuple[str, str]]:
    """(algorithm, protocol) pairs the auto choice compares (one pair when both are forced)."""
    if op not in OPS:
        raise unknown_name_error("op", op, OPS)
    algos = _pick_algos(topo, op, ranks, algo, tuning)
    if protocol == "auto" and tuning is not None:
        protocol = getattr(tuning, "protocol", "auto")
    if protocol == "auto":
        return [(a, p) for a in algos for p in protocols_for(a)]
    if protocol not in PROTOCOL_NAMES:
        raise unknown_name_error("protocol", protocol, ("auto", *PROTOCOL_NAMES))
    pairs = [(a, protocol) for a in algos if protocol == IDEAL or protocol in protocols_for(a)]
    if not pairs:
        supported = sorted({p for a in algos for p in protocols_for(a)})
        raise UserError("protocol", protocol, f"use auto or one of: {', '.join(supported)}",
                        problem=f"{'/'.join(algos)} does not support {protocol}")
    return pairs
