"""Single-node presets: the devices and links inside one DGX / HGX / NVL72 box.

Figures: /work/shared/reference/hardware-facts.md (NVLink per GPU, NVSwitch generation, NICs per node).
Each builder returns a one-node `Topology` whose device names start with "n0."; `fabric.py` copies it
into N nodes. An NVSwitch complex is one "nvswitch" device per node, each GPU joined to it by one link
pair carrying the GPU's whole NVLink bandwidth. Latencies are physical per-hop figures (wire, SerDes,
switch traversal); NCCL's protocol/software latency is added by the collective model. docs/topologies.md
gives the reasoning for every constant below.
"""

from __future__ import annotations

from meshsim.sim.core.units import gbit_to_gbps
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Device, Link, LinkKind, Topology

# --- per-hop latencies (us); chosen physical estimates, reasoning in docs/topologies.md -------------------
NVSWITCH_HOP_US = 0.15  # GPU<->NVSwitch link: SerDes + half the switch traversal; GPU->GPU = 0.3 us
NVLINK_DIRECT_US = 0.1  # point-to-point NVLink (DGX-1): SerDes + short board trace, no switch
PCIE_HOP_US = 0.5  # one link into/out of a PCIe switch or root complex: TLP SerDes + cut-through
NIC_HOP_US = 1.0  # GPU -> NIC across the node's PCIe switch, including the NIC's send pipeline
CPU_LINK_US = 0.5  # CPU<->CPU socket interconnect (QPI/UPI) traversal

# --- PCIe x16 bandwidth per direction (GB/s); hardware-facts.md gives Gen4 32 and Gen5 64 ----------------
PCIE_GEN3_GBPS = 16.0  # half of Gen4 (8 vs 16 GT/s per lane, same 128b/130b encoding)
PCIE_GEN4_GBPS = 32.0
PCIE_GEN5_GBPS = 64.0
PCIE_GEN6_GBPS = 128.0  # twice Gen5 (64 vs 32 GT/s per lane); ConnectX-8's host link, fed to an 800 Gb/s port
QPI_GBPS = 38.4  # 2 QPI links x 9.6 GT/s x 2 bytes (Xeon E5-2698 v4 in DGX-1), per direction


def link_pair(a: str, b: str, bw_gbps: float, latency_us: float, kind: LinkKind) -> list[Link]:
    """Both directions of one cable."""
    return [Link(a, b, bw_gbps, latency_us, kind), Link(b, a, bw_gbps, latency_us, kind)]


def _gpus(n: int) -> list[Device]:
    return [Device(f"n0.gpu{i}", "gpu", 0) for i in range(n)]


def _nics(n_gpus: int, gpus_per_nic: int, pcie_gbps: float) -> tuple[list[Device], list[Link]]:
    """NIC r serves GPUs [r*g, (r+1)*g). One GPU per NIC: a direct PCIe link of NIC_HOP_US.
    Shared NIC: a PCIe switch per GPU group, GPU->switch PCIE_HOP_US + switch->NIC the rest of NIC_HOP_US."""
    devices: list[Device] = []
    links: list[Link] = []
    for r in range(n_gpus // gpus_per_nic):
        nic = f"n0.nic{r}"
        devices.append(Device(nic, "nic", 0))
        members = [f"n0.gpu{i}" for i in range(r * gpus_per_nic, (r + 1) * gpus_per_nic)]
        if gpus_per_nic == 1:
            links += link_pair(members[0], nic, pcie_gbps, NIC_HOP_US, "pcie")
            continue
        sw = f"n0.pcie{r}"
        devices.append(Device(sw, "pcie_switch", 0))
        for gpu in members:
            links += link_pair(gpu, sw, pcie_gbps, PCIE_HOP_US, "pcie")
        links += link_pair(sw, nic, pcie_gbps, NIC_HOP_US - PCIE_HOP_US, "pcie")
    return devices, links


def nvswitch_node(name: str, gpu: str, n_gpus: int, *, nvls: bool, nics: int, nic_gbitps: float,
                  pcie_gbps: float, description: str) -> Topology:
    """n_gpus GPUs on one NVSwitch device (the GPU preset's full NVLink bandwidth each), plus NICs."""
    nvlink_gbps = GPUS[gpu].nvlink_gbps
    devices = _gpus(n_gpus) + [Device("n0.nvsw", "nvswitch", 0, in_network_reduction=nvls)]
    links: list[Link] = []
    for i in range(n_gpus):
        links += link_pair(f"n0.gpu{i}", "n0.nvsw", nvlink_gbps, NVSWITCH_HOP_US, "nvlink")
    nic_devs, nic_links = _nics(n_gpus, n_gpus // nics, pcie_gbps)
    return Topology(name=name, gpu=gpu, nodes=1, gpus_per_node=n_gpus, devices=tuple(devices + nic_devs),
                    links=tuple(links + nic_links), description=description, nvlink_gbps_per_gpu=nvlink_gbps,
                    nic_gbps_per_gpu=nics * gbit_to_gbps(nic_gbitps) / n_gpus, nic_gbitps=nic_gbitps)


# DGX-1V hybrid cube-mesh: NVLink units between GPU pairs (the DGX-1 with Tesla V100 system architecture
# whitepaper; `nvidia-smi topo -m` prints NV1/NV2). Quads {0..3} and {4..7} are fully connected, plus the
# cross links i <-> i+4; every GPU has 6 units of 25 GB/s per direction (= V100's 150 GB/s).
DGX1_NVLINK_UNITS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2,
    (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
    (0, 4): 2, (1, 5): 2, (2, 6): 1, (3, 7): 1,
}
NVLINK2_UNIT_GBPS = 25.0  # one NVLink2 link per direction (hardware-facts.md: 6 links x 25)


def dgx1_v100() -> Topology:
    """DGX-1V: 8 V100 on the hybrid cube-mesh (parallel links merged), 4 PCIe switches each with a GPU pair
    and one 100 Gb/s NIC, switches 0-1 on CPU0 and 2-3 on CPU1, CPUs joined by QPI. Non-neighbour GPU pairs
    route over NVLink through one intermediate GPU (nvlink_gpu_transit), like NCCL's PATH_NVB."""
    devices = _gpus(8)
    links: list[Link] = []
    for (a, b), units in DGX1_NVLINK_UNITS.items():
        links += link_pair(f"n0.gpu{a}", f"n0.gpu{b}", units * NVLINK2_UNIT_GBPS, NVLINK_DIRECT_US, "nvlink")
    nic_devs, nic_links = _nics(8, 2, PCIE_GEN3_GBPS)
    devices += nic_devs + [Device("n0.cpu0", "cpu", 0), Device("n0.cpu1", "cpu", 0)]
    for sw in range(4):
        links += link_pair(f"n0.pcie{sw}", f"n0.cpu{sw // 2}", PCIE_GEN3_GBPS, PCIE_HOP_US, "pcie")
    links += nic_links + link_pair("n0.cpu0", "n0.cpu1", QPI_GBPS, CPU_LINK_US, "internal")
    return Topology(name="dgx1-v100", gpu="v100-sxm2", nodes=1, gpus_per_node=8, devices=tuple(devices),
                    links=tuple(links), description="DGX-1V: 8x V100, NVLink2 hybrid cube-mesh, 4x 100G IB",
                    nvlink_gbps_per_gpu=GPUS["v100-sxm2"].nvlink_gbps, nic_gbps_per_gpu=gbit_to_gbps(100) / 2,
                    nic_gbitps=100.0, nvlink_gpu_transit=True)


def dgx2_v100() -> Topology:
    return nvswitch_node("dgx2-v100", "v100-sxm2", 16, nvls=False, nics=8, nic_gbitps=100, pcie_gbps=PCIE_GEN3_GBPS,
                         description="DGX-2: 16x V100 on NVSwitch gen1, 8x 100G IB")


def dgx_a100() -> Topology:
    return nvswitch_node("dgx-a100", "a100-80gb", 8, nvls=False, nics=8, nic_gbitps=200, pcie_gbps=PCIE_GEN4_GBPS,
                         description="DGX A100: 8x A100-80GB on NVSwitch gen2, 8x 200G HDR IB")


def dgx_h100() -> Topology:
    return nvswitch_node("dgx-h100", "h100-sxm", 8, nvls=True, nics=8, nic_gbitps=400, pcie_gbps=PCIE_GEN5_GBPS,
                         description="DGX H100: 8x H100 on NVSwitch gen3 (NVLS), 8x 400G NDR IB")


def dgx_h200() -> Topology:
    return nvswitch_node("dgx-h200", "h200-sxm", 8, nvls=True, nics=8, nic_gbitps=400, pcie_gbps=PCIE_GEN5_GBPS,
                         description="DGX H200: 8x H200 on NVSwitch gen3 (NVLS), 8x 400G NDR IB")


def dgx_b200() -> Topology:
    return nvswitch_node("dgx-b200", "b200", 8, nvls=True, nics=8, nic_gbitps=400, pcie_gbps=PCIE_GEN5_GBPS,
                         description="DGX B200: 8x B200 on NVSwitch gen4 (NVLS), 8x 400G IB")


NVL72_GPUS = 72  # GPUs in one GB200 / GB300 NVL72 rack's NVLink domain


def gb200_nvl72(gpus: int = NVL72_GPUS) -> Topology:
    """`gpus` of the rack's 72 in the job (registry: topology.gpus_per_node); the rest sit idle."""
    return nvswitch_node("gb200-nvl72", "gb200", gpus, nvls=True, nics=gpus, nic_gbitps=400,
                         pcie_gbps=PCIE_GEN5_GBPS, description=f"GB200 NVL72: {_of_72(gpus)}Blackwell GPUs in "
                         "one NVLink domain (NVLS), 400G NIC each")


def _of_72(gpus: int) -> str:
    return f"{NVL72_GPUS} " if gpus == NVL72_GPUS else f"{gpus} of the {NVL72_GPUS} "


def dgx_b300() -> Topology:
    return nvswitch_node("dgx-b300", "b300", 8, nvls=True, nics=8, nic_gbitps=800, pcie_gbps=PCIE_GEN6_GBPS,
                         description="DGX B300: 8x B300 (Blackwell Ultra) on NVSwitch (NVLS), 8x 800G ConnectX-8")


def gb300_nvl72(gpus: int = NVL72_GPUS) -> Topology:
    """`gpus` of the rack's 72 in the job (registry: topology.gpus_per_node); the rest sit idle."""
    return nvswitch_node("gb300-nvl72", "gb300", gpus, nvls=True, nics=gpus, nic_gbitps=800,
                         pcie_gbps=PCIE_GEN6_GBPS, description=f"GB300 NVL72: {_of_72(gpus)}Blackwell Ultra GPUs "
                         "in one NVLink domain (NVLS), 800G ConnectX-8 each")


def pcie_8gpu(gpu: str = "a100-80gb") -> Topology:
    """8 GPUs without NVLink: two PCIe Gen4 switches of 4 GPUs, each with one 200 Gb/s NIC, both switches
    on one CPU root complex (x16 uplinks). Cross-switch traffic shares the 32 GB/s uplinks."""
    devices = _gpus(8) + [Device("n0.cpu0", "cpu", 0)]
    links: list[Link] = []
    for sw in range(2):
        name = f"n0.pcie{sw}"
        devices += [Device(name, "pcie_switch", 0), Device(f"n0.nic{sw}", "nic", 0)]
        for i in range(4 * sw, 4 * sw + 4):
            links += link_pair(f"n0.gpu{i}", name, PCIE_GEN4_GBPS, PCIE_HOP_US, "pcie")
        links += link_pair(name, "n0.cpu0", PCIE_GEN4_GBPS, PCIE_HOP_US, "pcie")
        links += link_pair(name, f"n0.nic{sw}", PCIE_GEN4_GBPS, NIC_HOP_US - PCIE_HOP_US, "pcie")
    return Topology(name="pcie-8gpu", gpu=gpu, nodes=1, gpus_per_node=8, devices=tuple(devices),
                    links=tuple(links), description="8 GPUs on PCIe Gen4 (2 switches x 4 GPUs), 2x 200G IB",
                    nvlink_gbps_per_gpu=0.0, nic_gbps_per_gpu=2 * gbit_to_gbps(200) / 8, nic_gbitps=200.0)
