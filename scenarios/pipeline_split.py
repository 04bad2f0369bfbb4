"""How many transformer layers each virtual pipeline stage holds (Megatron's split), one definition for the
load-time limits (scenarios/load.py) and the schedule (sim/schedule/pipeline_layout.py).

Virtual stage q = c p + r is chunk c of stage r (p stages, v chunks per stage).
- Even split: layers / (p v) per virtual stage.
- account_for_embedding_in_split / account_for_loss_in_split (Megatron --account-for-embedding-in-
  pipeline-split / --account-for-loss-in-pipeline-split): the embedding (loss) counts as one layer, so
  (layers + 1 [+ 1]) / (p v) units per virtual stage, and the first (last) virtual stage holds one
  transformer layer fewer.
- Uneven first/last stage (v = 1; Megatron --decoder-first/last-pipeline-num-layers): first_stage_layers
  on stage 0, last_stage_layers on stage p - 1, the rest split evenly over the others.
- An explicit layout (Megatron --pipeline-model-parallel-layout, core/transformer/pipeline_parallel_layer_
  layout.py): one segment per virtual stage separated by '|', 't' a transformer layer, 'E' the embedding
  (first segment), 'L' the loss (last segment), 'm' a multi-token-prediction depth (model.mtp_layers; it runs
  with the loss), '(...)*n' n repetitions, 'x*n' one symbol n times, commas ignored: "Et|(tt|)*30mL" is
  DeepSeek-V3's H100 recipe over 32 virtual stages, "Et*4|(t*4|)*14tmL" its GB300 one over 16.
The rules that make these splits exact are checked at load (scenarios/checks.py).
"""

from __future__ import annotations

import re

from meshsim.scenarios.schema import ParallelConfig

_REPEAT = re.compile(r"\(([^()]*)\)\*(\d+)")
_CHAR_REPEAT = re.compile(r"([^()|])\*(\d+)")  # Megatron's x*n: one layer symbol n times
LAYOUT_SYMBOLS = frozenset("tEmL|")
MAX_LAYOUT_CHARS = 100_000  # an expanded layout longer than this is refused (MAX_LAYERS is 1,000)


def _repeat(match: re.Match) -> str:
    body, times = match.group(1), int(match.group(2))
    if len(body) * times > MAX_LAYOUT_CHARS:
        raise ValueError(f"the layout expands past {MAX_LAYOUT_CHARS:,} characters")
    return body * times


def expand_layout(layout: str) -> list[str]:
    """The segments of a Megatron pipeline layout string as PipelineParallelLayerLayout.parse_str_to_list
    reads it (megatron/core/transformer/pipeline_parallel_layer_layout.py @d98e8a64): commas are cosmetic,
    "(...)*n" repetitions are expanded (innermost first), then "x*n" ("Et*4|(t*4|)*14tmL")."""
    text = layout.replace(" ", "").replace(",", "")
    for _ in range(32):  # nesting is bounded by the YAML string length; 32 levels is plenty
        expanded = _REPEAT.sub(_repeat, text)
        if len(expanded) > MAX_LAYOUT_CHARS:
            raise ValueError(f"the layout expands past {MAX_LAYOUT_CHARS:,} characters")
        if expanded == text:
            break
        text = expanded
    text = _CHAR_REPEAT.sub(_repeat, text)
    if len(text) > MAX_LAYOUT_CHARS:
        raise ValueError(f"the layout expands past {MAX_LAYOUT_CHARS:,} characters")
    return text.split("|")


def virtual_stage_layers(parallel: ParallelConfig, layers: int) -> list[int]:
    """Transformer layers per virtual stage, in virtual-stage order."""
    if parallel.pipeline_layout is not None:
        return [seg.count("t") for seg in expand_layout(parallel.pipeline_layout)]
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
