"""Which layers each pipeline stage and model chunk holds (Megatron's split).

Virtual stage q = c p + r (chunk c of stage r) holds a contiguous run of layers; q = 0 also runs the
embedding, q = p v - 1 the final norm, output layer and loss.

- Even split: layers / (p v) transformer layers per virtual stage.
- account_for_embedding_in_split / account_for_loss_in_split (Megatron --account-for-embedding-in-
  pipeline-split / --account-for-loss-in-pipeline-split): the embedding (loss) counts as one layer, so
  (layers + 1 [+ 1]) / (p v) units per virtual stage, and the first (last) virtual stage holds one
  transformer layer fewer.
- Uneven first/last stage (v = 1; Megatron --decoder-first/last-pipeline-num-layers): first_stage_layers
  on stage 0, last_stage_layers on stage p - 1, the rest split evenly over the others.
The rules that make these splits exact are checked at load (scenarios/checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkLayout:
    stage: int
    chunk: int
    layers: range  # global transformer-layer indices
    embedding: bool  # first virtual stage
    head: bool  # last virtual stage: final norm, output layer, loss


def _counts(parallel, layers: int) -> list[int]:
    """Transformer layers per virtual stage, in virtual-stage order."""
    p, v = parallel.pp, parallel.vp
    first, last = parallel.first_stage_layers, parallel.last_stage_layers
    if first is not None or last is not None:
        middle = p - (first is not None) - (last is not None)
        each = (layers - (first or 0) - (last or 0)) // middle if middle else 0
        counts = [each] * p
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return counts
    emb, loss = int(parallel.account_for_embedding_in_split), int(parallel.account_for_loss_in_split)
    units = (layers + emb + loss) // (p * v)
    counts = [units] * (p * v)
    counts[0] -= emb
    counts[-1] -= loss
    return counts


def pipeline_layout(parallel, layers: int) -> list[list[ChunkLayout]]:
    """layout[stage][chunk] for a scenario's parallel section and layer count."""
    p, v = parallel.pp, parallel.vp
    counts = _counts(parallel, layers)
    starts = [sum(counts[:q]) for q in range(p * v)]
    return [[ChunkLayout(r, c, range(starts[c * p + r], starts[c * p + r] + counts[c * p + r]),
                         c * p + r == 0, c * p + r == p * v - 1) for c in range(v)] for r in range(p)]
