"""How a group of ranks sits on the machine: ranks per node, and the order NCCL would chain them in a node.

- `by_node`: the group's ranks split per node (nodes ascending, ranks ascending inside a node), memoized.
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


def by_node(topo: Topology, ranks: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The group's ranks per node (nodes ascending, ranks ascending inside a node), as tuples memoized per
    (topology, group): pricing one group at many sizes (`meshsim collective`, 1,000 sizes on 16,384 ranks)
    splits it once, not once per size, algorithm and protocol. Immutable, so no caller can change the
    memo; it is this pure function's own result."""
    key = tuple(ranks)
    tab = cache.table(topo, "by_node")
    hit = tab.get(key)
    if hit is None:
        nodes: dict[int, list[int]] = {}
        for r in sorted(set(key)):
            nodes.setdefault(topo.node_of(r), []).append(r)
        hit = cache.remember(tab, key, tuple(tuple(nodes[n]) for n in sorted(nodes)))
    return hit


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
    """A cycle through all of `local` using only `near` edges: a depth-first search from local[0] trying
    each vertex's `near` list in order, at most _SEARCH_BUDGET steps (a step = entering a vertex), or None.
    Iterative (an explicit stack of the `near` iterators), so a node of thousands of GPUs cannot exhaust
    Python's recursion limit; it visits the vertices in the order of the recursive search it replaced
    (tests/test_topologies.py checks the two agree), so every ring order is unchanged."""
    start, n = local[0], len(local)
    path, seen, budget = [start], {start}, _SEARCH_BUDGET - 1
    if n == 1:
        return None if start not in near[start] else (start,)
    stack = [iter(near[start])]
    while stack:
        for nxt in stack[-1]:
            if nxt in seen:
                continue
            budget -= 1
            if budget < 0:
                return None  # the recursive search unwound to None from here on
            path.append(nxt)
            seen.add(nxt)
            if len(path) == n:
                if start in near[nxt]:
                    return tuple(path)
                seen.discard(path.pop())
                continue
            stack.append(iter(near[nxt]))
            break
        else:
            stack.pop()
            if stack:
                seen.discard(path.pop())
    return None
