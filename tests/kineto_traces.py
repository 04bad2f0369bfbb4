"""Small synthetic Kineto traces for the trace-reader tests, written the way torch.profiler writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "kineto"
TWO_RANK = DATA / "a100-2rank-nccl.json.gz"
SIXTEEN_RANK = DATA / "a100-80gb-16rank-rank0.json.gz"


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, **args) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


def runtime(ts: float, dur: float, corr: int, tid: int = 1, name: str = "cudaLaunchKernel") -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def cpu_op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": args}


def nccl(ts: float, dur: float, corr: int, nelems: int, group: int = 2, op: str = "allreduce") -> dict:
    return kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", ts, dur,
                  corr, stream=20, **{"Collective name": op, "In msg nelems": nelems, "Out msg nelems": nelems,
                                      "Group size": group, "dtype": "Float", "Process Group Ranks": "[0, 1]"})


def document(events: list[dict], rank: int = 0, world: int = 2) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "numSms": 132}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": events,
            "traceName": "x", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1}


def write(path: Path, doc: dict, gz: bool = False) -> Path:
    text = json.dumps(doc)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def one_step(offset_us: float = 0.0, rank: int = 0) -> dict:
    """ProfilerStep#1 of 1000 us: a GEMM (aten::mm [64,32] x [32,16]) launched at 2 us, running 5-105;
    a 4 MiB all-reduce 200-700 on stream 20 overlapping a norm kernel 300-400."""
    o = offset_us
    events = [
        cpu_op("ProfilerStep#1", o, 1000.0, cat="user_annotation"),
        cpu_op("aten::mm", o + 0.0, 10.0, **{"Input Dims": [[64, 32], [32, 16]], "Input type": ["float", "float"]}),
        runtime(o + 2.0, 1.0, 11),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", o + 5.0, 100.0, 11),
        cpu_op("nccl:all_reduce", o + 150.0, 20.0, cat="user_annotation"),
        runtime(o + 160.0, 1.0, 12),
        nccl(o + 200.0, 500.0, 12, 1 << 20),
        cpu_op("aten::native_layer_norm", o + 250.0, 5.0),
        runtime(o + 251.0, 1.0, 13),
        kernel("void at::native::vectorized_layer_norm_kernel<float>", o + 300.0, 100.0, 13),
    ]
    return document(events, rank=rank)
