"""The headline figures of one library scenario, rounded to what the report prints (6 significant digits).

Shared by tests/test_golden.py (which pins them) and tests/golden/update.py (which regenerates them).
"""

from __future__ import annotations

from typing import Any

from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.results.simulate import simulate


def sig(x: float, digits: int = 6) -> float:
    """x rounded to `digits` significant digits (the golden files' precision)."""
    return float(f"{x:.{digits}g}")


def headline_figures(name: str) -> dict[str, Any]:
    d = simulate(load_and_resolve(name)).to_dict()
    mem = d["memory_gb"]
    return {
        "step_time_s": sig(d["step_time_s"]),
        "tokens_per_s": sig(d["tokens_per_s"]),
        "mfu": sig(d["mfu"]),
        "layer_fwd_ms": sig(d["layer_fwd_ms"]),
        "layer_bwd_ms": sig(d["layer_bwd_ms"]),
        "memory_total_gb": sig(mem["total"]),
        "memory_activations_gb": sig(mem["activations"]),
        "fits": bool(mem["fits"]),
        "critical_path_share": {k: sig(v, 4) for k, v in sorted(d["critical_path_share"].items())},
        "breakdown_s": {k: sig(v) for k, v in sorted(d["breakdown_s"].items())},
        "ops_per_rank": d["ops_per_rank"],
    }
