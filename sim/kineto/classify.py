"""Kernel classes: a trace's GPU kernels (or a CPU trace's operators) and the simulator's works in one
vocabulary, so a measured step and a simulated one can be set side by side.

| class | measured: kernel names (case-insensitive) | simulated work |
|---|---|---|
| gemm | *gemm*, cutlass tensorop, nvjet (Hopper cuBLAS), cublas, sgemm / hgemm, splitKreduce; CPU: aten::mm, addmm, bmm, matmul, linear | Gemm |
| attention.flash | flash, fmha, mem-efficient attention; CPU: aten::_scaled_dot_product_*_attention | Attention |
| attention.cudnn | cuDNN fused attention (cudnn + sdpa / flash / fmha, TE's fused attention) | Attention |
| attention.unfused | softmax kernels of an unfused attention (softmax, SoftMax) | (the unfused path's softmax) |
| norm | layer_norm, layernorm, rms_norm, rmsnorm, batch norm (bn_fw / bn_bw) | Elementwise layernorm / layernorm_bwd |
| optimizer | multi_tensor_apply, adam, lamb, sgd | OptimizerStep |
| elementwise | every other compute kernel (elementwise, reductions, copies done by kernels, triton) | other Elementwise |
| conv | convolution kernels (implicit GEMM conv, fprop / dgrad / wgrad of cuDNN) | - |
| collective / p2p | NCCL kernels (HTA's rule: the name starts with nccl or holds ncclKernel), gloo:* spans | Collective / P2P |
| memcpy / memset | cat gpu_memcpy / gpu_memset | - |

Categories: compute = gemm, attention.*, norm, optimizer, elementwise, conv (HTA's COMPUTATION: neither
communication nor memory, hta/common/types.py ComputeKernelGroupingPattern, HolisticTraceAnalysis
f4d0062); comm = collective, p2p; memory = memcpy, memset.
"""

from __future__ import annotations

import re
from functools import lru_cache

from meshsim.sim.schedule.ops import P2P, Attention, Collective, Elementwise, Gemm, OptimizerStep, Work

COMPUTE_CLASSES = ("gemm", "attention.flash", "attention.cudnn", "attention.unfused", "norm", "optimizer",
                   "elementwise", "conv")
COMM_CLASSES = ("collective", "p2p")
MEMORY_CLASSES = ("memcpy", "memset")
CLASSES = COMPUTE_CLASSES + COMM_CLASSES + MEMORY_CLASSES
NORM_KERNELS = frozenset(("layernorm", "layernorm_bwd"))  # the simulator's Elementwise kernels of class norm

_COMM = re.compile(r"(^nccl)|(ncclKernel)|(ncclDevKernel)|(^gloo:)", re.IGNORECASE)  # HTA + gloo spans
_CUDNN = re.compile(r"cudnn", re.IGNORECASE)
_ATTENTION_WORD = re.compile(r"sdpa|flash|fmha|attn|attention", re.IGNORECASE)
_FUSED_ATTN = re.compile(r"fused_attn", re.IGNORECASE)


class _CudnnAttention:
    """The rule `cudnn.*(sdpa|flash|fmha|attn|attention)|fused_attn` (case-insensitive) in linear time: the
    regex backtracks over every `cudnn` of a name (a 60 KB name of 12,000 took 79 s); on each line ('.'
    stops at a newline) the first `cudnn` leaves the longest rest, so one search after it decides.
    tests/test_kineto_hostile.py checks it against the regex on generated names."""

    @staticmethod
    def search(name: str) -> bool:
        for line in name.split("\n") if "\n" in name else (name,):
            found = _CUDNN.search(line)
            if found is not None and _ATTENTION_WORD.search(line, found.end()) is not None:
                return True
        return _FUSED_ATTN.search(name) is not None


_RULES = (  # first match wins; order matters (cuDNN attention before flash, conv before gemm)
    ("attention.cudnn", _CudnnAttention),
    ("attention.flash", re.compile(r"flash|fmha|efficient_attention|scaled_dot_product", re.IGNORECASE)),
    ("conv", re.compile(r"conv|implicit_gemm|ImplicitGemm|fprop|dgrad|wgrad|nchwToNhwc|nhwcToNchw",
                        re.IGNORECASE)),
    ("gemm", re.compile(r"gemm|nvjet|cublas|tensorop_s?\d+|splitKreduce|aten::(mm|addmm|bmm|baddbmm|matmul|"
                        r"linear)$", re.IGNORECASE)),
    ("attention.unfused", re.compile(r"softmax", re.IGNORECASE)),
    ("norm", re.compile(r"layer_?norm|rms_?norm|bn_fw|bn_bw|batch_?norm", re.IGNORECASE)),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|lamb|sgd_", re.IGNORECASE)),
)


def category(cls: str) -> str:
    """compute, comm or memory."""
    if cls in COMM_CLASSES:
        return "comm"
    return "memory" if cls in MEMORY_CLASSES else "compute"


def is_comm_name(name: str) -> bool:
    return _COMM.search(name) is not None


@lru_cache(maxsize=1 << 16)
def kernel_class(name: str, cat: str) -> str:
    """The class of one measured kernel (or CPU operator) by its name and Kineto category (memoized: a
    trace repeats a few hundred names millions of times)."""
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if is_comm_name(name):
        return "collective"
    for cls, rule in _RULES:
        if rule.search(name):
            return cls
    return "elementwise"


def work_class(work: Work, attention: str = "attention.flash") -> str:
    """The class of a simulated work (`attention`: the class a fused attention core is counted in)."""
    if isinstance(work, Gemm):
        return "gemm"
    if isinstance(work, Attention):
        return attention
    if isinstance(work, Elementwise):
        return "norm" if work.kernel in NORM_KERNELS else "elementwise"
    if isinstance(work, OptimizerStep):
        return "optimizer"
    if isinstance(work, P2P):
        return "p2p"
    if isinstance(work, Collective):
        return "collective"
    raise TypeError(f"unknown work {work!r}")


def family(cls: str) -> str:
    """attention.flash -> attention (the simulator prices every attention core alike)."""
    return cls.split(".", 1)[0]
