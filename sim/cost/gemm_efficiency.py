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
tile instead.

Split-K (`split_k_factor`). A GEMM with fewer tiles than SMs (small m x n, large k: a wgrad of a few hundred
tokens, a router, a small expert) leaves most SMs idle for its one partial wave. cuBLASLt's heuristic then
splits k into s slices (CUBLASLT_ALGO_CONFIG_SPLITK_NUM) that run as s x tiles CTAs, each writing an fp32
partial C into the workspace, which a reduction kernel sums into C (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE).
Per split s:
    main(s)  = padding x wave(s x tiles) x keff(ceil(k / s), 2 k_fill) x k / (s ceil(k / s))
               (each tile's epilogue writes a 4-byte partial: twice the 16-bit reference's k_fill)
    r(s)     = (4 s + out_bytes) k_fill / (2 k)      (the reduction reads s fp32 partials and writes C at the
               whole GPU's bandwidth, in units of the GEMM's ideal compute time: k_fill = peak / bw)
    factor(s) = 1 / (1 / main(s) + r(s))
and the kernel is the best s from 1 (no split) to min(ceil(SMs / tiles), k // SPLIT_K_MIN_K) whose partials fit
the workspace Transformer Engine hands cuBLASLt: s x m x n x batch x 4 <= 32 MiB + 1 KiB on sm_90+, 4 MiB below
(TE @d0067d0 pytorch/cpp_extensions/gemm.py L40-45, get_cublas_workspace_size_bytes; cublaslt_gemm.cu
L739-749 passes it as CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES). SPLIT_K_MIN_K = 256: four 64-deep k-tiles
(the 128-byte rows of a 16-bit operand tile), an assumption: a shorter split does not fill the mainloop's
pipeline. Fitted on nothing. With 4 MiB an A100 cannot hold two fp32 partials of a 1024 x 1024 output; whole
training GEMMs (thousands of tiles, like the reference 8192^3's 2,048) never split, but the ring-exchange chunks
of TE's userbuffers overlap (m = tokens / tp beside the comm kernel's SMs) do.
Not modeled: stream-K, and the serial in-place reduction (INPLACE) cuBLASLt uses when the workspace is short.

k quantization (`k_quantization`). The mainloop steps through k in tiles of tile_k: a k that is no multiple of
tile_k still pays its last step whole, k / (ceil(k / tile_k) tile_k). tile_k = K_TILE_BYTES / value bytes: 128
bytes of each operand row per step, the width of the 128-byte shared-memory swizzle the Hopper and Blackwell
TMA kernels load (CUTLASS's 64-deep 16-bit and 128-deep FP8 k tiles), so 64 for 16-bit, 128 for FP8, 256 for
FP4 values. The reference 8192 is a multiple of all three; it matters for odd hidden sizes (k = 240 at tp 8 of
a 1,920 hidden: 240 / 256; GPT-OSS's 2,880 under FP8) and for expert wgrads, whose k is the tokens an expert
receives. Fitted on nothing.
"""

from __future__ import annotations

from math import ceil

DEFAULT_TILES = ((128, 256), (256, 128), (128, 128))
SPLIT_K_MIN_K = 256  # shortest k slice of a split-K kernel (module docstring; assumption)
PARTIAL_BYTES = 4  # a split's fp32 partial C (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
REFERENCE_OUT_BYTES = 2  # the reference GEMM's 16-bit C: k_fill's unit
# Transformer Engine's cuBLASLt workspace (pytorch/cpp_extensions/gemm.py L40-45 @d0067d0)
WORKSPACE_BYTES_SM90 = 32 * 1024 * 1024 + 1024
WORKSPACE_BYTES_OLDER = 4_194_304
K_TILE_BYTES = 128  # one mainloop step's k extent in bytes of operand values (module docstring)
DEFAULT_CEILING = 0.80  # 790 / 989 TFLOP/s, 8192^3 bf16 GEMM on an H200 (reference/modeling-facts.md)
REFERENCE_MNK = 8192
# The ceiling by GPU generation, sustained (training steps) and burst (lone kernels): sim/cost/gemm_ceiling.py


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


def k_tile(value_bytes: float) -> int:
    """The k depth of one mainloop step: K_TILE_BYTES of operand values (64 16-bit, 128 FP8, 256 FP4)."""
    return max(1, round(K_TILE_BYTES / value_bytes))


def round_up(x: int, step: int) -> int:
    return -(-x // step) * step


def k_quantization(k: int, tile_k: int) -> float:
    """k / (ceil(k / tile_k) tile_k): the last mainloop step of a k that is no multiple of tile_k is a whole
    step (module docstring)."""
    return k / round_up(k, tile_k)


def shape_factor(m: int, n: int, k: int, batch: int, *, tile_m: int, tile_n: int, sm_count: int,
                 k_fill: float, tile_k: int = 1) -> float:
    """Product of the shape effects (not normalized)."""
    tiles = gemm_tiles(m, n, batch, tile_m, tile_n)
    return (tile_padding(m, n, tile_m, tile_n) * wave_efficiency(tiles, sm_count)
            * k_efficiency(k, k_fill) * k_quantization(k, tile_k))


def cublas_workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """The workspace Transformer Engine gives cuBLASLt: 32 MiB + 1 KiB on sm_90+, 4 MiB below."""
    return WORKSPACE_BYTES_SM90 if compute_capability[0] >= 9 else WORKSPACE_BYTES_OLDER


def split_count_limit(m: int, n: int, k: int, batch: int, tiles: int, sm_count: int,
                      workspace_bytes: int) -> int:
    """The most k slices worth trying: one full wave, slices of >= SPLIT_K_MIN_K, partials in the workspace."""
    by_wave = -(-sm_count // tiles)
    by_k = k // SPLIT_K_MIN_K
    by_workspace = workspace_bytes // (m * n * batch * PARTIAL_BYTES)
    return max(1, min(by_wave, by_k, by_workspace))


def split_k_factor(m: int, n: int, k: int, batch: int, splits: int, *, tile_m: int, tile_n: int,
                   sm_count: int, k_fill: float, out_bytes: float, tile_k: int = 1) -> float:
    """factor(s) = 1 / (1 / main(s) + r(s)) of a split-K kernel with `splits` >= 2 slices (module docstring);
    k_fill is the 16-bit C's (REFERENCE_OUT_BYTES); each slice is a whole number of tile_k steps."""
    k_slice = round_up(-(-k // splits), tile_k)
    tiles = gemm_tiles(m, n, batch, tile_m, tile_n) * splits
    main = (tile_padding(m, n, tile_m, tile_n) * wave_efficiency(tiles, sm_count)
            * k_efficiency(k_slice, k_fill * PARTIAL_BYTES / REFERENCE_OUT_BYTES) * k / (splits * k_slice))
    reduction = (PARTIAL_BYTES * splits + out_bytes) * k_fill / (2.0 * k)
    return 1.0 / (1.0 / main + reduction)


def tile_factor(m: int, n: int, k: int, batch: int, tile_m: int, tile_n: int, *, sm_count: int, k_fill: float,
                out_bytes: float, workspace_bytes: int, tile_k: int = 1) -> float:
    """The best of the unsplit kernel and its split-K variants for one tile shape."""
    best = shape_factor(m, n, k, batch, tile_m=tile_m, tile_n=tile_n, sm_count=sm_count,
                        k_fill=k_fill * out_bytes / REFERENCE_OUT_BYTES, tile_k=tile_k)
    tiles = gemm_tiles(m, n, batch, tile_m, tile_n)
    for splits in range(2, split_count_limit(m, n, k, batch, tiles, sm_count, workspace_bytes) + 1):
        best = max(best, split_k_factor(m, n, k, batch, splits, tile_m=tile_m, tile_n=tile_n, sm_count=sm_count,
                                        k_fill=k_fill, out_bytes=out_bytes, tile_k=tile_k))
    return best


def best_shape_factor(m: int, n: int, k: int, batch: int, tiles: tuple[tuple[int, int], ...], *,
                      sm_count: int, k_fill: float, out_bytes: float = REFERENCE_OUT_BYTES,
                      workspace_bytes: int = 0, tile_k: int = 1) -> float:
    """The best factor over the candidate tiles and their split-K variants (the kernel a heuristic would
    pick); workspace_bytes 0: no split-K; tile_k 1: no k quantization."""
    return max(tile_factor(m, n, k, batch, tm, tn, sm_count=sm_count, k_fill=k_fill, out_bytes=out_bytes,
                           workspace_bytes=workspace_bytes, tile_k=tile_k) for tm, tn in tiles)


def gemm_efficiency(m: int, n: int, k: int, batch: int = 1, *, ceiling: float = DEFAULT_CEILING,
                    tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES, sm_count: int,
                    k_fill: float, out_bytes: float = 2, free_sms: int | None = None,
                    workspace_bytes: int = 0, tile_k: int = 1) -> float:
    """Fraction of peak for this shape: ceiling x factor(shape) / factor(8192^3), capped at 1.

    out_bytes: bytes per output element the epilogue moves (2 for a 16-bit C, the reference GEMM's); the
    epilogue's cost, and so k_fill, scales with it: an fp32 accumulating C (read 4 + write 4 = 8 bytes)
    costs 4 x k_fill k-steps per tile. free_sms (default sm_count): the SMs this GEMM runs on while another
    kernel holds the rest; its waves are counted on them and its rate scales by free_sms / sm_count (the
    reference stays the whole GPU's). workspace_bytes: cuBLASLt's workspace, which bounds split-K (0: none).
    tile_k: the mainloop's k step (k_tile(value bytes)); 1 leaves k unquantized."""
    sms = sm_count if free_sms is None else free_sms
    ref = best_shape_factor(REFERENCE_MNK, REFERENCE_MNK, REFERENCE_MNK, 1, tiles, sm_count=sm_count,
                            k_fill=k_fill)
    this = best_shape_factor(m, n, k, batch, tiles, sm_count=sms, k_fill=k_fill, out_bytes=out_bytes,
                             workspace_bytes=workspace_bytes, tile_k=tile_k)
    return min(1.0, ceiling * this / ref) * sms / sm_count

