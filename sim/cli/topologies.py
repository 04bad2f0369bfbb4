"""`meshsim topologies`: the preset table, one topology's device/link summary, JSON export."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.table import Table

from meshsim.sim.core.console import Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.limits import check_nodes
from meshsim.sim.core.outfiles import check_output_file
from meshsim.sim.core.text import user_text
from meshsim.sim.core.units import gbit_to_gbps
from meshsim.sim.core.userio import dumps_finite
from meshsim.topologies.gpus import GB_PER_GIB, GPUS
from meshsim.topologies.model import Topology
from meshsim.topologies.registry import PRESETS, build_topology, load_topology_file


def preset_rows() -> list[dict]:
    """One row of key figures per preset (one node each)."""
    rows = []
    for name, info in PRESETS.items():
        topo = build_topology(name)
        gpu = GPUS[topo.gpu]
        rows.append({
            "preset": name,
            "gpu": topo.gpu,
            "gpus_per_node": topo.gpus_per_node,
            "nvlink_gbps_per_gpu": topo.nvlink_gbps_per_gpu,
            "in_switch_reduction": any(d.in_network_reduction for d in topo.devices),
            "nics_per_node": sum(d.kind == "nic" for d in topo.devices),
            "nic_gbitps": topo.nic_gbitps,
            "hbm_gib": round(gpu.mem_gb / GB_PER_GIB, 1),
            "peak_tflops": gpu.peak_tflops,
            "description": info.description,
        })
    return rows


PRESET_COLUMNS = (Column("preset", "left", keep=True), Column("GPU", "left", keep=True), Column("GPUs", keep=True),
                  Column("NVLink GB/s", keep=True), Column("NVLS", keep=True), Column("NICs x Gb/s", keep=True),
                  Column("HBM GiB", keep=True), Column("peak TFLOP/s", rank=0))


def _table(rows: list[dict], width: int) -> tuple[Table, str]:
    cells = [[r["preset"], r["gpu"], str(r["gpus_per_node"]), f"{r['nvlink_gbps_per_gpu']:g}",
              "yes" if r["in_switch_reduction"] else "no", f"{r['nics_per_node']} x {r['nic_gbitps']:g}",
              f"{r['hbm_gib']:g}", f"{r['peak_tflops']:g}"] for r in rows]
    title = ("Topology presets, per node: GPUs, NVLink GB/s per GPU per direction, NVLS = in-switch "
             "reduction (NVLink SHARP), NICs, HBM per GPU, dense BF16 peak per GPU")
    return fitted_table(title, PRESET_COLUMNS, cells, width)


def summary_lines(topo: Topology) -> list[str]:
    """Device/link counts by kind, GPU 0's egress by link kind, and sample route figures."""
    lines = [f"{topo.name}: {topo.description}", f"GPU {topo.gpu}, {topo.nodes} node(s) x {topo.gpus_per_node}"
             f" GPUs = {topo.num_gpus} GPUs"]
    lines.append("devices: " + ", ".join(f"{k} {n}" for k, n in sorted(Counter(d.kind for d in topo.devices).items())))
    lines.append("links (directed): " + ", ".join(f"{k} {n}" for k, n in sorted(Counter(lk.kind for lk in topo.links).items())))
    egress = Counter()
    for li in topo.out_links[topo.gpu_names[0]]:
        egress[topo.links[li].kind] += topo.links[li].bw_gbps
    lines.append("GPU 0 egress GB/s per direction: " + ", ".join(f"{k} {v:g}" for k, v in sorted(egress.items())))
    lines.append(f"NIC per GPU: {topo.nic_gbps_per_gpu:g} GB/s ({topo.nic_gbitps:g} Gb/s per NIC = "
                 f"{gbit_to_gbps(topo.nic_gbitps):g} GB/s)")
    samples = [("same node", 0, topo.gpus_per_node - 1)]
    if topo.nodes > 1:
        samples += [("next node, same rail", 0, topo.gpus_per_node), ("last node, last GPU", 0, topo.num_gpus - 1)]
    for label, a, b in samples:
        hops = len(topo.route(a, b))
        lines.append(f"route {a}->{b} ({label}): {hops} links, {topo.path_latency_us(a, b):.3g} us, "
                     f"bottleneck {topo.path_bw_gbps(a, b):g} GB/s")
    return lines


def topologies(
    nodes: int = typer.Option(None, "--nodes", help="nodes for --show (adds the IB fabric when > 1)"),
    show: str = typer.Option(None, "--show", help="a preset name or a custom topology YAML to summarize"),
    json_path: Path = typer.Option(None, "--json", help="also write the preset table as JSON to this path"),
) -> None:
    """List topology presets with their key figures, or summarize one topology (--show)."""
    check_output_file("--json", json_path)
    check_nodes("--nodes", nodes)
    console = make_console()
    if show:
        is_file = show.endswith((".yaml", ".yml"))
        topo = load_topology_file(show, nodes) if is_file else build_topology(show, nodes or 1)
        for line in summary_lines(topo):
            console.print(user_text(line), highlight=False)
    rows = preset_rows()
    if not show:
        print_fitted(console, _table(rows, console.width))
    if json_path:
        json_path.write_text(dumps_finite(rows, indent=2) + "\n")
        console.print(f"wrote {user_text(json_path)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("topologies")(topologies)
