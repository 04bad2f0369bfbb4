"""Preset names -> builders, and `build_topology`, the one entry point scenarios and the CLI use.

Builds are memoized (same arguments -> the same `Topology` object, whose route cache is then shared),
because sweeps build the same machine many times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from meshsim.sim.core.errors import UserError, unknown_name_error
from meshsim.topologies import presets
from meshsim.topologies.custom import load_topology_file as _load
from meshsim.topologies.fabric import check_fabric_args, with_fabric
from meshsim.topologies.model import Topology


@dataclass(frozen=True)
class PresetInfo:
    name: str
    builder: Callable[..., Topology]
    gpu: str  # GPU preset (topologies/gpus.py)
    description: str
    rack: bool = False  # a rack-scale NVLink domain: builder(gpus) takes the GPUs a job uses per rack (<= 72)


PRESETS: dict[str, PresetInfo] = {
    p.name: p
    for p in (
        PresetInfo("dgx1-v100", presets.dgx1_v100, "v100-sxm2", "8x V100, NVLink2 hybrid cube-mesh, 4x 100G IB"),
        PresetInfo("dgx2-v100", presets.dgx2_v100, "v100-sxm2", "16x V100 on NVSwitch, 8x 100G IB"),
        PresetInfo("dgx-a100", presets.dgx_a100, "a100-80gb", "8x A100-80GB on NVSwitch gen2, 8x 200G HDR"),
        PresetInfo("dgx-h100", presets.dgx_h100, "h100-sxm", "8x H100 on NVSwitch gen3 + NVLS, 8x 400G NDR"),
        PresetInfo("dgx-h200", presets.dgx_h200, "h200-sxm", "8x H200 on NVSwitch gen3 + NVLS, 8x 400G NDR"),
        PresetInfo("dgx-b200", presets.dgx_b200, "b200", "8x B200 on NVSwitch + NVLS, 8x 400G"),
        PresetInfo("gb200-nvl72", presets.gb200_nvl72, "gb200", "72 Blackwell GPUs, one NVLink domain + NVLS",
                   rack=True),
        PresetInfo("dgx-b300", presets.dgx_b300, "b300", "8x B300 (Blackwell Ultra) on NVSwitch + NVLS, 8x 800G"),
        PresetInfo("gb300-nvl72", presets.gb300_nvl72, "gb300", "72 Blackwell Ultra GPUs, one NVLink domain + NVLS, "
                   "800G", rack=True),
        PresetInfo("pcie-8gpu", presets.pcie_8gpu, "a100-80gb", "8 GPUs on PCIe Gen4, no NVLink, 2x 200G"),
    )
}


@lru_cache(maxsize=256)
def _build(preset: str, nodes: int, nic_gbitps: float | None, switch_latency_us: float, oversubscription: float,
           nvlink_gbps: float | None, gpus_per_node: int | None = None) -> Topology:
    info = PRESETS[preset]
    node = info.builder(gpus_per_node) if gpus_per_node is not None else info.builder()
    return with_fabric(node, nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps)


def check_gpus_per_node(preset: str, gpus_per_node: int | None, source: str | None) -> None:
    """topology.gpus_per_node: only the rack-scale presets, 1 .. 72."""
    if gpus_per_node is None:
        return
    racks = ", ".join(name for name, info in PRESETS.items() if info.rack)
    if not PRESETS[preset].rack:
        raise UserError("topology.gpus_per_node", gpus_per_node, f"remove it, or use a rack-scale preset ({racks})",
                        source=source, problem=f"{preset} nodes are used whole")
    if not 1 <= gpus_per_node <= presets.NVL72_GPUS:
        raise UserError("topology.gpus_per_node", gpus_per_node, f"use 1 to {presets.NVL72_GPUS} (a rack's GPUs)",
                        source=source)


def build_topology(preset: str, nodes: int = 1, *, nic_gbitps: float | None = None,
                   switch_latency_us: float = 0.5, oversubscription: float = 1.0,
                   nvlink_gbps: float | None = None, gpus_per_node: int | None = None,
                   source: str | None = None) -> Topology:
    """The preset's node, optionally with NVLink scaled to nvlink_gbps, multiplied into `nodes` nodes on an
    IB fabric (nic_gbitps defaults to the preset's NIC rate). A rack-scale preset's node may hold only the
    `gpus_per_node` of its 72 GPUs a job uses. Memoized."""
    if preset not in PRESETS:
        raise unknown_name_error("topology.preset", preset, PRESETS, source=source)
    check_fabric_args(nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps, source)
    check_gpus_per_node(preset, gpus_per_node, source)
    try:
        return _build(preset, nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps, gpus_per_node)
    except UserError as err:
        raise err.with_source(source) if source else err from None


def load_topology_file(path: str, nodes: int | None = None, *, nic_gbitps: float | None = None,
                       switch_latency_us: float = 0.5, oversubscription: float = 1.0,
                       nvlink_gbps: float | None = None) -> Topology:
    """A custom topology YAML (custom.py), optionally multiplied into `nodes` nodes (default: the file's
    `nodes`, else 1). Memoized on the file's path and text."""
    return _load(path, nodes, nic_gbitps=nic_gbitps, switch_latency_us=switch_latency_us,
                 oversubscription=oversubscription, nvlink_gbps=nvlink_gbps)
