"""Preset names -> builders, and `build_topology`, the one entry point scenarios and the CLI use.

Builds are memoized (same arguments -> the same `Topology` object, whose route cache is then shared),
because sweeps build the same machine many times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from meshsim.sim.core.errors import UserError, unknown_name_error
from meshsim.sim.core.units import gbit_to_gbps
from meshsim.topologies import presets
from meshsim.topologies.fabric import multiply
from meshsim.topologies.model import Topology


@dataclass(frozen=True)
class PresetInfo:
    name: str
    builder: Callable[[], Topology]
    gpu: str  # GPU preset (topologies/gpus.py)
    description: str


PRESETS: dict[str, PresetInfo] = {
    p.name: p
    for p in (
        PresetInfo("dgx1-v100", presets.dgx1_v100, "v100-sxm2", "8x V100, NVLink2 hybrid cube-mesh, 4x 100G IB"),
        PresetInfo("dgx2-v100", presets.dgx2_v100, "v100-sxm2", "16x V100 on NVSwitch, 8x 100G IB"),
        PresetInfo("dgx-a100", presets.dgx_a100, "a100-80gb", "8x A100-80GB on NVSwitch gen2, 8x 200G HDR"),
        PresetInfo("dgx-h100", presets.dgx_h100, "h100-sxm", "8x H100 on NVSwitch gen3 + NVLS, 8x 400G NDR"),
        PresetInfo("dgx-h200", presets.dgx_h200, "h200-sxm", "8x H200 on NVSwitch gen3 + NVLS, 8x 400G NDR"),
        PresetInfo("dgx-b200", presets.dgx_b200, "b200", "8x B200 on NVSwitch + NVLS, 8x 400G"),
        PresetInfo("gb200-nvl72", presets.gb200_nvl72, "b200", "72 Blackwell GPUs, one NVLink domain + NVLS"),
        PresetInfo("pcie-8gpu", presets.pcie_8gpu, "a100-80gb", "8 GPUs on PCIe Gen4, no NVLink, 2x 200G"),
    )
}


def scale_nvlink(topo: Topology, nvlink_gbps: float, *, source: str | None = None) -> Topology:
    """What-if: every NVLink link scaled by nvlink_gbps / the topology's NVLink bandwidth per GPU."""
    if topo.nvlink_gbps_per_gpu <= 0:
        raise UserError("topology.nvlink_gbps", nvlink_gbps, "remove it: this topology has no NVLink",
                        source=source, problem=f"{topo.name} has no NVLink")
    ratio = nvlink_gbps / topo.nvlink_gbps_per_gpu
    links = tuple(dataclasses.replace(lk, bw_gbps=lk.bw_gbps * ratio) if lk.kind == "nvlink" else lk
                  for lk in topo.links)
    return dataclasses.replace(topo, links=links, nvlink_gbps_per_gpu=nvlink_gbps, _route_cache={})


def check_fabric_args(nodes: int, nic_gbitps: float | None, switch_latency_us: float, oversubscription: float,
                      nvlink_gbps: float | None, source: str | None) -> None:
    """UserError for out-of-range fabric arguments (named as in the scenario schema)."""
    checks = (
        ("topology.nodes", nodes, isinstance(nodes, int) and nodes >= 1, "a whole number of nodes >= 1"),
        ("topology.fabric.nic_gbitps", nic_gbitps, nic_gbitps is None or nic_gbitps > 0, "a line rate > 0 Gb/s"),
        ("topology.fabric.switch_latency_us", switch_latency_us, switch_latency_us >= 0, "a latency >= 0 us"),
        ("topology.fabric.oversubscription", oversubscription, oversubscription >= 1,
         "a ratio >= 1 (1 = non-blocking; 2 = leaf uplinks carry half the downlink capacity)"),
        ("topology.nvlink_gbps", nvlink_gbps, nvlink_gbps is None or nvlink_gbps > 0, "a bandwidth > 0 GB/s"),
    )
    for name, value, ok, fix in checks:
        if not ok:
            raise UserError(name, value, f"use {fix}", source=source)


def with_fabric(node: Topology, nodes: int, nic_gbitps: float | None, switch_latency_us: float,
                oversubscription: float, nvlink_gbps: float | None, source: str | None = None) -> Topology:
    """Apply the NVLink what-if, then multiply into `nodes` nodes (nodes == 1: the node itself)."""
    if nvlink_gbps is not None:
        node = scale_nvlink(node, nvlink_gbps, source=source)
    rate = nic_gbitps if nic_gbitps is not None else node.nic_gbitps
    if nodes == 1:
        if rate != node.nic_gbitps:
            nics = sum(d.kind == "nic" for d in node.devices)
            node = dataclasses.replace(node, nic_gbitps=rate, _route_cache={},
                                       nic_gbps_per_gpu=nics * gbit_to_gbps(rate) / node.gpus_per_node)
        return node
    if rate <= 0 or not any(d.kind == "nic" for d in node.devices):
        raise UserError("topology.nodes", nodes, "use nodes: 1, or give the node devices of kind 'nic' and a "
                        "NIC line rate (nic_gbitps)", source=source, problem=f"{node.name} has no NIC to join nodes")
    return multiply(node, nodes, nic_gbitps=rate, switch_latency_us=switch_latency_us,
                    oversubscription=oversubscription)


@lru_cache(maxsize=256)
def _build(preset: str, nodes: int, nic_gbitps: float | None, switch_latency_us: float, oversubscription: float,
           nvlink_gbps: float | None) -> Topology:
    node = PRESETS[preset].builder()
    return with_fabric(node, nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps)


def build_topology(preset: str, nodes: int = 1, *, nic_gbitps: float | None = None,
                   switch_latency_us: float = 0.5, oversubscription: float = 1.0,
                   nvlink_gbps: float | None = None, source: str | None = None) -> Topology:
    """The preset's node, optionally with NVLink scaled to nvlink_gbps, multiplied into `nodes` nodes on an
    IB fabric (nic_gbitps defaults to the preset's NIC rate). Memoized."""
    if preset not in PRESETS:
        raise unknown_name_error("topology.preset", preset, PRESETS, source=source)
    check_fabric_args(nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps, source)
    try:
        return _build(preset, nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps)
    except UserError as err:
        raise err.with_source(source) if source else err from None


def load_topology_file(path: str, nodes: int | None = None, *, nic_gbitps: float | None = None,
                       switch_latency_us: float = 0.5, oversubscription: float = 1.0,
                       nvlink_gbps: float | None = None) -> Topology:
    """A custom topology YAML (custom.py), optionally multiplied into `nodes` nodes (default: the file's
    `nodes`, else 1). Memoized on the file's path and modification time."""
    from meshsim.topologies.custom import load_topology_file as _load

    return _load(path, nodes, nic_gbitps=nic_gbitps, switch_latency_us=switch_latency_us,
                 oversubscription=oversubscription, nvlink_gbps=nvlink_gbps)
