"""Units and their one-time conversion.

Conventions used everywhere in meshsim:
- bytes are plain ints named `*_bytes`; sizes on the command line accept K/M/G/T suffixes (powers of 1024,
  as nccl-tests prints them).
- time is float seconds (`*_s`), microseconds (`*_us`) or milliseconds (`*_ms`) as the name says.
- bandwidth `*_gbps` is GB/s = 1e9 bytes per second (nccl-tests' unit); network line rates are given in
  Gb/s as `*_gbitps` and converted once with `gbit_to_gbps`.
- FLOP rates `*_tflops` are 1e12 FLOP per second.
"""

from __future__ import annotations

import re

GB = 1e9

# Mixed-precision training's storage conventions (Megatron-LM, bf16 training): one definition for the
# schedule (collective sizes), the memory model and validate.
FP32_BYTES = 4  # fp32: main gradients (accumulated and reduced in fp32), optimizer states, loss terms
BF16_BYTES = 2  # bf16: weights and activations
US = 1e-6

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str | int) -> int:
    """Parse '256', '1K', '8G', '1.5MB' into bytes (K = 1024). Raises ValueError on anything else."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"cannot parse size {text!r}: use a number with an optional K/M/G/T suffix, e.g. 64M")
    number, unit, _ = match.groups()
    value = float(number) * 1024 ** _POWERS[unit.lower()]
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """Inverse of parse_size for display: 1048576 -> '1M'."""
    for unit, power in (("T", 4), ("G", 3), ("M", 2), ("K", 1)):
        if nbytes >= 1024**power and nbytes % 1024**power == 0:
            return f"{nbytes // 1024**power}{unit}"
    return str(nbytes)


def gbit_to_gbps(gbitps: float) -> float:
    """Line rate in Gb/s -> GB/s (divide by 8)."""
    return gbitps / 8.0


_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)
_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str | int) -> float:
    """Parse a count such as a token budget: '300B', '1T' (an exponent is refused); K/M/B(=G)/T are powers of
    1000 (counts, unlike sizes, are decimal). Raises ValueError on anything else."""
    if isinstance(text, int | float):
        return float(text)
    match = _COUNT_RE.match(str(text))
    if not match:
        raise ValueError(f"cannot parse count {text!r}: use a number with an optional K/M/B/T suffix, e.g. 1T")
    number, unit = match.groups()
    return float(number) * _DECIMAL[unit.lower()]
