"""One transformer layer of the real stack: attention, then the dense MLP (validate/stack/layers.py) or, on an
MoE layer (model.moe.is_moe_layer, the simulator's rule: sim/schedule/layer_kinds.py), the MoE block
(validate/stack/moe.py). Full recompute checkpoints the whole layer, so its forward collectives run again
during backward (tagged "recompute")."""

from __future__ import annotations

import torch

from meshsim.validate.stack.layers import Mesh, Plan, attention_block, checkpointed, mlp_block
from meshsim.validate.stack.moe import moe_block


def transformer_layer(x, w: dict, i: int, plan: Plan, mesh: Mesh) -> torch.Tensor:
    ffn = moe_block if plan.moe is not None and plan.moe.is_moe(i) else mlp_block

    def body(t):
        return ffn(attention_block(t, w, i, plan, mesh), w, i, plan, mesh)

    return checkpointed(body, x) if plan.dims.recompute == "full" else body(x)
