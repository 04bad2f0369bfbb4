"""Split-K (sim/cost/gemm_efficiency.py): a GEMM with fewer tiles than SMs splits k over the idle SMs and
pays an fp32 partial per split plus a reduction, bounded by Transformer Engine's cuBLASLt workspace.
Closed forms by hand on 132 SMs, one 128 x 128 tile, k_fill 300."""

from __future__ import annotations

import pytest

from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.gemm_efficiency import (
    WORKSPACE_BYTES_OLDER,
    WORKSPACE_BYTES_SM90,
    cublas_workspace_bytes,
    gemm_efficiency,
    k_tile,
    split_count_limit,
)
from meshsim.sim.schedule.ops import Gemm
from meshsim.topologies.gpus import GPUS

TILE = ((128, 128),)
REF = (4096 / 4224) * (8192 / 8492)  # 8192^3: 4,096 tiles in 32 waves of 132, k 8192 against k_fill 300


def _eff(m: int, n: int, k: int, workspace: int) -> float:
    return gemm_efficiency(m, n, k, ceiling=0.75, tiles=TILE, sm_count=132, k_fill=300.0,
                           workspace_bytes=workspace)


def test_te_workspace_is_32_mib_on_hopper_and_4_mib_before():
    assert cublas_workspace_bytes((9, 0)) == cublas_workspace_bytes((10, 0)) == 32 * 2**20 + 1024
    assert cublas_workspace_bytes((8, 0)) == cublas_workspace_bytes((7, 0)) == 4 * 2**20
    # 1024 x 1024 x 16384: 64 tiles -> at most ceil(132 / 64) = 3 splits; 4 MiB holds one fp32 partial
    assert split_count_limit(1024, 1024, 16384, 1, 64, 132, WORKSPACE_BYTES_SM90) == 3
    assert split_count_limit(1024, 1024, 16384, 1, 64, 132, WORKSPACE_BYTES_OLDER) == 1
    assert split_count_limit(1024, 1024, 512, 1, 64, 132, WORKSPACE_BYTES_SM90) == 2  # k // 256


def test_split_k_golden():
    """s = 1: 64 / 132 x 16384 / 16684 = 0.47613. s = 2: 128 tiles (128 / 132), slices of 8192 with a 4-byte
    partial (k_fill 600): main 0.903521; reduction (4 x 2 + 2) x 300 / (2 x 16384) = 0.091553; 1 / (1 / main +
    r) = 0.834492. s = 3: 192 tiles in two waves (192 / 264), slices of 5462: 0.604447. Best: s = 2."""
    s1 = (64 / 132) * 16384 / 16684
    main2 = (128 / 132) * 8192 / 8792
    s2 = 1.0 / (1.0 / main2 + 10 * 300 / (2 * 16384))
    main3 = (192 / 264) * (5462 / 6062) * 16384 / (3 * 5462)
    s3 = 1.0 / (1.0 / main3 + 14 * 300 / (2 * 16384))
    assert s2 == pytest.approx(0.834492, abs=1e-6) and s3 == pytest.approx(0.604447, abs=1e-6)
    assert _eff(1024, 1024, 16384, WORKSPACE_BYTES_SM90) == pytest.approx(0.75 * s2 / REF, rel=1e-12)
    # negative control: A100's 4 MiB cannot hold two partials, so the kernel stays unsplit
    assert _eff(1024, 1024, 16384, WORKSPACE_BYTES_OLDER) == pytest.approx(0.75 * s1 / REF, rel=1e-12)
    assert _eff(1024, 1024, 16384, 0) == _eff(1024, 1024, 16384, WORKSPACE_BYTES_OLDER)


def test_many_tiles_never_split():
    """Training shapes have thousands of tiles: identical with and without a workspace."""
    for m, n, k in ((8192, 8192, 8192), (4096, 2304, 16384), (16384, 1024, 4096), (4096, 13312, 16384)):
        assert _eff(m, n, k, WORKSPACE_BYTES_SM90) == _eff(m, n, k, 0)


def test_compute_model_splits_a_small_wide_k_gemm_on_h100():
    """A 512 x 512 output with k 8192 (a router- or small-expert-sized wgrad) on an H100 runs split."""
    h100 = ComputeModel(GPUS["h100-sxm"])
    g = Gemm(512, 512, 8192)
    unsplit = gemm_efficiency(512, 512, 8192, ceiling=0.75, sm_count=132, k_fill=989e3 / 3350, workspace_bytes=0)
    assert h100.gemm_efficiency(g) > 3 * unsplit


def test_k_quantization_pays_the_last_mainloop_step_whole():
    """k 240 in 64-deep steps runs 256: 240 / 256 of the unquantized factor; k 192 is three whole steps."""
    base = dict(ceiling=0.75, tiles=TILE, sm_count=132, k_fill=300.0)
    assert (gemm_efficiency(8192, 8192, 240, tile_k=64, **base) / gemm_efficiency(8192, 8192, 240, **base)
            == pytest.approx(240 / 256, rel=1e-12))
    assert gemm_efficiency(8192, 8192, 192, tile_k=64, **base) == gemm_efficiency(8192, 8192, 192, **base)
    assert gemm_efficiency(8192, 8192, 8192, tile_k=64, **base) == pytest.approx(0.75, rel=1e-12)


def test_k_tile_is_128_bytes_of_values():
    """16-bit 64, FP8 128, FP4 256: an FP8 GEMM with k 192 pays 192 / 256, its 16-bit twin nothing."""
    assert (k_tile(2.0), k_tile(1.0), k_tile(0.5)) == (64, 128, 256)
    h100 = ComputeModel(GPUS["h100-sxm"])
    k_fill_fp8 = 1979e3 / 3350
    ref = gemm_efficiency(8192, 8192, 192, ceiling=0.62, sm_count=132, k_fill=k_fill_fp8)
    assert h100.gemm_efficiency(Gemm(8192, 8192, 192, fp8=True)) == pytest.approx(ref * 192 / 256, rel=1e-12)
