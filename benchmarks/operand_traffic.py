"""HBM operand traffic of a persistent sm_90 GEMM under CUTLASS's raster order: a what-if for
benchmarks/accuracy_gemm_shape.py (docs/calibration-history.md, "GEMM rate by shape"), not part of meshsim's
compute model (sim/cost/gemm_efficiency.py), which it would have entered only had it explained the rows."""

from __future__ import annotations

from math import ceil


def wave_panels(lo: int, hi: int, minor: int, per_batch: int) -> tuple[int, int]:
    """(distinct major panels, distinct minor panels) the tiles lo..hi-1 of a raster touch, where tile t of batch
    t // per_batch sits at (major, minor) = divmod(t % per_batch, minor): each batch's panels are its own."""
    majors = minors = 0
    for b in range(lo // per_batch, (hi - 1) // per_batch + 1):
        start, stop = max(lo, b * per_batch), min(hi, (b + 1) * per_batch)
        majors += (stop - 1) // minor - start // minor + 1
        minors += min(minor, stop - start)
    return majors, minors


def operand_traffic_bytes(m: int, n: int, k: int, batch: int = 1, *, tile_m: int, tile_n: int, sm_count: int,
                          l2_bytes: float, value_bytes: float, out_bytes: float) -> float:
    """HBM bytes of a persistent sm_90 GEMM: its operand panels as its waves read them, plus C.

    The tiles are dealt to the SMs in waves in CUTLASS's raster order: along M (m fastest) when there are more
    tile columns than tile rows, else along N (NVIDIA/cutlass @7107b0553 include/cutlass/gemm/kernel/
    tile_scheduler_params.h, get_rasterization_order's Heuristic; no swizzle, max_swizzle_size 1 by default).
    A wave's tiles step through k together, so each A row panel (tile_m x k) and B column panel (k x tile_n)
    it touches is read from HBM once per wave (shared in L2 within the wave); the next wave starts at k = 0
    again, after the panels were evicted, unless the whole operand fits in half the L2 (then it is read once).
    Panels of a partial edge tile count their real rows. C: out_bytes per element (2 written; 4 or 8 for an
    accumulating wgrad). An assumption about L2 residency, not a measurement: used by
    benchmarks/accuracy_gemm_shape.py (a what-if), not by the compute model."""
    mb, nb = ceil(m / tile_m), ceil(n / tile_n)
    along_m = nb > mb
    minor = mb if along_m else nb
    tiles = mb * nb * batch
    a_panels = b_panels = 0
    for lo in range(0, tiles, sm_count):
        majors, minors = wave_panels(lo, min(tiles, lo + sm_count), minor, mb * nb)
        a_panels, b_panels = (a_panels + minors, b_panels + majors) if along_m else (a_panels + majors,
                                                                                    b_panels + minors)
    a_once, b_once = m * k * value_bytes * batch, n * k * value_bytes * batch
    a_bytes = a_once if a_once <= l2_bytes / 2 else a_panels * a_once / (mb * batch)
    b_bytes = b_once if b_once <= l2_bytes / 2 else b_panels * b_once / (nb * batch)
    return a_bytes + b_bytes + out_bytes * m * n * batch
