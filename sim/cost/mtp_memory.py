"""Memory of multi-token prediction beyond its transformer layers (which sim/cost/memory.py counts as layers of
the last one's kind): parameters and per-micro-batch activations (sim/schedule/mtp_ops.py)."""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.schedule.mtp_ops import eh_proj_params
from meshsim.sim.schedule.shapes import LayerDims, layer_dims


def mtp_extra_params(rs: ResolvedScenario) -> int:
    """One rank's MTP parameters beyond its layers: eh_proj and its two norms, the final norm per depth, and
    with pp > 1 and untied embeddings the loss's stage's copy of the embedding (sim/schedule/mtp_ops.py)."""
    m, d = rs.scenario.model, layer_dims(rs)
    if not m.mtp_layers:
        return 0
    table = d.vocab * d.hidden if rs.pp > 1 and not m.tied_embeddings else 0
    return m.mtp_layers * (eh_proj_params(d) + d.norm_params) + table


def mtp_head_activation_bytes(d: LayerDims, depths: int) -> int:
    """What each MTP depth keeps besides its layer, for one micro-batch: the two norms' inputs and eh_proj's
    [s, b, 2h] input (sequence-sharded under SP), the embedding's dropout mask, and a head's (final-norm and
    logits-GEMM inputs, fp32 logits / softmax)."""
    sharded = d.tokens_out * d.hidden
    per_depth = 4 * sharded * d.dtype_bytes + (sharded if d.dropout else 0) + 2 * sharded * d.dtype_bytes \
        + 4 * d.tokens * d.vocab
    return depths * per_depth
