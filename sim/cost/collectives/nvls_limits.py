"""NVLS's own limit: the throughput of its channels, not only the NVLink ports.

The NVLS plan (nvls.py) streams every GPU's data through the NVSwitch, so on links alone a DGX H100
all-reduce would reach 2(n-1)/n x 18 x 20.6 = 649 GB/s of bus bandwidth. It does not: nccl-tests users on
DGX H100 / H200 (NCCL 2.18-2.21) report 450-490 GB/s for NVLS all_reduce at >= 1 GiB, against 360-370 GB/s
for the ring (issue 13). The mechanism: an NVLS kernel runs one CTA per channel, each issuing
multimem.ld_reduce / multimem.st through the switch with a bounded number of requests in flight, so the
call's throughput is channels x what one CTA sustains, and NCCL runs NVLS on NCCL_NVLS_NCHANNELS
channels - 16 by default on SM90 (NCCL's environment-variable documentation) - fewer than the ring's 32.
NCCL's tuning.cc folds this into a flat 0.85 NVLS factor on Hopper; this model states it instead as

    NVLS busbw = min(link-bound busbw, nvls_channels x per-channel busbw)

with the per-channel figure derived from the user reports: 470 GB/s (the middle of 450-490) / 16 channels
= 29.4 GB/s of bus bandwidth per channel on Hopper. The bound is applied in bus-bandwidth terms to
all-gather and reduce-scatter as well (assumption: no public per-op figure). Blackwell's NVLink 5 doubles
the per-link rate; its per-channel figure is taken as twice Hopper's (assumption, no public figure).
Both numbers are overridable: NcclConstants(nvls_channels=..., nvls_channel_busbw_gbps=...).
"""

from __future__ import annotations

from meshsim.sim.cost.collectives.nccl_limits import generation

NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default on SM90 (NCCL env docs); taken for every generation
REPORTED_NVLS_ALL_REDUCE_BUSBW_GBPS = 470.0  # DGX H100/H200 nccl-tests users, 450-490 GB/s (issue 13)
# per-channel bus bandwidth by NCCL architecture row (nccl_limits.GENERATION_BY_GPU)
NVLS_CHANNEL_BUSBW_GBPS = {
    "hopper": REPORTED_NVLS_ALL_REDUCE_BUSBW_GBPS / NVLS_CHANNELS,
    "blackwell": 2.0 * REPORTED_NVLS_ALL_REDUCE_BUSBW_GBPS / NVLS_CHANNELS,  # assumption: NVLink 5 = 2x
}
DEFAULT_NVLS_GENERATION = "hopper"  # NVLS needs NVSwitch gen 3+: Hopper or later


def nvls_channels(channels: int | None = None) -> int:
    """Channels an NVLS call runs on (NCCL_NVLS_NCHANNELS; `channels` overrides)."""
    return NVLS_CHANNELS if channels is None else channels


def nvls_busbw_cap_gbps(gpu: str, channels: int | None = None, per_channel_gbps: float | None = None) -> float:
    """nvls_channels x per-channel bus bandwidth (GB/s) for a GPU preset name (by NCCL generation)."""
    per = per_channel_gbps
    if per is None:
        per = NVLS_CHANNEL_BUSBW_GBPS.get(generation(gpu), NVLS_CHANNEL_BUSBW_GBPS[DEFAULT_NVLS_GENERATION])
    return nvls_channels(channels) * per
