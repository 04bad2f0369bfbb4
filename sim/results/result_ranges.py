"""The plausible range of every number of a results file (results.json, a sweep record's result), defined
once: `compare`, the sweep store and `validate --from-results` check a file they read against it, so a
string where a number belongs, 1e+308 or a 1,000-digit integer is one line naming the field and its
range (exit 2), never a traceback or an Infinity downstream; the settings it echoes (tp, gpus, sp ...:
sim/results/records.ConfigEcho) are of their type, counts whole numbers in COUNT_RANGE. Ranges (sim/core/quantities.py style) are
wide: they exclude only what no simulated step can produce.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import fields

from meshsim.sim.core.quantities import in_range, range_words
from meshsim.sim.results.records import ConfigEcho

# headline field -> (low, high, unit); absent optional fields are allowed (OPTIONAL below)
HEADLINE_RANGES = {
    "step_time_s": (0.0, 1e9, "s"), "tokens_per_s": (0.0, 1e15, "tokens/s"),
    "tflops_per_gpu": (0.0, 1e6, "TFLOP/s"), "mfu": (0.0, 1.0, ""), "hfu": (0.0, 10.0, ""),
    "layer_fwd_ms": (0.0, 1e12, "ms"), "layer_bwd_ms": (0.0, 1e12, "ms"),
}
OPTIONAL = ("hfu", "layer_fwd_ms", "layer_bwd_ms")
SECTION_RANGES = {  # every number of the section (flags such as memory_gb.fits and nested lists such as
    # memory_gb.stages are not numbers of the section)
    "breakdown_s": (0.0, 1e9, "s"), "memory_gb": (0.0, 1e9, "GB"), "critical_path_share": (0.0, 1.0, ""),
}
COUNT_RANGE = (0, 10**9)  # every count a results file echoes (tp, gpus, micro_batches, ops_per_rank ...)
# the other plain values of a results file besides ConfigEcho's settings: their types
OTHER_TYPES = {"scenario": str, "fits": bool, "source": str, "explicit_ranks": bool, "simulated_ranks": int,
               "ops_per_rank": int}
SLACK = 1e-9  # float rounding of sums (a share of 1.0000000000000002, a waiting time of -1e-17 s)


def _out(field: str, value: object, low: float, high: float, unit: str) -> str | None:
    lo, hi = low - SLACK * max(1.0, abs(low)), high + SLACK * max(1.0, abs(high))
    if in_range(value, lo, hi):
        return None
    if value is None:
        return f"{field} is missing (expected {range_words(low, high, unit)})"
    shown = repr(value)[:40] if not isinstance(value, int) or abs(value) < 10**30 else f"{float(value):.3g}"
    return f"{field} = {shown} is not {range_words(low, high, unit)}"


def _echo_types() -> dict[str, type]:
    """Each echoed setting's type, from ConfigEcho's annotations (X | None -> X; list[str] -> list)."""
    hints = typing.get_type_hints(ConfigEcho)
    plain = {}
    for f in fields(ConfigEcho):
        kind = next(a for a in typing.get_args(hints[f.name]) if a is not type(None))
        plain[f.name] = typing.get_origin(kind) or kind
    return plain


ECHO_TYPES = {**_echo_types(), **OTHER_TYPES}
TYPE_WORDS = {int: "a whole number", bool: "true or false", str: "a string", list: "a list", dict: "a section"}


def _setting_problem(field: str, value: object, kind: type) -> str | None:
    """A setting echoed in a results file is absent, null or of its type (a count within COUNT_RANGE)."""
    if value is None:
        return None
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _out(field, value, *COUNT_RANGE, "")
    elif kind is dict and isinstance(value, Mapping) or kind is not dict and isinstance(value, kind):
        if kind is list and not all(isinstance(item, str) for item in value):
            return f"{field} = {repr(value)[:40]} is not a list of names"
        return None
    return f"{field} = {repr(value)[:40]} is not {TYPE_WORDS[kind]}"


def result_problem(data: object) -> str | None:
    """What makes `data` not a results dict within its ranges (the first problem, naming the field and
    its range), or None."""
    if not isinstance(data, Mapping):
        return f"Expected a JSON object, found {type(data).__name__}"
    for field, (low, high, unit) in HEADLINE_RANGES.items():
        if field in OPTIONAL and field not in data:
            continue
        problem = _out(field, data.get(field), low, high, unit)
        if problem:
            return problem
    for section, (low, high, unit) in SECTION_RANGES.items():
        values = data.get(section, {} if section == "critical_path_share" else None)
        if not isinstance(values, Mapping):
            return f"{section} is missing or not a section of numbers"
        for key, value in values.items():
            nested = isinstance(value, bool | list | Mapping)  # a flag, or a breakdown of its own (memory_gb.stages)
            problem = None if nested else _out(f"{section}.{key}", value, low, high, unit)
            if problem:
                return problem
    if "total" not in data["memory_gb"] or isinstance(data["memory_gb"]["total"], bool):
        return "memory_gb.total is missing"
    for field, kind in ECHO_TYPES.items():
        problem = _setting_problem(field, data.get(field), kind)
        if problem:
            return problem
    return None
