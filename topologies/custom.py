"""Custom topology YAML: the model's fields, validated, then optionally multiplied with the IB fabric.

Format (docs/topologies.md, example docs/examples/custom-topology.yaml):
  name, gpu (GPU preset), gpus_per_node, description?, nodes? (default 1), nic_gbitps? (NIC line rate,
  needed when nodes > 1), nvlink_gpu_transit? (default false),
  devices: [{name, kind, in_network_reduction?}]   -- GPUs' local ranks follow their order here
  links:   [{src, dst, bw_gbps, latency_us, kind, bidirectional? (default true)}]
Every mistake raises UserError naming the file, the field (e.g. `links[3].bw_gbps`), the value and the fix.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshsim.sim.core.errors import FilePath, UserError, closest, unknown_name_error
from meshsim.sim.core.limits import MAX_DEVICES, MAX_LINKS, MAX_TRANSIT_GPUS, check_at_most
from meshsim.sim.core.quantities import Gbitps, GBps, LatencyUs
from meshsim.sim.core.units import gbit_to_gbps
from meshsim.sim.core.userio import is_file, parse_yaml, read_text
from meshsim.topologies.fabric import check_fabric_args, with_fabric
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Device, Link, Topology


class _Frozen(BaseModel):
    """defer_build: a model's validator is built when a topology file is first read, not at import (a run on a
    preset reads none)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False, defer_build=True)


class DeviceSpec(_Frozen):
    name: str = Field(min_length=1)
    kind: Literal["gpu", "nvswitch", "pcie_switch", "nic", "ib_switch", "cpu"]
    in_network_reduction: bool = False


class LinkSpec(_Frozen):
    src: str
    dst: str
    bw_gbps: GBps  # GB/s per direction
    latency_us: LatencyUs
    kind: Literal["nvlink", "pcie", "ib", "internal"]
    bidirectional: bool = True


class CustomTopology(_Frozen):
    name: str = Field(min_length=1)
    gpu: str
    gpus_per_node: int = Field(gt=0)
    description: str = ""
    nodes: int = Field(default=1, gt=0)
    nic_gbitps: Gbitps | None = None
    nvlink_gpu_transit: bool = False
    devices: list[DeviceSpec] = Field(min_length=1)
    links: list[LinkSpec] = Field(min_length=1)


_MODELS = {"devices": DeviceSpec, "links": LinkSpec}


def _field(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _user_error(err: ValidationError, source: str) -> UserError:
    """The first pydantic error as a UserError (unknown keys get the closest valid key)."""
    errors = err.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])  # a misspelt key explains most
    loc, field = tuple(e["loc"]), _field(tuple(e["loc"]))
    if e["type"] == "extra_forbidden":
        model = _MODELS.get(str(loc[0]), CustomTopology) if len(loc) > 2 else CustomTopology
        valid = sorted(model.model_fields)
        return unknown_name_error(field, str(loc[-1]), valid, source=source)
    value = e.get("input") if e["type"] != "missing" else None
    return UserError(field, value, f"{e['msg']} (see docs/topologies.md, custom topology YAML)",
                     source=source, problem="Missing" if e["type"] == "missing" else "")


def _check_names(spec: CustomTopology, source: str) -> None:
    names: set[str] = set()
    for i, dev in enumerate(spec.devices):
        if dev.name in names:
            raise UserError(f"devices[{i}].name", dev.name, "give every device a unique name", source=source,
                            problem="Duplicate device name")
        names.add(dev.name)
        if dev.in_network_reduction and dev.kind not in ("nvswitch", "ib_switch"):
            raise UserError(f"devices[{i}].in_network_reduction", True, "only nvswitch / ib_switch devices "
                            "reduce in the network; set it false", source=source)
    for i, link in enumerate(spec.links):
        for end in ("src", "dst"):
            name = getattr(link, end)
            if name not in names:
                guess = closest(name, names)
                raise UserError(f"links[{i}].{end}", name, (f"did you mean {guess!r}? " if guess else "")
                                + "name a device listed under devices", source=source, problem="Unknown device")


def _check_counts(spec: CustomTopology, source: str) -> None:
    if spec.gpu not in GPUS:
        raise unknown_name_error("gpu", spec.gpu, GPUS, source=source)
    n_gpus = sum(d.kind == "gpu" for d in spec.devices)
    if n_gpus != spec.gpus_per_node:
        raise UserError("gpus_per_node", spec.gpus_per_node, f"set gpus_per_node: {n_gpus} (the devices list "
                        f"has {n_gpus} of kind gpu), or add/remove GPU devices", source=source)
    if spec.nvlink_gpu_transit:
        check_at_most("gpus_per_node", spec.gpus_per_node, MAX_TRANSIT_GPUS, "set nvlink_gpu_transit: false, or "
                      f"use at most {MAX_TRANSIT_GPUS} GPUs per node", source=source,
                      what="GPUs per node with nvlink_gpu_transit")
    if spec.nodes > 1 and spec.nic_gbitps is None:
        raise UserError("nic_gbitps", None, "give the NIC line rate in Gb/s (e.g. nic_gbitps: 200) to join "
                        f"{spec.nodes} nodes", source=source, problem="Missing")


def _to_topology(spec: CustomTopology) -> Topology:
    devices = tuple(Device(d.name, d.kind, 0, d.in_network_reduction) for d in spec.devices)
    links: list[Link] = []
    for lk in spec.links:
        links.append(Link(lk.src, lk.dst, lk.bw_gbps, lk.latency_us, lk.kind))
        if lk.bidirectional:
            links.append(Link(lk.dst, lk.src, lk.bw_gbps, lk.latency_us, lk.kind))
    gpus = [d.name for d in devices if d.kind == "gpu"]
    nvlink_out = dict.fromkeys(gpus, 0.0)
    for lk in links:
        if lk.kind == "nvlink" and lk.src in nvlink_out:
            nvlink_out[lk.src] += lk.bw_gbps
    nvlink = max(nvlink_out.values())
    nics = sum(d.kind == "nic" for d in devices)
    rate = spec.nic_gbitps or 0.0
    return Topology(name=spec.name, gpu=spec.gpu, nodes=1, gpus_per_node=spec.gpus_per_node, devices=devices,
                    links=tuple(links), description=spec.description or f"custom topology {spec.name}",
                    nvlink_gbps_per_gpu=nvlink, nic_gbps_per_gpu=nics * gbit_to_gbps(rate) / len(gpus),
                    nic_gbitps=rate, nvlink_gpu_transit=spec.nvlink_gpu_transit)


def _check_connected(topo: Topology, source: str) -> None:
    """Every GPU must reach every other GPU (under the transit rules of model.py). Without GPU transit a
    GPU reaches the GPUs it links to plus those reachable from the devices it links to: one search per
    such device and one union per distinct set of them, so a 5,000-GPU switch costs one search."""
    gpus = topo.gpu_names
    gpu_set = set(gpus)
    via_hubs: dict[tuple[str, ...], set[str]] = {}
    for rank, gpu in enumerate(gpus):
        if topo.nvlink_gpu_transit:
            reached = gpu_set.intersection(topo.paths_from(gpu)) - {gpu}
            extra: set[str] = set()
        else:
            first = [topo.links[li].dst for li in topo.out_links[gpu]]
            hubs = tuple(sorted({d for d in first if d not in gpu_set}))
            if hubs not in via_hubs:
                via_hubs[hubs] = gpu_set.intersection(d for hub in hubs for d in topo.device_search(hub)[0])
            reached = via_hubs[hubs]
            extra = {d for d in first if d in gpu_set and d not in reached and d != gpu}
        if len(reached) - (gpu in reached) + len(extra) < len(gpus) - 1:
            other = next(o for o in gpus if o != gpu and o not in reached and o not in extra)
            index = next(i for i, d in enumerate(topo.devices) if d.name == other)
            raise UserError(f"devices[{index}]", other, f"add links so that {gpu} (rank {rank}) reaches "
                            f"{other}; routes never pass through a GPU unless nvlink_gpu_transit is true",
                            source=source, problem="GPU not connected")


def parse_topology(data: object, source: str) -> tuple[Topology, int]:
    """A validated one-node Topology and the file's `nodes`, from parsed YAML."""
    if not isinstance(data, dict):
        raise UserError("file", type(data).__name__, "the file must be a YAML mapping (name:, gpu:, ...)",
                        source=source)
    for key, limit in (("devices", MAX_DEVICES), ("links", MAX_LINKS)):
        if isinstance(data.get(key), list):
            check_at_most(key, f"[{len(data[key])} entries]", limit, f"use at most {limit:,} {key} per node",
                          source=source, what=f"the number of {key}", amount=len(data[key]))
    try:
        spec = CustomTopology.model_validate(data)
    except ValidationError as err:
        raise _user_error(err, source) from None
    _check_names(spec, source)
    _check_counts(spec, source)
    topo = _to_topology(spec)
    _check_connected(topo, source)
    return topo, spec.nodes


@lru_cache(maxsize=64)
def _load(path: str, text: str, nodes: int | None, fabric: tuple) -> Topology:
    node, file_nodes = parse_topology(parse_yaml(text, path), path)
    return with_fabric(node, file_nodes if nodes is None else nodes, *fabric, source=path)


def load_topology_file(path: str, nodes: int | None = None, *, nic_gbitps: float | None = None,
                       switch_latency_us: float = 0.5, oversubscription: float = 1.0,
                       nvlink_gbps: float | None = None) -> Topology:
    """Load and validate a custom topology YAML; `nodes` (default: the file's, else 1) > 1 adds the fabric.
    Memoized on (path, the file's text, arguments): the text is read once per call (pinned during a sweep,
    sim/core/userio.py), so an edit is never hidden by the memo."""
    if not is_file(path):
        raise UserError("topology.file", FilePath(path), "give the path of an existing topology YAML "
                        "(relative paths are relative to the scenario file)", problem="No such file")
    check_fabric_args(1 if nodes is None else nodes, nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps, path)
    fabric = (nic_gbitps, switch_latency_us, oversubscription, nvlink_gbps)
    text = read_text(path, field="topology.file")
    return _load(os.path.abspath(path), text, nodes, fabric)
