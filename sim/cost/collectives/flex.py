"""The flex dispatcher's fused all-to-all kernels (DeepEP / HybridEP; Megatron-Core fused_a2a.py), priced on
the same links as NCCL's all-to-all (the direct plan: every rank sends to every other at once, max-min
sharing with the concurrent ep groups), with the bandwidth those kernels were measured to reach instead of
NCCL's per-link figures (reference/public-measurements-2.md section 1.14):

- NVLink: DeepEP's intranode normal kernels reach 153 GB/s (dispatch) and 158 GB/s (combine) of H800's
  ~160 GB/s NVLink (deepseek-ai/DeepEP docs/legacy.md): DEEPEP_NVLINK_EFFICIENCY = 153 / 160 of the link
  peak, vs NCCL's 20.6 / 25 (protocols.NVLINK_EFFICIENCY). On Blackwell the kernels reach less of NVLink 5:
  DeepEP V2 (README.md) measures 726 / 740 GB/s at 64 SMs on SM100 EP8, which the direct plan gives at
  DEEPEP_SM100_NVLINK_EFFICIENCY = 0.734 (calibrated on the kernel benchmark, no training step; below). Its
  24-SM row (643 / 675 GB/s) would put HybridEP's default 16 SMs at ~440 GB/s if the kernels were
  SM-bound there; the Blackwell HybridEP steps (Qwen3-30B-A3B MXFP8 on B300, GB200, GB300) then come out
  15-17% slow, so the SM count does not cap the bandwidth here (their recipes may run more SMs);
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

DEEPEP_NVLINK_EFFICIENCY = 153.0 / 160.0
DEEPEP_RDMA_EFFICIENCY = 0.90
FLEX_KERNELS = ("deepep", "hybridep")
# SMs the fused kernels occupy by default: DeepEP's historical 20 (transformer_config.py L969-971), HybridEP
# 16 (the value Megatron-Bridge's DeepSeek-V3 B200 recipe sets, reference section 1.4)
DEFAULT_FLEX_SMS = {"deepep": 20, "hybridep": 16}

FLEX_CONSTANTS: NcclConstants = replace(DEFAULT_CONSTANTS, nvlink_efficiency=DEEPEP_NVLINK_EFFICIENCY,
                                        network_efficiency=DEEPEP_RDMA_EFFICIENCY)
# Blackwell: DeepEP V2 on SM100, EP8 over NVLink, "726/740 GB/s at 64 SMs" (dispatch FP8 / combine BF16, logical
# bandwidth: local rows included, like flex_bytes). The BF16 combine of that benchmark (8,192 tokens, hidden 7,168,
# top-8 of 256 experts: 622 MB per rank) takes 0.840 ms at 740 GB/s; the direct plan on 8 B200 gives that time
# at this NVLink efficiency (tests/test_flex_cost.py holds it). The H800-derived 0.956 would give 960 GB/s.
DEEPEP_SM100_NVLINK_EFFICIENCY = 0.734
FLEX_CONSTANTS_BY_GENERATION: dict[str, NcclConstants] = {
    "blackwell": replace(FLEX_CONSTANTS, nvlink_efficiency=DEEPEP_SM100_NVLINK_EFFICIENCY)}


def flex_arguments(kernel: str, gpu: str = "") -> dict[str, Any]:
    """collective_cost keyword arguments for a collective moved by `kernel` on a topology of `gpu`: none for
    NCCL; the flex kernels' constants (by NCCL generation: FLEX_CONSTANTS_BY_GENERATION, else the H800-derived
    FLEX_CONSTANTS), the direct plan and the Simple protocol's bandwidth (the kernels stream bulk data) else."""
    if kernel == "nccl":
        return {}
    if kernel not in FLEX_KERNELS:
        raise ValueError(f"unknown all-to-all kernel {kernel!r}")
    constants = FLEX_CONSTANTS_BY_GENERATION.get(generation(gpu), FLEX_CONSTANTS)
    return {"constants": constants, "algo": "direct", "protocol": "simple"}
