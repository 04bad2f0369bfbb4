"""Does an overlapped gloo collective slow the compute, or does the compute defer the collective?

Two processes pinned one per core (as benchmarks/validate_cpu.py runs them), one torch thread each. Per
round, after a barrier: n GEMMs alone (g), the all-reduce alone (c), then the all-reduce issued async
with the same n GEMMs behind it, timing when the GEMMs end (before the wait) and when the collective
has ended (after it). Printed per n: min and median over rounds, and the mean of c (the statistic
`meshsim calibrate` writes into collective_table). docs/validate.md section 7 reads the figures.

    python benchmarks/kappa_overlap.py [--rounds 40] [--kib 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GEMM = (512, 256, 384)  # m, k, n: ~1 ms on one core of the project machine
COUNTS = (1, 2, 4, 8)


def _round(n: int, a, b, x) -> tuple[float, float, float, float]:
    dist.barrier()
    t = time.perf_counter()
    for _ in range(n):
        torch.mm(a, b)
    g = time.perf_counter() - t
    dist.barrier()
    t = time.perf_counter()
    dist.all_reduce(x)
    c = time.perf_counter() - t
    dist.barrier()
    t = time.perf_counter()
    handle = dist.all_reduce(x, async_op=True)
    for _ in range(n):
        torch.mm(a, b)
    gemms_end = time.perf_counter() - t
    handle.wait()
    return g, c, gemms_end, time.perf_counter() - t


def _lines(n: int, samples: list[tuple[float, ...]]) -> list[str]:
    cols = list(zip(*samples, strict=True))
    out = []
    for name, f in (("min", min), ("median", statistics.median)):
        g, c, end, both = (f(v) * 1e3 for v in cols)
        out.append(f"n={n} {name:6s} g {g:6.3f}  c {c:6.3f}  overlapped: GEMMs end {end:6.3f} ({end - g:+.3f}), "
                   f"collective {both:6.3f} ({both - end:+.3f} after the GEMMs) ms")
    out.append(f"n={n} mean c {statistics.fmean(cols[1]) * 1e3:.3f} ms")
    return out


def worker(rank: int, port: int, rounds: int, kib: int, out: str) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    m, k, n_cols = GEMM
    a, b, x = torch.randn(m, k), torch.randn(k, n_cols), torch.randn(kib * 256)
    lines = []
    for n in COUNTS:
        lines += _lines(n, [_round(n, a, b, x) for _ in range(rounds)])
    if rank == 0:
        Path(out).write_text("\n".join(lines) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--kib", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.txt")
        mp.spawn(worker, args=(29611, args.rounds, args.kib, out), nprocs=2)
        print(Path(out).read_text(), end="")


if __name__ == "__main__":
    main()
