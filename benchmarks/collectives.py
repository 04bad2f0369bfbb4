"""Benchmark of the collective simulator: wall time of cold evaluations (empty route and plan caches).

    python benchmarks/collectives.py

Prints, for a 1 GB all-reduce over 1024 GPUs (128 DGX H100 nodes, one group), ring and hierarchical;
a 30-size sweep on 16 GPUs (2 nodes); the engine's typical calls (every DP / TP group at once); flows
evaluated per second; and the busbw figures next to the link figures they should be compared with.
"""

from __future__ import annotations

import dataclasses
import time

from meshsim.sim.cost.collectives import cache, collective_cost
from meshsim.sim.cost.collectives.cost import STATS
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS
from meshsim.topologies.registry import build_topology

GB = 1 << 30


def fresh(preset: str, nodes: int):
    """The preset with empty route caches, and the plan caches cleared: a cold evaluation."""
    cache.clear()
    return dataclasses.replace(build_topology(preset, nodes), _route_cache={})


def timed(label: str, fn) -> object:
    flows0 = STATS["flows"]
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    flows = STATS["flows"] - flows0
    print(f"{label:58s} {wall * 1e3:9.1f} ms  {flows:7d} flows  {flows / wall:12,.0f} flows/s")
    return result


def main() -> None:
    eff = DEFAULT_CONSTANTS.efficiencies("h100-sxm")
    nvlink, nic = 450.0 * eff["nvlink"], 50.0 * eff["ib"]
    print(f"link figures: NVLink {nvlink:.1f} GB/s per GPU (450 x {eff['nvlink']:.3f}), "
          f"NIC {nic:.1f} GB/s (400 Gb/s x {eff['ib']:.2f}); 8 NICs per node -> ring busbw bound {8 * nic:.0f} GB/s")
    print()
    for algo in ("ring", "hierarchical", "tree"):
        topo = fresh("dgx-h100", 128)
        c = timed(f"1 GB all_reduce, 1024 GPUs (128 x dgx-h100), {algo}",
                  lambda t=topo, a=algo: collective_cost(t, "all_reduce", range(1024), GB, algo=a))
        print(f"    -> {c.algo}/{c.protocol}: {c.time_s * 1e3:.2f} ms, busbw {c.busbw_gbps:.1f} GB/s "
              f"(latency {c.latency_s * 1e3:.2f} ms)")
    topo = fresh("dgx-h100", 2)
    sizes = [1024 << i for i in range(30)]
    rows = timed("30-size all_reduce sweep, 16 GPUs (2 x dgx-h100), auto",
                 lambda: [collective_cost(topo, "all_reduce", range(16), s) for s in sizes])
    print(f"    -> 1 GB: {rows[20].algo}/{rows[20].protocol} busbw {rows[20].busbw_gbps:.1f} GB/s; "
          f"largest ({sizes[-1] >> 30} GB): {rows[-1].algo}/{rows[-1].protocol} {rows[-1].busbw_gbps:.1f} GB/s")
    topo = fresh("dgx-h100", 128)
    dp = [tuple(range(t, 1024, 8)) for t in range(8)]
    c = timed("256 MB all_reduce, DP group of 128 + 7 concurrent DP groups",
              lambda: collective_cost(topo, "all_reduce", dp[0], 256 << 20, concurrent_groups=dp))
    print(f"    -> {c.algo}/{c.protocol}: busbw {c.busbw_gbps:.1f} GB/s (one rail: bound {nic:.0f} GB/s)")
    tp = [tuple(range(8 * i, 8 * i + 8)) for i in range(128)]
    c = timed("16 MB all_reduce, TP group of 8 + 127 concurrent TP groups",
              lambda: collective_cost(topo, "all_reduce", tp[0], 16 << 20, concurrent_groups=tp))
    print(f"    -> {c.algo}/{c.protocol}: busbw {c.busbw_gbps:.1f} GB/s "
          f"(NVLS: its 16 channels' loop over chunks, nvls_limits.py; "
          f"ring bound {nvlink:.0f})")


if __name__ == "__main__":
    main()
