"""The TP/SP duality table, defined once; `sim` (schedule builder) and `validate` (autograd Functions) import it.

A tensor-parallel region is entered and left through four conjugate operators (Megatron's mappings):

| name       | forward        | backward       | dim  | where                                       |
|------------|----------------|----------------|------|---------------------------------------------|
| f          | identity       | all-reduce     | -    | entering a TP region (before column-parallel)|
| g          | all-reduce     | identity       | -    | leaving a TP region (after row-parallel)     |
| sp_gather  | all-gather     | reduce-scatter | seq  | entering a TP region under SP                |
| sp_scatter | reduce-scatter | all-gather     | seq  | leaving a TP region under SP                 |

Each operator's backward is its conjugate's forward: f <-> g, sp_gather <-> sp_scatter.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class CommOp(str, Enum):
    IDENTITY = "identity"
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"


@dataclass(frozen=True)
class Boundary:
    """One TP-region boundary operator: what it does forward and backward, and along which dim."""

    name: str
    forward: CommOp
    backward: CommOp
    dim: str | None  # "seq" for the SP pair (dimension 0 of an [s, b, h] activation); None otherwise

    def op(self, phase: str) -> CommOp:
        """The collective this boundary issues in phase 'fwd', 'recompute' (the forward again) or 'bwd'."""
        return self.backward if phase == "bwd" else self.forward


F = Boundary("f", CommOp.IDENTITY, CommOp.ALL_REDUCE, None)
G = Boundary("g", CommOp.ALL_REDUCE, CommOp.IDENTITY, None)
SP_GATHER = Boundary("sp_gather", CommOp.ALL_GATHER, CommOp.REDUCE_SCATTER, "seq")
SP_SCATTER = Boundary("sp_scatter", CommOp.REDUCE_SCATTER, CommOp.ALL_GATHER, "seq")

DUALITY: dict[str, Boundary] = {b.name: b for b in (F, G, SP_GATHER, SP_SCATTER)}
CONJUGATE: dict[str, str] = {"f": "g", "g": "f", "sp_gather": "sp_scatter", "sp_scatter": "sp_gather"}


def region_boundaries(sequence_parallel: bool) -> tuple[Boundary, Boundary]:
    """(entry, exit) operators of a TP region: (f, g) without SP, (sp_gather, sp_scatter) with SP."""
    return (SP_GATHER, SP_SCATTER) if sequence_parallel else (F, G)
