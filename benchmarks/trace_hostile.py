"""CPU time and peak RSS of `meshsim trace summary` on the costly traces of issue 43, at the issue's sizes.

    python benchmarks/trace_hostile.py [--cases steps,cudnn,blanks,names,valid]

- steps: `--max-events 1` on a 1,000-step trace (one parse; records spilled and split by step window);
- cudnn: one kernel named `cudnn` x 12,000 (a 60 KB name; the cuDNN-attention rule is linear);
- blanks: 300 MiB of blanks inside a ~300 KB gzip;
- names: 360 host operators with distinct 3 MiB names (names are kept to 16,384 characters);
- valid: a valid 150 MB trace (benchmarks/trace_read.py's generator), critical path included.
Each runs in a child process (os.wait4: CPU = user + system). Target: each under 60 s and 1 GB. Not run
by the tests (tests/test_kineto_hostile.py runs the same shapes, smaller).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_read import _measure, write_trace  # noqa: E402

HEAD = ('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "numSms": 132}], '
        '"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "traceEvents": [')
TAIL = '], "traceName": "x"}'


def _step(i: int, name: str = "sm90_xmma_gemm_bf16") -> list[dict]:
    t, c = 1000.0 * i, 10 * i
    return [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1, "ts": t, "dur": 1000.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 10.0,
         "args": {"Input Dims": [[64, 32], [32, 16]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2, "dur": 1.0,
         "args": {"correlation": c + 1}},
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t + 5, "dur": 100.0,
         "args": {"stream": 7, "correlation": c + 1}},
    ]


def _write(path: Path, events: Iterable[dict], blanks: int = 0) -> Path:
    """The trace streamed to disk (nothing large is built here: a child's peak RSS, as os.wait4 reports
    it, starts from this process's size at the fork)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as fh:
        fh.write(HEAD)
        for _ in range(blanks >> 20):
            fh.write(" " * (1 << 20))
        for i, event in enumerate(events):
            fh.write((", " if i else "") + json.dumps(event))
        fh.write(TAIL)
    return path


def _names() -> Iterator[dict]:
    yield from _step(0)
    for i in range(360):
        yield {"ph": "X", "cat": "cpu_op", "name": f"{i:04d}" + "n" * (3 << 20), "pid": 1, "tid": 2, "ts": 10.0 + i,
               "dur": 1.0}


def case_files(tmp: Path) -> dict[str, tuple[Callable[[], Path], list[str]]]:
    return {
        "steps": (lambda: _write(tmp / "steps.json", (e for i in range(1000) for e in _step(i))), ["--max-events", "1"]),
        "cudnn": (lambda: _write(tmp / "cudnn.json", _step(0, "cudnn" * 12_000)), []),
        "blanks": (lambda: _write(tmp / "blanks.json.gz", _step(0), 300 << 20), []),
        "names": (lambda: _write(tmp / "names.json", _names()), []),
        "valid": (lambda: (write_trace(tmp / "valid.json", 150_000_000, False), tmp / "valid.json")[1], []),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="steps,cudnn,blanks,names,valid")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = case_files(Path(tmp))
        for name in args.cases.split(","):
            make, extra = cases[name]
            path = make()
            cmd = [sys.executable, "-m", "meshsim.sim.cli.main", "trace", "summary", str(path), "--no-progress",
                   "--json", str(Path(tmp) / "s.json"), *extra]
            cpu_s, wall_s, rss_mb, rc, err = _measure(cmd, {**os.environ, "COLUMNS": "120"})
            print(f"{name}: {path.stat().st_size / 1e6:,.1f} MB file, exit {rc}, {cpu_s:.1f} s CPU, {wall_s:.1f} s wall "
                  f"(load average {os.getloadavg()[0]:.1f}), peak RSS {rss_mb:,.0f} MB"
                  + (f": {err.strip()[:200]}" if rc else ""))
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
