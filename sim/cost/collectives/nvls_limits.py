"""NVLS's own limit: its kernel's loop over chunks, not only the NVLink ports.

The NVLS plan (nvls.py) streams every GPU's data through the NVSwitch, so on links alone a DGX H100
all-reduce would reach 2(n-1)/n x 18 x 20.6 = 649 GB/s of bus bandwidth; nccl-tests reaches ~470 at the
largest sizes and much less on the ramp (public-measurements-2.md section B: 8 x H100, NCCL 2.18.5,
234 GB/s at 16 MiB, 362 at 64 MiB, 401 at 128 MiB). What NCCL runs (NVIDIA/nccl v2.18.5-1 / v2.20.5-1):

- channels: NCCL_NVLS_NCHANNELS = 16 on Hopper (src/transport/nvls.cc), one CTA each (src/enqueue.cc,
  "NVLS should not need more than 16 channels to get peak BW"); 24 on Blackwell in one NVLink domain
  (v2.30.4, NVLS_NCHANNELS_SM100_NVL);
- heads: the NVLS graph has one channel per GPU of the node (src/graph/search.cc, "NVLS channels
  correspond to GPUs pulling from NVLS"), so nHeads = the group's ranks on one node;
- chunk: enqueue.cc (computeColl / computeCollChunkInfo) starts at 128 KiB and, with
  ops = channels x heads, drops to 64 KiB below 64 x ops x 128 KiB (1 GiB on 8 GPUs), to 32 KiB below
  8 x ops x 64 KiB (64 MiB), to 16 KiB below 2 x ops x 32 KiB (8 MiB);
- loop: a channel moves heads x chunk bytes per loop (src/device/all_reduce.h, NVLS: loopSize =
  nChannels x nHeads x chunkSize), through three warp groups in a pipeline: scatter into the heads'
  buffers, reduce-and-multicast (multimem.ld_reduce / multimem.st) on each head, gather out.

So the kernel's time is a pipeline of loops, each paying a fixed synchronization cost per step (the
flag handshakes and fences between the warp groups, like NCCL's per-step latency of its Simple protocol,
3.4-4 us on NVLink in tuning.cc) plus its data at the channels' rate, and filling in two loop times
(three stages):

    loops     = ceil(nbytes / (channels x heads x chunk(nbytes)))
    kernel_s  = (loops + 2) x (loop_overhead + port_bytes / loops / (channels x per_channel))
    time      = NVLS latency + max(link time (nvls.py, at the NVLink efficiency), kernel_s)

port_bytes = nbytes x the busier direction's fraction (nvls.port_fractions: all-reduce 1,
all-gather / reduce-scatter (n-1)/n). The link time and the kernel's overlap: when the links bind (the
400 GB/s export parts), the loop overheads hide behind the transfers.

Three constants are **fitted** on the 8 x H100 curve of section B from 2 MiB to 8 GiB
(benchmarks/accuracy/fits.yaml): NVLS latency 12 us (protocols.HW_US, its one step per call: launch
and a switch round trip; tuning.cc's NVLS latency is 23 us in v2.18-2.20), loop overhead 4.4 us, per-channel 18.75 GB/s (16 channels: 300 GB/s
of port traffic). The 8 x H200 curve (NCCL 2.20.5) and FLUX's H800 NVLS all-gather / reduce-scatter are
out of fit. Blackwell's 24 channels carry 430 GB/s, fitted on the two-rack GB200 NVL72 curve (issue 42,
the only Blackwell NVLS curve we have; NCCL's ratios from Hopper gave 508, 17-19% fast there), so a
72-GPU NVL72 all-reduce reaches ~820 GB/s of busbw at 16 GiB. Overridable: NcclConstants(nvls_channels=...,
nvls_channel_gbps=..., nvls_loop_overhead_us=...).
"""

from __future__ import annotations

import math

from meshsim.sim.cost.collectives.nccl_limits import generation
from meshsim.sim.cost.collectives.nvls import port_fractions

# NCCL_NVLS_NCHANNELS defaults (src/transport/nvls.cc: 16 on SM90 since v2.18; v2.30.4 NVLS_NCHANNELS_SM100_NVL
# = 24 on SM100 inside one NVLink domain), by NCCL architecture row (nccl_limits.GENERATION_BY_GPU)
NVLS_CHANNELS = {"hopper": 16, "blackwell": 24}
NVLS_PIPELINE_FILL_LOOPS = 2  # three warp-group stages (scatter, reduce/multicast, gather): two loops to fill
NVLS_LOOP_OVERHEAD_US = 4.4  # fitted, 8 x H100 section-B curve
HOPPER_NVLS_GBPS = 300.0  # fitted, same curve: port traffic of all 16 channels (18.75 GB/s each)
# Blackwell: fitted (issue 42) on the only Blackwell NVLS curve in our set, the all-reduce over two GB200 NVL72
# racks (public-measurements-3.md section 3, 512 MiB-16 GiB; NVLS tree, nvls_tree_limits.py), 430 GB/s of
# port traffic per GPU over one rack's 24 channels. Hopper's 300 scaled by NCCL's own figures (NVLink 40.1 /
# 20.6 per link, topo.h; nvlsEfficiency 0.74 / 0.85, tuning.cc) gave 508, 17-19% fast on that curve.
BLACKWELL_NVLS_GBPS = 430.0
NVLS_CHANNEL_GBPS = {"hopper": HOPPER_NVLS_GBPS / NVLS_CHANNELS["hopper"],
                     "blackwell": BLACKWELL_NVLS_GBPS / NVLS_CHANNELS["blackwell"]}
DEFAULT_NVLS_GENERATION = "hopper"  # NVLS needs NVSwitch gen 3+: Hopper or later
NVLS_MAX_CHUNK_BYTES = 128 * 1024
# enqueue.cc: (below this many x channels x heads x chunk, use the smaller chunk)
NVLS_CHUNK_STEPS = ((64, 64 * 1024), (8, 32 * 1024), (2, 16 * 1024))


def _row(gpu: str) -> str:
    gen = generation(gpu)
    return gen if gen in NVLS_CHANNELS else DEFAULT_NVLS_GENERATION


def nvls_generation(gpu: str) -> str:
    """NCCL's NVLS row for a GPU preset: "hopper" or "blackwell" (Hopper for anything older)."""
    return _row(gpu)


def nvls_channels(gpu: str, channels: int | None = None) -> int:
    """Channels an NVLS call runs on (NCCL_NVLS_NCHANNELS by generation; `channels` overrides)."""
    return NVLS_CHANNELS[_row(gpu)] if channels is None else channels


def shrunk_chunk_bytes(nbytes: int, ops: int, chunk: int, steps: tuple[tuple[int, int], ...]) -> int:
    """enqueue.cc's rule for NVLS and NVLS-tree chunks: in turn for each (factor, smaller) of `steps`, the
    chunk becomes `smaller` while nbytes < factor x ops x chunk (ops = channels x heads)."""
    for factor, smaller in steps:
        if nbytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_chunk_bytes(nbytes: int, channels: int, heads: int) -> int:
    """enqueue.cc's NVLS chunk size for a call of nbytes (module doc)."""
    return shrunk_chunk_bytes(nbytes, channels * heads, NVLS_MAX_CHUNK_BYTES, NVLS_CHUNK_STEPS)


def nvls_kernel_s(gpu: str, op: str, nbytes: int, ranks: int, channels: int | None = None,
                  per_channel_gbps: float | None = None, loop_overhead_us: float | None = None) -> float:
    """The NVLS kernel's own time for nbytes (module doc), without its latency and its links."""
    if nbytes <= 0 or ranks < 2:
        return 0.0
    nch = nvls_channels(gpu, channels)
    per = NVLS_CHANNEL_GBPS[_row(gpu)] if per_channel_gbps is None else per_channel_gbps
    overhead_s = (NVLS_LOOP_OVERHEAD_US if loop_overhead_us is None else loop_overhead_us) * 1e-6
    loops = math.ceil(nbytes / (nch * ranks * nvls_chunk_bytes(nbytes, nch, ranks)))
    port_bytes = nbytes * max(port_fractions(op, ranks))
    per_loop_s = overhead_s + port_bytes / loops / (nch * per * 1e9)
    return (loops + NVLS_PIPELINE_FILL_LOOPS) * per_loop_s


def nvls_port_gbps(gpu: str, channels: int | None = None, per_channel_gbps: float | None = None) -> float:
    """The NVLS kernel's port traffic per GPU (GB/s): one node's channels x per-channel rate (overridable)."""
    per = NVLS_CHANNEL_GBPS[_row(gpu)] if per_channel_gbps is None else per_channel_gbps
    return nvls_channels(gpu, channels) * per
