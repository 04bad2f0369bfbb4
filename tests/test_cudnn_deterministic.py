"""cuDNN's deterministic attention backward (sim/cost/cudnn_deterministic.py): the dense dS workspace, the
dQ matmul and the NaN fill, by hand, and where the compute model uses it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.cudnn_deterministic import (
    deterministic_backward_s,
    dp_workspace_bytes,
    dq_matmul_bytes,
    dq_matmul_flops,
)
from meshsim.sim.schedule.ops import Attention
from meshsim.topologies.gpus import GPUS


def test_workspace_is_dense_and_rounded_to_64():
    """100 positions round to 128: 128 x 128 x 2 bytes; the CI 7B tp4 shape (b 2, 8 heads, 8,192): 2 GiB."""
    assert dp_workspace_bytes(1, 1, 100, 100) == 128 * 128 * 2
    assert dp_workspace_bytes(2, 8, 8192, 8192) == 2 * 2**30
    assert dp_workspace_bytes(1, 2, 64, 65) == 2 * 64 * 128 * 2


def test_dq_matmul_reads_the_workspace_and_k():
    """b 1, 2 query heads, 1 KV head, 100 x 100, d 64: 2 x 2 x 100 x 100 x 64 FLOPs; bytes = workspace
    (2 x 128 x 128 x 2) + K (100 x 64 x 2) + dQ (2 x 100 x 64 x 2)."""
    assert dq_matmul_flops(1, 2, 100, 100, 64) == 2.56e6
    assert dq_matmul_bytes(1, 2, 1, 100, 100, 64) == 65536 + 12800 + 25600


def test_deterministic_backward_closed_form():
    """T 5 s; W = 32,768 B at 32,768 B/s (1 s). Fused: 4 + 1; matmul: max(1.28e6 / 1e6, 58,368 / 32,768 =
    1.78125) + 0.5 launch; fill 1 + 0.5: 8.78125 s, and 7.28125 s without the fill."""
    args = dict(bw_bytes_s=32768.0, gemm_flops_s=1e6, launch_s=0.5)
    assert deterministic_backward_s(5.0, 1, 1, 1, 100, 100, 64, fill=True, **args) == pytest.approx(8.78125)
    assert deterministic_backward_s(5.0, 1, 1, 1, 100, 100, 64, fill=False, **args) == pytest.approx(7.28125)
    # compute-bound matmul once the GEMM rate is low enough: 1.28e6 / 1e5 = 12.8 s
    slow = dict(args, gemm_flops_s=1e5)
    assert deterministic_backward_s(5.0, 1, 1, 1, 100, 100, 64, fill=False, **slow) == pytest.approx(5 + 12.8 + 0.5)


def test_h100_deterministic_backward_runs_the_workspace_path():
    """H100 (cuDNN), the CI 7B tp4 shape: W = 2 GiB at 3,350 GB/s x 0.90; the dQ matmul is memory-bound
    (0.275 TFLOP at 989 x 0.75 TFLOP/s is 0.37 ms, its 2.19 GB take 0.73 ms)."""
    bwd = Attention(batch=2, heads=8, kv_heads=2, seq=8192, head_dim=128, backward=True, deterministic=True,
                    dropout=True)
    plain = replace(bwd, deterministic=False)
    for fill in (False, True):
        h100 = ComputeModel(GPUS["h100-sxm"], fill_uninitialized=fill)
        bw, launch = 3350e9 * 0.90, h100.launch_s
        workspace = 2 * 2**30
        matmul = (workspace + 2 * 2 * 8192 * 128 * 2 + 2 * 8 * 8192 * 128 * 2) / bw + launch
        det = h100.time_s(plain) * 0.8 + workspace / bw + matmul + (workspace / bw + launch if fill else 0.0)
        nondet = h100.time_s(plain)
        if fill:  # the fill model adds dQ, dK, dV's own fill to both
            nondet_kernel = ComputeModel(GPUS["h100-sxm"]).time_s(plain)
            det = nondet_kernel * 0.8 + workspace / bw + matmul + workspace / bw + launch + (nondet - nondet_kernel)
        assert h100.time_s(bwd) == pytest.approx(det, rel=1e-9)
    assert ComputeModel(GPUS["h100-sxm"]).time_s(bwd) > 1.4 * ComputeModel(GPUS["h100-sxm"]).time_s(plain)


def test_fp8_backward_keeps_the_slowdown_knob():
    bwd = Attention(batch=1, heads=8, kv_heads=8, seq=4096, head_dim=128, backward=True, deterministic=True, fp8=True)
    h100 = ComputeModel(GPUS["h100-sxm"])
    kernel = h100.time_s(replace(bwd, deterministic=False)) - h100.launch_s
    assert h100.time_s(bwd) - h100.launch_s == pytest.approx(1.25 * kernel)
