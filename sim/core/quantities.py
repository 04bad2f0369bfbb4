"""Plausible ranges of every physical number meshsim reads, defined once and used by every schema
(scenario, hardware profile, custom topology; results files through `check_range`).

A number outside its range is refused at load with one line naming the field and the range (e.g.
`hardware.peak_tflops = 5e-324 is invalid. Expected a number from 1e-06 to 1e+06 TFLOP/s`), so that
no cost downstream can overflow to infinity, divide by a denormal or round to zero: with every input in
its range, every time meshsim computes is finite. The ranges are wide on purpose (a CPU measured by
`meshsim calibrate` reaches ~0.01 TFLOP/s, a future link 100 TB/s): they exclude only what cannot be
hardware (1e+308 GB/s, 5e-324 of peak).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError


def range_words(low: float, high: float, unit: str) -> str:
    """'a number from 0.001 to 1e+06 GB/s'."""
    return f"a number from {low:g} to {high:g}{' ' + unit if unit else ''}"


def in_range(value: object, low: float, high: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def _checked(low: float, high: float, unit: str):
    def check(value):
        if not in_range(value, low, high):
            raise PydanticCustomError("out_of_range", "{words}", {"words": range_words(low, high, unit)})
        return value
    return AfterValidator(check)


def quantity(low: float, high: float, unit: str = "") -> object:
    """A float field accepting [low, high] (ints too; never inf / nan)."""
    return Annotated[float, _checked(low, high, unit)]


def count(low: int, high: int, unit: str = "") -> object:
    """An int field accepting [low, high]."""
    return Annotated[int, _checked(low, high, unit)]


# ----- the ranges (units as in sim/core/units.py) ----------------------------------------------------
BANDWIDTH_GBPS = (1e-3, 1e6)  # GB/s: memory, NVLink, a link, an elementwise kernel
GBps = quantity(*BANDWIDTH_GBPS, "GB/s")
GBpsOrZero = quantity(0.0, BANDWIDTH_GBPS[1], "GB/s")  # measured algbw / busbw (0: nothing moved)
Gbitps = quantity(1e-2, 1e7, "Gb/s")  # NIC line rate
TFLOPs = quantity(1e-6, 1e6, "TFLOP/s")  # peak or measured throughput
MemGB = quantity(1e-3, 1e6, "GB")  # GPU memory
LatencyUs = quantity(0.0, 1e6, "us")  # a launch, a dispatch, a link or switch latency (at most 1 s)
KernelTimeUs = quantity(1e-6, 1e9, "us")  # a measured kernel or collective
Efficiency = quantity(1e-6, 1.0)  # a fraction of a peak
Fraction = quantity(0.0, 1.0)  # a share (0 allowed)
Slowdown = quantity(1.0, 1e3, "x")  # a factor >= 1
Oversubscription = quantity(1.0, 1024.0, "x")
CapacityFactor = quantity(1e-3, 1024.0)
BucketMiB = quantity(1e-3, 1e6, "MiB")
Flops = quantity(0.0, 1e21, "FLOP")
Bytes = count(0, 1 << 50, "bytes")
Dim = count(1, 1 << 40)  # a GEMM dimension or batch of a measured point
Samples = count(0, 1 << 40)  # how many measurements an entry rests on
