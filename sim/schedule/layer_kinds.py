"""Which ops a transformer layer has: its kind (dense or MoE feed-forward, full or sliding-window
attention) and the per-kind forward / backward templates the builders stamp.

A layer's kind follows the model: model.moe.is_moe_layer(l) (Megatron --moe-layer-freq: the first
dense_layers dense, then MoE every `every`-th) and model.windowed(l) (--window-size on all but every
--window-attn-skip-freq-th layer). Attention is MHA / GQA (sim/schedule/layer_ops.py) or MLA
(sim/schedule/mla_ops.py); the feed-forward a dense MLP or an MoE block (sim/schedule/moe_ops.py).
A dense model's layers all have the plain kind, whose templates are layer_ops.forward_template /
backward_template unchanged. Templates are built once per kind. Under an FP8 / NVFP4 recipe with
run.fp8_first_last_layers_bf16 the first and last N decoder layers are of a 16-bit kind (`bf16`): their
plan has FP8 off (Megatron fp8_utils.is_first_last_bf16_layer, @d98e8a64 L711-728).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import ModelConfig, RunConfig
from meshsim.sim.schedule.fp8_rules import Fp8Plan
from meshsim.sim.schedule.layer_ops import (
    backward_template,
    block_backward,
    block_forward,
    blocks,
    forward_template,
)
from meshsim.sim.schedule.mla_ops import MlaDims, mla_backward, mla_dims, mla_forward
from meshsim.sim.schedule.moe_ops import moe_backward, moe_forward
from meshsim.sim.schedule.moe_shapes import MoeDims, moe_dims
from meshsim.sim.schedule.moe_sync import mark_forward_syncs
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.sim.schedule.template import Deps, Template


@dataclass(frozen=True)
class LayerKind:
    moe: bool = False
    window: int | None = None
    bf16: bool = False  # FP8 off in this layer (run.fp8_first_last_layers_bf16)


PLAIN = LayerKind()


def layer_kind(model: ModelConfig, layer: int, run: RunConfig | None = None) -> LayerKind:
    """The kind of `layer`; with `run`, whether it is one of the first / last layers kept in 16 bit."""
    moe = model.moe is not None and model.moe.is_moe_layer(layer)
    bf16 = run is not None and run.bf16_layer(layer, model.layers)
    return LayerKind(moe, model.sliding_window if model.windowed(layer) else None, bf16)


def sixteen_bit(plan: LayerPlan) -> LayerPlan:
    """The plan with FP8 off: the linears (and experts) of a layer kept in 16 bit."""
    moe = replace(plan.moe, fp8=False) if plan.moe is not None else None
    return replace(plan, d=replace(plan.d, fp8=Fp8Plan()), moe=moe)


@dataclass(frozen=True)
class LayerPlan:
    """Per-rank shapes every layer kind is built from."""

    d: LayerDims
    moe: MoeDims | None = None
    mla: MlaDims | None = None


def layer_plan(rs: ResolvedScenario, d: LayerDims) -> LayerPlan:
    mla = rs.scenario.model.mla
    return LayerPlan(d, moe_dims(rs), mla_dims(d, mla) if mla is not None else None)


def kind_forward(tpl: Template, phase: str, plan: LayerPlan, kind: LayerKind, inp: Deps) -> int:
    d = replace(plan.d, window=kind.window) if kind.window else plan.d
    attn, mlp = blocks(d)
    x = mla_forward(tpl, phase, d, plan.mla, inp) if plan.mla else block_forward(tpl, phase, d, attn, inp)
    if kind.moe:
        first = len(tpl.ops)
        out = moe_forward(tpl, phase, d, plan.moe, (x,))
        mark_forward_syncs(tpl, first, phase, plan.moe, d.fp8.on)  # the host's waits for the token counts
        return out
    return block_forward(tpl, phase, d, mlp, (x,))


def kind_templates(plan: LayerPlan, kind: LayerKind) -> tuple[Template, Template]:
    """(forward, backward) templates of one layer of `kind` (full recompute: the forward again first)."""
    if kind.bf16:
        plan, kind = sixteen_bit(plan), replace(kind, bf16=False)
    d = plan.d
    if kind == PLAIN and plan.mla is None:
        return forward_template(d), backward_template(d)
    fwd = Template()
    fwd.marks["out"] = kind_forward(fwd, "fwd", plan, kind, ("in",))
    bwd = Template()
    if d.recompute == "full":
        kind_forward(bwd, "recompute", plan, kind, ())
    dw = replace(d, window=kind.window) if kind.window else d
    attn, mlp = blocks(dw)
    if not kind.moe and d.recomputes("mlp"):
        block_forward(bwd, "recompute", dw, mlp, ())
    g = moe_backward(bwd, dw, plan.moe, ("gin",)) if kind.moe else block_backward(bwd, dw, mlp, ("gin",))
    out = mla_backward(bwd, dw, plan.mla, (g,)) if plan.mla else block_backward(bwd, dw, attn, (g,))
    bwd.grads.append((out, d.norm_params_per_layer))
    bwd.marks["out"] = out
    return fwd, bwd


def sp_params(plan: LayerPlan, kind: LayerKind) -> int:
    """Parameters of one layer replicated over the TP ranks but updated from sequence shards under SP, whose
    gradients are summed over tp once per step (sim/schedule/dp_ops.py): the two norms (and model.qk_norm's
    q and k norms, LayerDims.norm_params_per_layer), the row-parallel
    biases, MLA's duplicated down projections and latent norms, and an MoE layer's router (replicated,
    fed the sequence-sharded tokens)."""
    d = plan.d
    total = d.norm_params_per_layer + (d.hidden if d.bias else 0)  # norms, the attention output bias
    if plan.mla is not None:
        total += plan.mla.down_params(d.hidden)
    if kind.moe:
        total += plan.moe.router_params + (d.hidden if d.bias and plan.moe.shared_ffn else 0)
    else:
        total += d.hidden if d.bias else 0  # the MLP's fc2 bias
    return total


def kv_replica_params(plan: LayerPlan) -> int:
    """GQA with kv_heads < tp: this rank's replicated K and V projections of one layer, [h, head_dim] each
    (+ biases); none for MLA (its K/V come from the latent, split by head)."""
    d = plan.d
    return 0 if plan.mla is not None else 2 * d.head_dim * (d.hidden + (1 if d.bias else 0))
