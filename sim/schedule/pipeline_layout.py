"""Which layers each pipeline stage and model chunk holds (Megatron's split).

Virtual stage q = c p + r (chunk c of stage r) holds a contiguous run of layers; q = 0 also runs the
embedding, q = p v - 1 the final norm, output layer and loss.

How many layers each virtual stage holds (even, embedding/loss-accounting and uneven first/last splits) is
scenarios/pipeline_split.py's rule, shared with the load-time work limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.pipeline_split import virtual_stage_layers


@dataclass(frozen=True)
class ChunkLayout:
    stage: int
    chunk: int
    layers: range  # global transformer-layer indices
    embedding: bool  # first virtual stage
    head: bool  # last virtual stage: final norm, output layer, loss


def pipeline_layout(parallel, layers: int) -> list[list[ChunkLayout]]:
    """layout[stage][chunk] for a scenario's parallel section and layer count."""
    p, v = parallel.pp, parallel.vp
    counts = virtual_stage_layers(parallel, layers)
    starts = [sum(counts[:q]) for q in range(p * v)]
    return [[ChunkLayout(r, c, range(starts[c * p + r], starts[c * p + r] + counts[c * p + r]),
                         c * p + r == 0, c * p + r == p * v - 1) for c in range(v)] for r in range(p)]
