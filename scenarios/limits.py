"""A scenario's size limits (sim/core/limits.py holds the numbers), checked before anything is built.

The model's layers and dimensions are bounded so that every later step (divisor searches in the
messages of scenarios/checks.py, the schedule, the memory model) stays small; GPU counts are checked
where topologies are built (topologies/registry.py) and micro-batches / layer passes once dp is known
(scenarios/load.py resolve()).
"""

from __future__ import annotations

from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.limits import MAX_ALL_TO_ALL_RANKS, MAX_GPUS, MAX_LAYERS, MAX_MODEL_DIM, check_at_most

MODEL_DIMS = ("hidden", "ffn_hidden", "heads", "kv_heads", "seq_len", "vocab")


def check_model_size(scenario: Scenario, source: str) -> None:
    """UserError when model.layers, a model dimension or parallel.gpus / tp / micro_batch exceeds its limit."""
    m, p = scenario.model, scenario.parallel
    check_at_most("model.layers", m.layers, MAX_LAYERS, f"use at most {MAX_LAYERS} layers", source=source)
    for name in MODEL_DIMS:
        value = getattr(m, name)
        if value is not None:
            check_at_most(f"model.{name}", value, MAX_MODEL_DIM, f"use model.{name} <= {MAX_MODEL_DIM:,}",
                          source=source)
    for name in ("gpus", "tp", "micro_batch"):
        value = getattr(p, name)
        if value is not None:
            check_at_most(f"parallel.{name}", value, MAX_GPUS if name != "micro_batch" else MAX_MODEL_DIM,
                          f"use parallel.{name} <= {MAX_GPUS if name != 'micro_batch' else MAX_MODEL_DIM:,}",
                          source=source)
    check_at_most("parallel.ep", p.ep, MAX_ALL_TO_ALL_RANKS, f"use parallel.ep <= {MAX_ALL_TO_ALL_RANKS} (the "
                  "all-to-all's ranks^2 flows are costed one by one)", source=source, what="ranks of one all-to-all (ep)")
    if isinstance(p.dp, int):
        check_at_most("parallel.dp", p.dp, MAX_GPUS, f"use parallel.dp <= {MAX_GPUS:,}", source=source)
