"""The physical model: devices (GPUs, switches, NICs), directed links, and routes between GPUs.

Units: link bandwidth `bw_gbps` is GB/s per direction (1e9 B/s); latency `latency_us` is the one-way
per-hop latency of the link in microseconds. Every physical cable is two directed `Link`s.

GPUs are addressed by their global rank: node-major, `rank = node * gpus_per_node + local_index`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
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
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    description: str = ""
    # the per-GPU figures a user reads in `meshsim topologies`; informational only
    nvlink_gbps_per_gpu: float = 0.0
    nic_gbps_per_gpu: float = 0.0
    _route_cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    # ----- lookups -------------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @cached_property
    def gpu_names(self) -> tuple[str, ...]:
        """Device names of the GPUs in global-rank order."""
        gpus = [d.name for d in self.devices if d.kind == "gpu"]
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

        Default policy: fewest hops, ties broken by lowest total latency then by link index
        (deterministic). Topology builders may pre-seed `_route_cache` with explicit routes
        (e.g. rail-optimized fabrics).
        """
        key = (src_rank, dst_rank)
        cached = self._route_cache.get(key)
        if cached is None:
            cached = self._shortest_path(self.gpu_names[src_rank], self.gpu_names[dst_rank])
            self._route_cache[key] = cached
        return cached

    def _shortest_path(self, src: str, dst: str) -> tuple[int, ...]:
        if src == dst:
            return ()
        best: dict[str, tuple[int, float]] = {src: (0, 0.0)}
        parent: dict[str, int] = {}
        queue = deque([src])
        while queue:
            dev = queue.popleft()
            hops, lat = best[dev]
            for li in self.out_links[dev]:
                link = self.links[li]
                nxt = link.dst
                # GPUs are endpoints, never transit devices, except over direct NVLink meshes
                cand = (hops + 1, lat + link.latency_us)
                if nxt not in best or cand < best[nxt]:
                    first_visit = nxt not in best
                    best[nxt] = cand
                    parent[nxt] = li
                    if first_visit and (self.device_by_name[nxt].kind != "gpu" or nxt == dst):
                        queue.append(nxt)
        if dst not in parent:
            raise ValueError(f"topology {self.name}: no route from {src} to {dst}")
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
