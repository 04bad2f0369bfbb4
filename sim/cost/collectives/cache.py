"""Per-topology memo tables keyed by object identity.

Topologies are frozen but hashing one hashes every device and link, so caches key on `id(topo)` and
keep a reference to the topology (its id cannot be reused while cached). At most MAX_TOPOLOGIES
topologies are remembered (least recently used dropped); each table holds at most MAX_ENTRIES items.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from meshsim.topologies.model import Topology

MAX_TOPOLOGIES = 32
MAX_ENTRIES = 4096

_TABLES: OrderedDict[int, tuple[Topology, dict[str, OrderedDict]]] = OrderedDict()


def table(topo: Topology, name: str) -> OrderedDict:
    """The memo table `name` of this topology."""
    key = id(topo)
    hit = _TABLES.get(key)
    if hit is None or hit[0] is not topo:
        hit = _TABLES[key] = (topo, {})
        while len(_TABLES) > MAX_TOPOLOGIES:
            _TABLES.popitem(last=False)
    _TABLES.move_to_end(key)
    return hit[1].setdefault(name, OrderedDict())


def remember(tab: OrderedDict, key: Any, value: Any) -> Any:
    tab[key] = value
    while len(tab) > MAX_ENTRIES:
        tab.popitem(last=False)
    return value


def clear() -> None:
    """Forget everything (benchmarks measure cold evaluations)."""
    _TABLES.clear()
