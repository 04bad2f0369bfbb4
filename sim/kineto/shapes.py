"""A GEMM's (m, n, k, batch) from the `Input Dims` of the operator that launched it (record_shapes=True).

meshsim's Gemm is C[m, n] = A[m, k] B[k, n], `batch` copies (sim/schedule/ops.py). PyTorch's operators:
- aten::mm(A[M,K], B[K,N]); aten::addmm(bias, A[M,K], B[K,N]): (M, N, K, 1)
- aten::bmm(A[b,M,K], B[b,K,N]); aten::baddbmm(bias, A, B): (M, N, K, b)
- aten::matmul(A[..., M, K], B[K, N]): (prod(...) M, N, K, 1); with a batched B[..., K, N]: batch = prod(...)
- aten::linear(X[..., K], W[N, K]): (prod(...), N, K, 1)
Anything else (Transformer Engine's own GEMM ops record no dims) gives None: the GEMM is counted, its
efficiency is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import prod
from typing import NamedTuple


class GemmShape(NamedTuple):
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def label(self) -> str:
        head = f"{self.batch}x" if self.batch > 1 else ""
        return f"{head}{self.m}x{self.n}x{self.k}"


MAX_EXTENT = 1 << 53  # a GEMM's m, n, k or batch above this is not a recorded shape (its FLOPs overflow)


def _tensor(dims: object) -> tuple[int, ...] | None:
    if isinstance(dims, tuple) and dims and all(type(d) is int and 0 < d <= MAX_EXTENT for d in dims):
        return dims
    return None


def _bounded(shape: GemmShape | None) -> GemmShape | None:
    return shape if shape is not None and max(shape) <= MAX_EXTENT else None


def _pair(a: Sequence[int], b: Sequence[int]) -> GemmShape | None:
    """matmul semantics of A[..., M, K] @ B[..., K, N]."""
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    if len(b) == 2:
        return GemmShape(prod(a[:-1]), b[-1], a[-1], 1)
    return GemmShape(a[-2], b[-1], a[-1], prod(b[:-2]))


@lru_cache(maxsize=1 << 16)
def gemm_shape(op_name: str, dims: tuple) -> GemmShape | None:
    """(m, n, k, batch) of the GEMM operator `op_name` with recorded `Input Dims` (module docstring;
    memoized: a step repeats its shapes); None when not a GEMM's or any extent is above MAX_EXTENT."""
    return _bounded(_gemm_shape(op_name, dims))


def _gemm_shape(op_name: str, dims: tuple) -> GemmShape | None:
    tensors = [_tensor(d) for d in dims]
    short = op_name.split("::")[-1]
    if short in ("mm", "bmm", "matmul") and len(tensors) >= 2 and tensors[0] and tensors[1]:
        return _pair(tensors[0], tensors[1])
    if short in ("addmm", "baddbmm", "addbmm") and len(tensors) >= 3 and tensors[1] and tensors[2]:
        return _pair(tensors[1], tensors[2])
    if short == "linear" and len(tensors) >= 2 and tensors[0] and tensors[1] and len(tensors[1]) == 2:
        x, w = tensors[0], tensors[1]
        if x[-1] == w[1]:
            return GemmShape(prod(x[:-1]), w[0], w[1], 1)
    return None
