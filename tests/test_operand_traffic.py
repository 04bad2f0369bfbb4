"""HBM operand traffic of a persistent sm_90 GEMM under CUTLASS's raster heuristic (benchmarks/operand_traffic.py,
the what-if of benchmarks/accuracy_gemm_shape.py): golden numbers by hand, and the one-wave / fits-in-L2 limits."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from operand_traffic import operand_traffic_bytes, wave_panels  # noqa: E402

TILE = {"tile_m": 128, "tile_n": 256}


def traffic(m, n, k, batch=1, *, sms, l2=0.0, out=2):
    return operand_traffic_bytes(m, n, k, batch, **TILE, sm_count=sms, l2_bytes=l2, value_bytes=2, out_bytes=out)


def test_wave_panels_counts_each_batch_apart():
    """Tiles 0..5 of a raster with 3 minor panels and 6 tiles per batch: majors 0, 1; minors 0, 1, 2.
    Tiles 4..7 across two batches of 6: batch 0 holds 4, 5 (major 1, minors 1, 2), batch 1 holds 6, 7
    (major 0, minors 0, 1): 2 majors, 4 minors."""
    assert wave_panels(0, 6, 3, 6) == (2, 3)
    assert wave_panels(4, 8, 3, 6) == (2, 4)


def test_raster_along_m_rereads_a_per_wave():
    """m 256, n 1024, k 64 in 128 x 256 tiles: 2 tile rows, 4 tile columns, more columns than rows, so the
    raster runs along M. 8 tiles on 4 SMs: two waves, each of both A row panels (128 x 64 x 2 B = 16 KiB)
    and two B column panels (64 x 256 x 2 B = 32 KiB). A: 4 x 16 KiB, B: 4 x 32 KiB, C: 256 x 1024 x 2."""
    assert traffic(256, 1024, 64, sms=4) == 4 * 16384 + 4 * 32768 + 256 * 1024 * 2 == 720896


def test_raster_along_n_rereads_b_per_wave():
    """m 1024, n 256: 8 tile rows, 1 column, along N. Two waves of 4 tiles: each reads 4 A panels and the one
    B panel. A: 8 x 16 KiB, B: 2 x 32 KiB, C: 1024 x 256 x 2."""
    assert traffic(1024, 256, 64, sms=4) == 8 * 16384 + 2 * 32768 + 1024 * 256 * 2


def test_an_operand_that_fits_in_half_the_l2_is_read_once():
    """The first case with a 1 GB L2: A 256 x 64 x 2 and B 1024 x 64 x 2 once, C as before."""
    assert traffic(256, 1024, 64, sms=4, l2=1e9) == 256 * 64 * 2 + 1024 * 64 * 2 + 256 * 1024 * 2 == 688128


def test_batches_keep_their_own_panels():
    """Three one-tile batches on 2 SMs: waves {0, 1} and {2}; each batch's A and B panel read once; the
    accumulating C (4 bytes) of all three."""
    assert traffic(128, 256, 64, 3, sms=2, out=4) == 3 * 16384 + 3 * 32768 + 4 * 128 * 256 * 3


def test_flux_h800_shape():
    """4096 x 6144 x 12288 on 132 SMs with H100's 50 MiB: 32 tile rows, 24 columns, along N; 768 tiles in 6
    waves, each spanning all 24 B panels (12288 x 256 x 2 B; B read 6 times) and 6, 6, 6, 6, 6, 5 A row panels
    (128 x 12288 x 2 B), so 6 x 151 MB + 35 x 3 MiB + the 50 MB fp16 C."""
    b = 6 * 12288 * 6144 * 2
    a = 35 * 128 * 12288 * 2
    c = 4096 * 6144 * 2
    assert traffic(4096, 6144, 12288, sms=132, l2=50 * 2**20) == a + b + c == 1_066_401_792


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2048), st.integers(1, 2048), st.integers(1, 512), st.integers(1, 3), st.integers(1, 140))
def test_one_wave_or_a_big_l2_reads_each_operand_once(m, n, k, batch, sms):
    """Never less than each operand once; exactly that when every tile fits in one wave (padding aside, the
    panels count real rows) or when both operands fit in the L2."""
    once = (m * k + n * k) * 2 * batch + 2 * m * n * batch
    tiles = -(-m // 128) * -(-n // 256) * batch
    streamed = traffic(m, n, k, batch, sms=sms)
    assert streamed >= once * (1 - 1e-12)
    assert abs(traffic(m, n, k, batch, sms=sms, l2=1e18) - once) <= 1e-9 * once
    if tiles <= sms:
        assert abs(streamed - once) <= 1e-9 * once
