"""The flex dispatcher's fused all-to-all kernels (DeepEP / HybridEP; Megatron-Core fused_a2a.py), priced on
the same links as NCCL's all-to-all (the direct plan: every rank sends to every other at once, max-min
sharing with the concurrent ep groups), with the bandwidth those kernels were measured to reach instead of
NCCL's per-link figures (reference/public-measurements-2.md section 1.14):

- NVLink: DeepEP's intranode normal kernels reach 153 GB/s (dispatch) and 158 GB/s (combine) of H800's
  ~160 GB/s NVLink (deepseek-ai/DeepEP docs/legacy.md): DEEPEP_NVLINK_EFFICIENCY = 153 / 160 of the link
  peak, vs NCCL's 20.6 / 25 (protocols.NVLINK_EFFICIENCY). On a GPU with more NVLink than that the kernels
  do not keep up: what a GPU's kernels push through NVLink is capped per generation (FLEX_NVLINK_CAP_GBPS,
  the SMs they run on), so the efficiency is min(153 / 160, cap / NVLink GB/s per GPU):
  - Blackwell 660.6 GB/s: DeepEP V2 (README.md) measures 726 / 740 GB/s of logical bandwidth (local rows
    included, like flex_bytes) at 64 SMs on SM100 EP8; the BF16 combine of that benchmark (8,192 tokens,
    hidden 7,168, top-8 of 256 experts: 622 MB per rank) takes 0.840 ms at 740 GB/s, which the direct
    plan on 8 B200 gives at 0.734 of 900 GB/s (tests/test_flex_cost.py holds it; 153 / 160 gave 960 GB/s).
    Calibrated on the kernel row; no training step is in fit. Its 24-SM row (643 / 675 GB/s) would put
    HybridEP's default 16 SMs near 440 GB/s if the cap scaled with SMs; the Blackwell HybridEP steps
    (Qwen3-30B-A3B MXFP8 on B300, GB200, GB300) then come out 15-17% slow, so parallel.moe_flex_sms does
    not set the cap here (their recipes may run more SMs);
  - Hopper 189 GB/s (0.42 of an H100's 450): fitted on Megatron-LM's MoE layer benchmark on 8 H100
    (section 1.5), the DeepSeek-proxy HybridEP bf16 forward + backward, with the layer's GEMMs at the burst
    clock of a lone kernel (sim/cost/gemm_ceiling.py): 0.42 gives +0.2%, 0.43 -0.5%;
    its other 14 DeepEP / HybridEP rows are out of fit. With 153 / 160 of 450 GB/s the flex layers were
    0.9-1.0 ms per direction too fast against the alltoall ones on the DeepSeek proxy, whose alltoall
    rows meshsim holds within 3%; an H800's 160 GB/s stays under the cap, as DeepEP measured it.
- RDMA: DeepEP V2 (README.md) on SM90 with CX7 400 Gb/s NICs, EP8x2, dispatches at 90 GB/s "logical
  bandwidth" (local traffic included): half of a rank's rows cross the network, so each NIC carries
  45 GB/s of its 50 GB/s line rate: DEEPEP_RDMA_EFFICIENCY = 0.90 (EP8x4's 61 GB/s logical, three
  quarters remote, gives 0.915; the legacy kernels' 43-58 GB/s bracket it).
The bytes are the kernels' own (one row per token and destination rank, sim/schedule/moe_shapes.py);
the per-node RDMA deduplication of DeepEP's internode kernels (a token crosses the network once per
node and is forwarded over NVLink) is not modeled: the RDMA part is priced per destination rank,
which overstates it when several of a token's ranks share a node. The SMs the kernels occupy
(--moe-flex-dispatcher-num-sms) matter when they overlap compute (parallel.moe_ep_overlap).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshsim.sim.cost.collectives.nccl_limits import generation
from meshsim.sim.cost.collectives.protocols import DEFAULT_CONSTANTS, NcclConstants
from meshsim.topologies.model import Topology

DEEPEP_NVLINK_EFFICIENCY = 153.0 / 160.0
DEEPEP_RDMA_EFFICIENCY = 0.90
FLEX_KERNELS = ("deepep", "hybridep")
# SMs the fused kernels occupy by default: DeepEP's historical 20 (transformer_config.py L969-971), HybridEP
# 16 (the value Megatron-Bridge's DeepSeek-V3 B200 recipe sets, reference section 1.4)
DEFAULT_FLEX_SMS = {"deepep": 20, "hybridep": 16}

FLEX_CONSTANTS: NcclConstants = replace(DEFAULT_CONSTANTS, nvlink_efficiency=DEEPEP_NVLINK_EFFICIENCY,
                                        network_efficiency=DEEPEP_RDMA_EFFICIENCY)
# What a GPU's flex kernels push through NVLink, GB/s per direction, by NCCL generation (module doc)
FLEX_NVLINK_CAP_GBPS = {"hopper": 189.0, "blackwell": 660.6}


def flex_arguments(kernel: str, topo: Topology) -> dict[str, Any]:
    """collective_cost keyword arguments for a collective moved by `kernel` on `topo`: none for NCCL; the flex
    kernels' constants (NVLink efficiency min(153 / 160, the generation's cap / NVLink GB/s per GPU)), the
    direct plan and the Simple protocol's bandwidth (the kernels stream bulk data) else."""
    if kernel == "nccl":
        return {}
    if kernel not in FLEX_KERNELS:
        raise ValueError(f"unknown all-to-all kernel {kernel!r}")
    return {"constants": flex_constants(topo), "algo": "direct", "protocol": "simple"}


def flex_constants(topo: Topology) -> NcclConstants:
    """FLEX_CONSTANTS with the NVLink efficiency capped by the generation's FLEX_NVLINK_CAP_GBPS (the callers
    memoize the costs: CollectiveCoster per collective)."""
    cap = FLEX_NVLINK_CAP_GBPS.get(generation(topo.gpu))
    if cap is None or topo.nvlink_gbps_per_gpu <= 0:
        return FLEX_CONSTANTS
    return replace(FLEX_CONSTANTS, nvlink_efficiency=min(DEEPEP_NVLINK_EFFICIENCY, cap / topo.nvlink_gbps_per_gpu))
