"""NVLS's own limit: the throughput of its channels, not only the NVLink ports.

The NVLS plan (nvls.py) streams every GPU's data through the NVSwitch, so on links alone a DGX H100
all-reduce would reach 2(n-1)/n x 18 x 20.6 = 649 GB/s of bus bandwidth. It does not: nccl-tests users on
DGX H100 / H200 (NCCL 2.18-2.21) report 450-490 GB/s for NVLS all_reduce at >= 1 GiB, against 360-370 GB/s
for the ring (issue 13). The mechanism: an NVLS kernel runs one CTA per channel, each streaming its share
of the GPU's data into and out of the switch (multimem.ld_reduce / multimem.st) with a bounded number of
requests in flight, and NCCL runs NVLS on NCCL_NVLS_NCHANNELS channels - 16 by default on SM90 (NCCL's
environment-variable documentation) - half the ring's 32. NCCL's tuning.cc folds this into a flat 0.85 NVLS
factor on Hopper; this model states it as a per-channel bound on what a GPU pushes through its switch port:

    per-GPU port traffic / time <= nvls_channels x per-channel GB/s,   i.e.
    algbw <= nvls_channels x per-channel GB/s / port fraction,

the port fraction being the busier direction's share of nbytes (nvls.port_fractions: all-reduce 1,
all-gather / reduce-scatter (n-1)/n). The per-channel figure comes from the user reports: 470 GB/s (the
middle of 450-490) of all-reduce busbw on 8 GPUs is algbw 470 / (2 x 7/8) = 268.6 GB/s, over 16 channels
16.8 GB/s per channel (Hopper). So the bound holds all-reduce at 268.6 GB/s algbw for any group size
(an NVLS all-reduce of 2 GPUs, 268.6 GB/s busbw, loses to the ring at large sizes, as in NCCL's own
model) and all-gather / reduce-scatter at 268.6 GB/s of busbw (assumption: no public figure for them).
Blackwell's NVLink 5 doubles the per-link rate; its per-channel figure is taken as twice Hopper's
(assumption, no public figure). Overridable: NcclConstants(nvls_channels=..., nvls_channel_gbps=...).
"""

from __future__ import annotations

from meshsim.sim.cost.collectives.nccl_limits import generation
from meshsim.sim.cost.collectives.nvls import port_fractions

NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default on SM90 (NCCL env docs); taken for every generation
REPORTED_NVLS_ALL_REDUCE_BUSBW_GBPS = 470.0  # 8 x H100/H200, nccl-tests users, 450-490 GB/s (issue 13)
_REPORTED_ALGBW_GBPS = REPORTED_NVLS_ALL_REDUCE_BUSBW_GBPS / (2 * 7 / 8)  # busbw -> algbw on 8 GPUs
# per-channel GB/s of a GPU's switch-port traffic, by NCCL architecture row (nccl_limits.GENERATION_BY_GPU)
NVLS_CHANNEL_GBPS = {
    "hopper": _REPORTED_ALGBW_GBPS / NVLS_CHANNELS,
    "blackwell": 2.0 * _REPORTED_ALGBW_GBPS / NVLS_CHANNELS,  # assumption: NVLink 5 = 2x per link
}
DEFAULT_NVLS_GENERATION = "hopper"  # NVLS needs NVSwitch gen 3+: Hopper or later


def nvls_channels(channels: int | None = None) -> int:
    """Channels an NVLS call runs on (NCCL_NVLS_NCHANNELS; `channels` overrides)."""
    return NVLS_CHANNELS if channels is None else channels


def nvls_algbw_cap_gbps(gpu: str, op: str, ranks: int, channels: int | None = None,
                        per_channel_gbps: float | None = None) -> float:
    """nvls_channels x per-channel GB/s / port fraction: the highest algbw (GB/s) NVLS reaches."""
    per = per_channel_gbps
    if per is None:
        per = NVLS_CHANNEL_GBPS.get(generation(gpu), NVLS_CHANNEL_GBPS[DEFAULT_NVLS_GENERATION])
    return nvls_channels(channels) * per / max(port_fractions(op, ranks))
