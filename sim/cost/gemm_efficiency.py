"""GEMM efficiency: the fraction of peak a cuBLAS-style tiled GEMM reaches, from its shape.

A GEMM C[m, n] (+= over k) runs as output tiles of tile_m x tile_n, each owned by one SM (thread block)
for the whole k loop; the tiles run in waves over the SMs. Three shape effects, each in (0, 1]:

- tile padding: a partial edge tile computes a whole tile: m n / (ceil(m/tm) tm ceil(n/tn) tn).
- wave quantization: tiles = ceil(m/tm) ceil(n/tn) batch run in waves = ceil(tiles / SMs); the last wave
  leaves SMs idle: tiles / (waves x SMs). 133 tiles on 132 SMs take two full waves (50%).
- skinny k (low arithmetic intensity): after its k loop a tile writes its tm x tn 16-bit output at its
  SM's share of HBM bandwidth (bw / SMs); its k loop runs at the SM's share of peak (peak / SMs). The
  epilogue therefore costs as much as k_fill = peak / bw k-steps (the ridge point in FLOP/byte: 295 on
  H100, 206 on H200, 153 on A100-80GB), and the tile's efficiency is k / (k + k_fill). A skinny n
  lowers intensity through tile padding (n < tile_n wastes the tile) and through the roofline bytes
  term applied in sim/cost/compute.py.

The three factors are normalized to the reference GEMM m = n = k = 8192, which reaches `ceiling`
(default 0.80: an 8192^3 bf16 GEMM measured about 790 of 989 TFLOP/s on an H200 on this project's
machine, reference/modeling-facts.md). So efficiency(8192^3) = ceiling exactly on every GPU, and other
shapes scale by their shape factors relative to it (capped at 1).

Tiles: cuBLAS's heuristic picks a kernel (tile shape) per problem, which softens wave cliffs. By
default the model takes the best of 128 x 256 (the large bf16 tile of Hopper-class cuBLAS/CUTLASS
kernels), 256 x 128 and 128 x 128, with the same mainloop efficiency (a 128 x 128 tile still does 64
FLOP per byte of operand traffic). Setting hardware.compute.tile_m / tile_n (or a profile's) fixes one
tile instead. Not modeled: split-K / stream-K kernels, which recover part of a partial last wave.
"""

from __future__ import annotations

from math import ceil

from meshsim.topologies.gpus import by_gpu_prefix

DEFAULT_TILES = ((128, 256), (256, 128), (128, 128))
DEFAULT_CEILING = 0.80  # 790 / 989 TFLOP/s, 8192^3 bf16 GEMM on an H200 (reference/modeling-facts.md)
REFERENCE_MNK = 8192
# Large-GEMM ceiling by GPU generation (GPU preset name prefix), each from a public measurement:
# - a100: 0.82, FLUX README (bytedance/flux 239a13d2): cuBLAS fp16 GEMMs of GPT-3 175B MLP shapes at TP 8
#   (4096 x 12288 x 6144 and 4096 x 6144 x 12288) on A800 (A100 silicon) run 2.438 / 2.453 ms = 254 /
#   252 TFLOP/s = 81% of 312 at a shape factor ~0.99 of 8192^3;
# - h100: 0.75, the same FLUX GEMMs on H800 (H100 SXM silicon and clocks): 0.846 / 0.818 ms = 731 / 756
#   TFLOP/s = 74-76% of 989 (sustained clocks under load sit below the boost clock the peak assumes);
# - h200: 0.80, measured here (8192^3 bf16, 790 / 989; more HBM bandwidth and power headroom than H100);
# - b200: 0.62, fitted on the dgxc-benchmarking Llama 3.1 405B BF16 row on 128 GB200 (public-measurements-3.md
#   section 2; GEMMs ~80% of its step, hidden 16,384 at TP 4): 0.62 gives +0.7%, 0.64 -2.1%, H100's 0.75
#   -15.1%. GB200 (the same die) runs at B200's absolute rate (sim/cost/reference_rate.py), so 0.62 x 2250 =
#   1,395 TFLOP/s. The same FP8 : BF16 sustained ratio as Hopper's fitted pair: B200 0.51 x 4500 / 1395 =
#   1.65, H100 0.62 x 1979 / (0.75 x 989) = 1.65. Was 0.75 (H100's, assumed);
# - v100: 0.80, no GEMM measurement in our set: DEFAULT_CEILING, not fitted on any case (benchmarks/accuracy/
#   fits.yaml; the 2020 DGX-2 tp1 step, compute-bound, comes out +5.6% with it).
GEMM_CEILING_BY_GPU = {"a100": 0.82, "h100": 0.75, "h200": 0.80, "b200": 0.62, "v100": DEFAULT_CEILING}


def gemm_ceiling(gpu_name: str) -> float:
    """The large-GEMM fraction of peak for a GPU preset (GEMM_CEILING_BY_GPU), DEFAULT_CEILING if unknown."""
    return by_gpu_prefix(GEMM_CEILING_BY_GPU, gpu_name, DEFAULT_CEILING)


def tile_padding(m: int, n: int, tile_m: int, tile_n: int) -> float:
    return (m * n) / (ceil(m / tile_m) * tile_m * ceil(n / tile_n) * tile_n)


def wave_efficiency(tiles: int, sm_count: int) -> float:
    """tiles / (waves x SMs): the useful fraction of the SM-waves a GEMM occupies."""
    waves = ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


def gemm_tiles(m: int, n: int, batch: int, tile_m: int, tile_n: int) -> int:
    return ceil(m / tile_m) * ceil(n / tile_n) * batch


def k_efficiency(k: int, k_fill: float) -> float:
    """k / (k + k_fill): the tile's k loop against its un-overlapped output write."""
    return k / (k + k_fill)


def shape_factor(m: int, n: int, k: int, batch: int, *, tile_m: int, tile_n: int, sm_count: int,
                 k_fill: float) -> float:
    """Product of the three shape effects (not normalized)."""
    tiles = gemm_tiles(m, n, batch, tile_m, tile_n)
    return (tile_padding(m, n, tile_m, tile_n) * wave_efficiency(tiles, sm_count)
            * k_efficiency(k, k_fill))


def best_shape_factor(m: int, n: int, k: int, batch: int, tiles: tuple[tuple[int, int], ...], *,
                      sm_count: int, k_fill: float) -> float:
    """The best shape factor over the candidate tiles (the kernel a heuristic would pick)."""
    return max(shape_factor(m, n, k, batch, tile_m=tm, tile_n=tn, sm_count=sm_count, k_fill=k_fill)
               for tm, tn in tiles)


def gemm_efficiency(m: int, n: int, k: int, batch: int = 1, *, ceiling: float = DEFAULT_CEILING,
                    tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES, sm_count: int,
                    k_fill: float, out_bytes: int = 2, free_sms: int | None = None) -> float:
    """Fraction of peak for this shape: ceiling x factor(shape) / factor(8192^3), capped at 1.

    out_bytes: bytes per output element the epilogue moves (2 for a 16-bit C, the reference GEMM's); the
    epilogue's cost, and so k_fill, scales with it: an fp32 accumulating C (read 4 + write 4 = 8 bytes)
    costs 4 x k_fill k-steps per tile. free_sms (default sm_count): the SMs this GEMM runs on while another
    kernel holds the rest; its waves are counted on them and its rate scales by free_sms / sm_count (the
    reference stays the whole GPU's)."""
    sms = sm_count if free_sms is None else free_sms
    ref = best_shape_factor(REFERENCE_MNK, REFERENCE_MNK, REFERENCE_MNK, 1, tiles, sm_count=sm_count,
                            k_fill=k_fill)
    this = best_shape_factor(m, n, k, batch, tiles, sm_count=sms, k_fill=k_fill * out_bytes / 2)
    return min(1.0, ceiling * this / ref) * sms / sm_count
