"""How a group of ranks sits on the machine: ranks per node, and the order NCCL would chain them in a node.

- `by_node`: the group's ranks split per node (nodes ascending, ranks ascending inside a node).
- `intra_cycle`: an order of a node's ranks in which every consecutive pair (cyclically) is joined by a
  shortest route - on an NVSwitch every order qualifies and the ascending order is kept; on a switchless
  NVLink mesh (DGX-1) it finds a Hamiltonian cycle over direct links, as NCCL's ring search does. A
  depth-first search with a step budget; when it fails, the ascending order.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.sim.cost.collectives import cache
from meshsim.topologies.model import Topology

_SEARCH_BUDGET = 20_000  # DFS steps before falling back to ascending order


def by_node(topo: Topology, ranks: Sequence[int]) -> list[list[int]]:
    nodes: dict[int, list[int]] = {}
    for r in sorted(set(ranks)):
        nodes.setdefault(topo.node_of(r), []).append(r)
    return [nodes[n] for n in sorted(nodes)]


def ranks_per_node(topo: Topology, ranks: Sequence[int]) -> int | None:
    """k when every node of the group holds exactly k of its ranks, else None."""
    sizes = {len(g) for g in by_node(topo, ranks)}
    return sizes.pop() if len(sizes) == 1 else None


def intra_cycle(topo: Topology, members: Sequence[int]) -> list[int]:
    """Members of one node ordered so that consecutive ranks (cyclically) are shortest-route neighbours."""
    members = sorted(members)
    if len(members) <= 2:
        return members
    base = members[0] - members[0] % topo.gpus_per_node
    local = tuple(m - base for m in members)
    return [base + i for i in _local_cycle(topo, local)]


def _local_cycle(topo: Topology, local: tuple[int, ...]) -> tuple[int, ...]:
    tab = cache.table(topo, "cycle")
    hit = tab.get(local)
    return hit if hit is not None else cache.remember(tab, local, _search_cycle(topo, local))


def _search_cycle(topo: Topology, local: tuple[int, ...]) -> tuple[int, ...]:
    hops = {(a, b): len(topo.route(a, b)) for a in local for b in local if a != b}
    best = min(hops.values())
    near = {a: sorted((b for b in local if b != a and hops[a, b] == best),
                      key=lambda b: (-topo.path_bw_gbps(a, b), b)) for a in local}
    found = _hamiltonian(local, near)
    return found if found is not None else local


def _hamiltonian(local: tuple[int, ...], near: dict[int, list[int]]) -> tuple[int, ...] | None:
    """A cycle through all of `local` using only `near` edges (DFS, bounded)."""
    start, n = local[0], len(local)
    path, seen, budget = [start], {start}, [_SEARCH_BUDGET]

    def dfs() -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if len(path) == n:
            return start in near[path[-1]]
        for nxt in near[path[-1]]:
            if nxt not in seen:
                path.append(nxt)
                seen.add(nxt)
                if dfs():
                    return True
                path.pop()
                seen.discard(nxt)
        return False

    return tuple(path) if dfs() else None
