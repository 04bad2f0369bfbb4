"""One formatter per quantity, for every text a person reads (terminal, HTML pages, hovers, sentences).

- bytes: binary units, as memory and NCCL buffers are sized: 1 KiB = 1024 B, 1 MiB = 1024 KiB,
  1 GiB = 1024 MiB; three significant digits ("64 MiB", "1.5 GiB", "71.7 GiB"). Memory figures held in
  GB (1e9 B, the results JSON's `memory_gb`) are shown through `fmt_gb_as_gib`.
- time: one unit for a whole column (`time_unit` picks it from the column's largest value), or the best
  unit for a single value in a sentence (`fmt_s`).
- bandwidth: GB/s = 1e9 B/s, spelled "GB/s" (nccl-tests' unit).
- counts and rates: digits with thousands separators, never scientific notation; tokens/s may be
  abbreviated with k / M.
"""

from __future__ import annotations

import math
from collections.abc import Callable

GIB = 1024**3
_BINARY = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6))
_UNIT_S = dict(TIME_UNITS)


def _sig3(value: float) -> str:
    """Three significant digits, no exponent, trailing zeros dropped: 71.68 -> '71.7', 64.0 -> '64'."""
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_bytes(nbytes: float) -> str:
    """1048576 -> '1 MiB', 57360 * 1024 -> '56 MiB', 512 -> '512 B'."""
    for unit, size in _BINARY:
        if abs(nbytes) >= size:
            return f"{_sig3(nbytes / size)} {unit}"
    return f"{nbytes:.0f} B"


def fmt_bytes_range(lo: float, hi: float) -> str:
    """'56 MiB' or '56 MiB-112 MiB'."""
    a, b = fmt_bytes(lo), fmt_bytes(hi)
    return a if a == b else f"{a}-{b}"


def gb_to_gib(gb: float) -> float:
    """GB (1e9 B) -> GiB (2^30 B)."""
    return gb * 1e9 / GIB


def fmt_gib(gib: float) -> str:
    """A number of GiB without its unit (table cells under a 'GiB' header): 71.72 -> '71.7'."""
    return _sig3(gib)


def fmt_gb_as_gib(gb: float, unit: bool = True) -> str:
    """A memory figure held in GB shown in GiB: 77.01 -> '71.7 GiB'."""
    return fmt_gib(gb_to_gib(gb)) + (" GiB" if unit else "")


def time_unit(values_s) -> tuple[str, float]:
    """(unit, seconds per unit) for a column: the largest unit that keeps its largest value >= 1."""
    top = max((abs(v) for v in values_s), default=0.0)
    for unit, scale in TIME_UNITS:
        if top >= scale:
            return unit, scale
    return TIME_UNITS[-1]


def fmt_time(seconds: float, unit: str) -> str:
    """seconds in the given unit, four significant figures, no exponent: (0.1487, 'ms') -> '148.7'."""
    value = seconds / _UNIT_S[unit]
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}" if abs(value) >= 1e-3 else "0"


def time_column(values_s) -> tuple[str, Callable[[float], str]]:
    """(unit, formatter) for a table column of times: one unit, and one number of decimals giving the
    largest value four significant digits (7.323 s -> 3 decimals, so 0.9931 s shows as '0.993')."""
    unit, scale = time_unit(values_s)
    top = max((abs(v) / scale for v in values_s), default=0.0)
    decimals = max(0, 3 - int(math.floor(math.log10(top)))) if top > 0 else 0
    return unit, lambda seconds: f"{seconds / scale:.{decimals}f}"


def fmt_s(seconds: float) -> str:
    """One value with its best unit: 4.2628 -> '4.263 s', 0.0123 -> '12.3 ms', 0.000685 -> '685 us'."""
    unit, _ = time_unit([seconds])
    return f"{fmt_time(seconds, unit)} {unit}"


def fmt_gbps(gbps: float) -> str:
    """GB/s with three significant digits: 369.4 -> '369 GB/s'."""
    return f"{_sig3(gbps)} GB/s"


def fmt_count(n: float) -> str:
    """103105.3 -> '103,105' (never 1.031e+05)."""
    return f"{n:,.0f}"


def fmt_tokens(per_s: float) -> str:
    """Tokens per second, abbreviated: 71634 -> '71.6k', 1.2e6 -> '1.20M'."""
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f}M"
    return f"{per_s / 1e3:.1f}k" if per_s >= 1e3 else f"{per_s:.0f}"


MAX_PCT_DECIMALS = 4


def fmt_pct(fraction: float, decimals: int = 0, *, signed: bool = False) -> str:
    """A fraction as a percentage with `decimals` decimals (`signed`: '+' on positive values). A value that
    is not zero never reads as zero: it gets the decimals its first significant digit needs, up to
    MAX_PCT_DECIMALS (0.0007 -> '0.07%', 0.004 -> '0.4%', signed '+0.07%'; below 0.0001% it is '<0.0001%')."""
    pct = 100 * fraction
    sign = "+" if signed else ""
    places = decimals
    if pct and round(pct, decimals) == 0:  # its first significant digit, 10^-places, shown
        places = -math.floor(math.log10(abs(pct)))
        if places > MAX_PCT_DECIMALS:
            return f"{'-' if pct < 0 else sign}<{10.0 ** -MAX_PCT_DECIMALS:.{MAX_PCT_DECIMALS}f}%"
    return f"{pct:{sign}.{places}f}%"


def fmt_duration_long(seconds: float) -> str:
    """Wall-clock durations of a training run: '3.2 h', '12.5 days'."""
    for unit, scale in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= scale:
            return f"{seconds / scale:,.1f} {unit}"
    return f"{seconds:.0f} s"


def rank_label(rank: int, tp: int = 1, dp: int = 1, pp: int = 1, per_node: int = 0, cp: int = 1) -> str:
    """'rank 9 (tp 1, dp 1, node 1)' on the TP-innermost mesh (sim/core/mesh.py): tp rank = r mod tp, cp
    rank = (r div tp) mod cp (shown when cp > 1), dp rank = (r div (tp cp)) mod dp, pp stage = r div (tp cp
    dp) (outermost, Megatron's default order; shown when pp > 1), node = r div per_node (GPUs per node; 0:
    not shown)."""
    parts = [f"tp {rank % tp}"] + ([f"cp {rank // tp % cp}"] if cp > 1 else []) + [f"dp {rank // (tp * cp) % dp}"]
    if pp > 1:
        parts.append(f"pp {rank // (tp * cp * dp)}")
    if per_node:
        parts.append(f"node {rank // per_node}")
    return f"rank {rank} ({', '.join(parts)})"
