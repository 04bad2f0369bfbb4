"""Speed and peak memory of `meshsim trace summary` on a large synthetic Kineto trace (default 1 GB).

    python benchmarks/trace_read.py [--mb 1000] [--gz] [--critical-path] [--keep PATH] [--reuse PATH]
                                    [--max-events N] [--backend compiled|yajl2_c|python ...]

The trace is written the way torch.profiler writes one (cpu_op / cuda_runtime / kernel / flow events
with correlation ids, `Input Dims` on GEMM operators, NCCL args on collective kernels, one
ProfilerStep#N per 2,000 kernels), streamed to disk. `meshsim trace summary --json` then runs in a child
process, once per parser named (`--backend yajl2_c compiled`: the reference and the compiled reader on the
same file, one after the other; their JSON summaries are compared byte for byte); printed: its CPU time (user + system, os.wait4: the machine is shared, so wall time measures
the neighbours too), MB of JSON per CPU-second, wall time and peak RSS. Targets (issue 43): >= 50 MB/s,
a 1 GB trace in <= 30 s, <= 500 MB RSS. Not run by the tests.

Parsers: "compiled" (the default when the optional extension sim/kineto/_collect.pyx is built by setup.py:
`pip install -e .` with a C compiler), "yajl2_c" (the reference: ijson's C parser and the Python
collector), "python" (json's decoder, without ijson). Before and after, on one file, in one command:
    python benchmarks/trace_read.py --keep /tmp/t1g.json --backend yajl2_c compiled
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNELS_PER_STEP = 2000


def _step_events(step: int, t0: float, corr0: int) -> tuple[list[dict], float, int]:
    """One step: per kernel a cpu op, its launch and the kernel; every 20th kernel an NCCL all-reduce."""
    out = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t0,
            "dur": KERNELS_PER_STEP * 12.0, "args": {"External id": corr0}}]
    t, corr = t0, corr0
    for i in range(KERNELS_PER_STEP):
        corr += 1
        comm = i % 20 == 19
        op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 8.0,
              "args": {"External id": corr, "Record function id": 0, "Sequence number": corr,
                       "Input Dims": [[4096, 4096], [4096, 1024]], "Input type": ["c10::BFloat16"] * 2}}
        launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2,
                  "dur": 4.0, "args": {"External id": corr, "cbid": 211, "correlation": corr}}
        args = {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 20 if comm else 7,
                "correlation": corr, "registers per thread": 128, "shared memory": 98304, "grid": [132, 1, 1],
                "block": [384, 1, 1], "est. achieved occupancy %": 12}
        if comm:
            args.update({"Collective name": "allreduce", "In msg nelems": 1 << 22, "Out msg nelems": 1 << 22,
                         "Group size": 8, "dtype": "BFloat16", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"})
        name = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)" if comm else
                "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off")
        kernel = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": args["stream"], "ts": t + 10,
                  "dur": 9.5, "args": args}
        flow = {"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": t + 2, "cat": "ac2g", "name": "ac2g"}
        out += [op, launch, kernel, flow]
        t += 12.0
    return out, t, corr


def write_trace(path: Path, target_bytes: int, gz: bool) -> tuple[int, int]:
    """Write steps until the file holds ~target_bytes of JSON; (events, steps)."""
    opener = gzip.open if gz else open
    written, events, step, t, corr = 0, 0, 0, 1.7e15, 0
    with opener(path, "wt") as fh:
        head = '{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}], '
        head += '"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}, "traceEvents": ['
        fh.write(head)
        written += len(head)
        first = True
        while written < target_bytes:
            batch, t, corr = _step_events(step, t, corr)
            text = ("" if first else ", ") + ", ".join(json.dumps(e) for e in batch)
            fh.write(text)
            written += len(text)
            events += len(batch)
            step, first = step + 1, False
        fh.write('], "traceName": "synthetic", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1}')
    return events, step


def _json_bytes(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    with gzip.open(path) as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b""))


def _measure(cmd: list[str], env: dict) -> tuple[float, float, float, int, str]:
    """(CPU s, wall s, peak RSS MB, exit status, stderr) of one child process."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return (usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024, proc.returncode,
                err.read().decode(errors="replace"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=1000.0, help="size of the JSON text (MB, 1e6 bytes)")
    parser.add_argument("--reuse", type=Path, help="read this trace (written by --keep) instead of writing one")
    parser.add_argument("--backend", choices=("compiled", "yajl2_c", "python"), nargs="+", default=[None],
                        help="the trace parsers to time, in turn (default: meshsim's own choice)")
    parser.add_argument("--gz", action="store_true", help="write it gzip-compressed")
    parser.add_argument("--critical-path", action="store_true", help="also compute HTA's critical path per step")
    parser.add_argument("--keep", type=Path, help="write the trace here and keep it")
    parser.add_argument("--max-events", type=int, help="meshsim trace summary --max-events (default: its own)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.reuse or args.keep or Path(tmp) / ("trace.json.gz" if args.gz else "trace.json")
        if args.reuse is None:
            t = time.perf_counter()
            events, steps = write_trace(path, int(args.mb * 1e6), args.gz)
            print(f"wrote {path.stat().st_size / 1e6:,.0f} MB ({events:,} events, {steps} steps) in "
                  f"{time.perf_counter() - t:.1f} s")
        json_mb = _json_bytes(path) / 1e6
        outputs = []
        for backend in args.backend:
            out = Path(tmp) / f"summary-{len(outputs)}.json"
            cmd = [sys.executable, "-m", "meshsim.sim.cli.main", "trace", "summary", str(path), "--no-progress",
                   "--json", str(out)]
            if not args.critical_path:
                cmd.append("--no-critical-path")
            if args.max_events:
                cmd += ["--max-events", str(args.max_events)]
            env = {**os.environ, "COLUMNS": "120"}
            if backend:
                env["MESHSIM_TRACE_PARSER"] = backend
            cpu_s, wall_s, rss_mb, rc, err = _measure(cmd, env)
            if rc:
                print(err.strip())
                return rc
            print(f"meshsim trace summary ({'with' if args.critical_path else 'without'} the critical path, parser "
                  f"{backend or 'default'}): {json_mb:,.0f} MB of JSON in {cpu_s:.1f} s CPU = {json_mb / cpu_s:.1f} "
                  f"MB/s; {wall_s:.1f} s wall (load average {os.getloadavg()[0]:.1f}); peak RSS {rss_mb:,.0f} MB",
                  flush=True)
            outputs.append(out.read_bytes())
        if len(outputs) > 1:
            same = all(o == outputs[0] for o in outputs)
            print(f"JSON summaries {'byte-identical' if same else 'DIFFER'} across parsers {', '.join(args.backend)}")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
