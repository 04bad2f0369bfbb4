"""The physical model: devices (GPUs, switches, NICs), directed links, and routes between GPUs.

Units: link bandwidth `bw_gbps` is GB/s per direction (1e9 B/s); latency `latency_us` is the one-way
per-hop latency of the link in microseconds. Every physical cable is two directed `Link`s.

GPUs are addressed by their global rank: node-major, `rank = node * gpus_per_node + local_index`.

Routing: a topology built with a `router` (the IB fabric of `fabric.py`) answers `route()` in closed form
from node/rail indices; every other topology uses a breadth-first search. GPUs are endpoints and never
transit traffic, so a route is one link out of the source GPU followed by the best path from the device it
enters: one search per non-GPU device, shared by every GPU behind it, makes routing near-linear in the
size of the node (5,000 GPUs on one switch: one search, not 5,000). A topology with
`nvlink_gpu_transit=True` (a switchless NVLink mesh such as DGX-1) may forward NVLink-to-NVLink through an
intermediate GPU, as NCCL's PATH_NVB paths do; it keeps one search per source GPU (such meshes have at most
MAX_TRANSIT_GPUS GPUs, sim/core/limits.py; docs/topologies.md, "Routing").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Literal

DeviceKind = Literal["gpu", "nvswitch", "pcie_switch", "nic", "ib_switch", "cpu"]
LinkKind = Literal["nvlink", "pcie", "ib", "internal"]


@dataclass(frozen=True)
class Device:
    name: str  # unique, e.g. "n0.gpu3", "n0.nvsw", "n0.nic3", "leaf2", "spine0"
    kind: DeviceKind
    node: int | None = None  # owning node; None for fabric switches
    in_network_reduction: bool = False  # NVSwitch with NVLS (NVLink SHARP) / IB switch with SHARP


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    bw_gbps: float
    latency_us: float
    kind: LinkKind


@dataclass(frozen=True)
class Topology:
    """A frozen device graph. `route(a, b)` gives the link indices a transfer from rank a to rank b uses."""

    name: str
    gpu: str  # GPU preset name implied by the topology (e.g. "h100-sxm")
    nodes: int
    gpus_per_node: int
    devices: Sequence[Device]  # a tuple, or a fabric's sequence built from its structure (fabric_items.py)
    links: Sequence[Link]
    description: str = ""
    # the per-GPU figures a user reads in `meshsim topologies`; informational only
    nvlink_gbps_per_gpu: float = 0.0
    nic_gbps_per_gpu: float = 0.0
    nic_gbitps: float = 0.0  # line rate of each NIC (Gb/s); 0 = the node has no NIC
    nvlink_gpu_transit: bool = False  # routes may forward NVLink->NVLink through a GPU (DGX-1 mesh)
    router: Callable[[int, int], tuple[int, ...]] | None = field(default=None, compare=False, repr=False)
    _route_cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    # ----- identity: cheap hash/eq, so a Topology can key memo caches (it may hold ~10^4 links) -----
    def __hash__(self) -> int:
        return hash((self.name, self.nodes, self.gpus_per_node, len(self.devices), len(self.links)))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Topology):
            return NotImplemented
        names = [f.name for f in fields(self) if f.compare]
        return all(getattr(self, n) == getattr(other, n) for n in names)

    # ----- lookups -------------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @cached_property
    def gpu_names(self) -> tuple[str, ...]:
        """Device names of the GPUs in global-rank order (a fabric's from its node template: fabric_items.py)."""
        from_structure = getattr(self.devices, "gpu_names", None)
        gpus = list(from_structure()) if from_structure is not None else [d.name for d in self.devices if d.kind == "gpu"]
        if len(gpus) != self.num_gpus:
            raise ValueError(f"topology {self.name}: {len(gpus)} GPUs, expected {self.num_gpus}")
        return tuple(gpus)

    @cached_property
    def device_by_name(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    @cached_property
    def out_links(self) -> dict[str, tuple[int, ...]]:
        """Device name -> indices of links leaving it."""
        out: dict[str, list[int]] = {d.name: [] for d in self.devices}
        for i, link in enumerate(self.links):
            out[link.src].append(i)
        return {k: tuple(v) for k, v in out.items()}

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    # ----- routing -------------------------------------------------------------------------------
    def route(self, src_rank: int, dst_rank: int) -> tuple[int, ...]:
        """Link indices on the path src -> dst (empty for src == dst). Cached.

        With a structural `router` (fabrics) the route is computed in O(hops). Otherwise: fewest hops,
        ties broken by lowest total latency, widest bottleneck, then the first link; searches are shared
        per first-hop device (module docstring).
        """
        key = (src_rank, dst_rank)
        cached = self._route_cache.get(key)
        if cached is not None:
            return cached
        n = self.num_gpus
        if not (0 <= src_rank < n and 0 <= dst_rank < n):
            raise ValueError(f"topology {self.name}: ranks ({src_rank}, {dst_rank}) outside 0..{n - 1}")
        if self.router is not None:
            cached = self.router(src_rank, dst_rank)
        elif self.nvlink_gpu_transit:
            cached = self.bfs_route(src_rank, dst_rank)
        else:
            cached = self._first_hop_route(src_rank, dst_rank)
        self._route_cache[key] = cached
        return cached

    def routes(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
        """[self.route(a, b) for a, b in pairs]: the same cache, read and (with a `router`) filled inline (a
        plan reads thousands); a pair out of range goes to route(), which names it."""
        cache, route, n = self._route_cache, self.route, self.num_gpus
        out = [cache.get(pair) for pair in pairs]
        missing = [i for i, hit in enumerate(out) if hit is None]
        many = getattr(self.router, "many", None)
        if many is not None:  # the router's bulk form (fabric.FabricRouter.many) for the pairs in range
            fill = [i for i in missing if 0 <= pairs[i][0] < n and 0 <= pairs[i][1] < n]
            for i, path in zip(fill, many([pairs[i] for i in fill]), strict=True):
                out[i] = cache.setdefault(pairs[i], path)
        for i in missing:
            if out[i] is None:
                out[i] = route(*pairs[i])
        return out

    def device_search(self, src: str) -> tuple[dict[str, int], dict[str, tuple[int, float, float]]]:
        """(parent link, label) of every device reachable from device `src`; memoized per device."""
        key = ("search", src)
        hit = self._route_cache.get(key)
        if hit is None:
            hit = self._route_cache[key] = self._bfs_parents(src, with_labels=True)
        return hit

    def _first_hop_route(self, src_rank: int, dst_rank: int) -> tuple[int, ...]:
        """Without GPU transit: the best of (a link out of src) + (the best path from where it enters), by
        the search's label (hops, latency, -bottleneck); the first such link wins ties."""
        src, dst = self.gpu_names[src_rank], self.gpu_names[dst_rank]
        if src == dst:
            return ()
        best: tuple | None = None
        for li in self.out_links[src]:
            link = self.links[li]
            if link.dst == dst:
                label, path = (1, link.latency_us, -link.bw_gbps), (li,)
            elif self.device_by_name[link.dst].kind == "gpu":
                continue
            else:
                parent, labels = self.device_search(link.dst)
                if dst not in labels:
                    continue
                hops, lat, neg_bw = labels[dst]
                label = (hops + 1, lat + link.latency_us, max(neg_bw, -link.bw_gbps))
                path = (li, *self._unwind(parent, link.dst, dst))
            if best is None or label < best[0]:
                best = (label, path)
        if best is None:
            raise ValueError(f"topology {self.name}: no route from {src} to {dst}")
        return best[1]

    def bfs_route(self, src_rank: int, dst_rank: int) -> tuple[int, ...]:
        """The search-based route (ignores `router`). Without a router it also caches all routes from src."""
        src = self.gpu_names[src_rank]
        parent = self._bfs_parents(src)
        if self.router is None:
            for rank, name in enumerate(self.gpu_names):
                if name in parent or rank == src_rank:
                    self._route_cache.setdefault((src_rank, rank), self._unwind(parent, src, name))
        dst = self.gpu_names[dst_rank]
        if dst != src and dst not in parent:
            raise ValueError(f"topology {self.name}: no route from {src} to {dst}")
        return self._unwind(parent, src, dst)

    def paths_from(self, src: str) -> dict[str, tuple[int, ...]]:
        """Best path (link indices) from device `src` to every reachable device, by the search policy."""
        parent = self._bfs_parents(src)
        return {dev: self._unwind(parent, src, dev) for dev in parent}

    def device_path(self, src: str, dst: str) -> tuple[int, ...]:
        """Fewest-hop link path between two devices by name (same policy as `bfs_route`; memoized search)."""
        parent = self.device_search(src)[0]
        if src != dst and dst not in parent:
            raise ValueError(f"topology {self.name}: no route from {src} to {dst}")
        return self._unwind(parent, src, dst)

    def _bfs_parents(self, src: str, with_labels: bool = False):
        """Device -> link index that reaches it on the best path from src: fewest hops, then lowest latency,
        then widest bottleneck, then first link index (lexicographic labels; each criterion is monotone).

        Level-order search: a device's parent is final when it is popped, so the transit rule (a GPU
        forwards only NVLink->NVLink, and only with `nvlink_gpu_transit`) is checked there.
        """
        best: dict[str, tuple[int, float, float]] = {src: (0, 0.0, -float("inf"))}
        parent: dict[str, int] = {}
        queue = deque([src])
        while queue:
            dev = queue.popleft()
            is_transit_gpu = dev != src and self.device_by_name[dev].kind == "gpu"
            if is_transit_gpu and not (self.nvlink_gpu_transit and self.links[parent[dev]].kind == "nvlink"):
                continue
            hops, lat, neg_bw = best[dev]
            for li in self.out_links[dev]:
                link = self.links[li]
                if is_transit_gpu and link.kind != "nvlink":
                    continue
                cand = (hops + 1, lat + link.latency_us, max(neg_bw, -link.bw_gbps))
                nxt = link.dst
                if nxt not in best:
                    queue.append(nxt)
                if nxt not in best or cand < best[nxt]:
                    best[nxt] = cand
                    parent[nxt] = li
        return (parent, best) if with_labels else parent

    def _unwind(self, parent: dict[str, int], src: str, dst: str) -> tuple[int, ...]:
        path = []
        dev = dst
        while dev != src:
            li = parent[dev]
            path.append(li)
            dev = self.links[li].src
        return tuple(reversed(path))

    def path_latency_us(self, src_rank: int, dst_rank: int) -> float:
        return sum(self.links[i].latency_us for i in self.route(src_rank, dst_rank))

    def path_bw_gbps(self, src_rank: int, dst_rank: int) -> float:
        """Bottleneck bandwidth of the route, alone on an idle network."""
        return min(self.links[i].bw_gbps for i in self.route(src_rank, dst_rank))
