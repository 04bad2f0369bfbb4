"""NVLS's own limit: its kernel's loop over chunks, not only the NVLink ports.

The NVLS plan (nvls.py) streams every GPU's data through the NVSwitch, so on links alone a DGX H100
all-reduce would reach 2(n-1)/n x 18 x 20.6 = 649 GB/s of bus bandwidth; nccl-tests reaches ~470 at the
largest sizes and much less on the ramp (public-measurements-2.md section B: 8 x H100, NCCL 2.18.5,
234 GB/s at 16 MiB, 362 at 64 MiB, 401 at 128 MiB). What NCCL runs (NVIDIA/nccl v2.18.5-1 / v2.20.5-1):

- channels: NCCL_NVLS_NCHANNELS = 16 (src/transport/nvls.cc), one CTA each (src/enqueue.cc,
  "NVLS should not need more than 16 channels to get peak BW");
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
out of fit. Blackwell's NVLink 5 doubles the per-link rate; its per-channel figure is taken as twice
Hopper's (assumption, no public figure). Overridable: NcclConstants(nvls_channels=...,
nvls_channel_gbps=..., nvls_loop_overhead_us=...).
"""

from __future__ import annotations

import math

from meshsim.sim.cost.collectives.nccl_limits import generation
from meshsim.sim.cost.collectives.nvls import port_fractions

NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default (src/transport/nvls.cc); taken for every generation
NVLS_PIPELINE_FILL_LOOPS = 2  # three warp-group stages (scatter, reduce/multicast, gather): two loops to fill
NVLS_LOOP_OVERHEAD_US = 4.4  # fitted, 8 x H100 section-B curve
# per-channel GB/s of a GPU's busier switch-port direction, by NCCL architecture row (fitted on Hopper)
NVLS_CHANNEL_GBPS = {"hopper": 18.75, "blackwell": 2.0 * 18.75}  # Blackwell: NVLink 5 = 2x per link (assumption)
DEFAULT_NVLS_GENERATION = "hopper"  # NVLS needs NVSwitch gen 3+: Hopper or later
NVLS_MAX_CHUNK_BYTES = 128 * 1024
# enqueue.cc: (below this many x channels x heads x chunk, use the smaller chunk)
NVLS_CHUNK_STEPS = ((64, 64 * 1024), (8, 32 * 1024), (2, 16 * 1024))


def nvls_channels(channels: int | None = None) -> int:
    """Channels an NVLS call runs on (NCCL_NVLS_NCHANNELS; `channels` overrides)."""
    return NVLS_CHANNELS if channels is None else channels


def nvls_chunk_bytes(nbytes: int, channels: int, heads: int) -> int:
    """enqueue.cc's NVLS chunk size for a call of nbytes (module doc)."""
    chunk = NVLS_MAX_CHUNK_BYTES
    ops = channels * heads
    for factor, smaller in NVLS_CHUNK_STEPS:
        if nbytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_kernel_s(gpu: str, op: str, nbytes: int, ranks: int, channels: int | None = None,
                  per_channel_gbps: float | None = None, loop_overhead_us: float | None = None) -> float:
    """The NVLS kernel's own time for nbytes (module doc), without its latency and its links."""
    if nbytes <= 0 or ranks < 2:
        return 0.0
    nch = nvls_channels(channels)
    per = per_channel_gbps
    if per is None:
        per = NVLS_CHANNEL_GBPS.get(generation(gpu), NVLS_CHANNEL_GBPS[DEFAULT_NVLS_GENERATION])
    overhead_s = (NVLS_LOOP_OVERHEAD_US if loop_overhead_us is None else loop_overhead_us) * 1e-6
    loops = math.ceil(nbytes / (nch * ranks * nvls_chunk_bytes(nbytes, nch, ranks)))
    port_bytes = nbytes * max(port_fractions(op, ranks))
    per_loop_s = overhead_s + port_bytes / loops / (nch * per * 1e9)
    return (loops + NVLS_PIPELINE_FILL_LOOPS) * per_loop_s
