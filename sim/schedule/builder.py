"""Assemble one training step on one rank: `build_schedule(rs) -> Schedule`.

Order (gradient accumulation, no pipelining): for each micro-batch, embedding -> layers 0..L-1 forward
-> head forward (output layer + cross-entropy) -> head backward -> layers L-1..0 backward -> embedding
backward; then the step end (SP gradient all-reduce, DP buckets, optimizer step, parameter gather;
sim/schedule/dp_ops.py). Each block's ops are built once as a template (layer_ops.py, head_ops.py) and
stamped per (layer, micro-batch) with ids offset and names prefixed "L{layer}.mb{mb}." (layers),
"embed.mb{mb}.", "head.mb{mb}."; op ids equal list positions and every dep points to an earlier op.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import ModelConfig, RunConfig
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.dp_ops import PARAM_BYTES, DpConfig, all_buckets, bucket_bytes, step_end_ops
from meshsim.sim.schedule.ep_overlap import combined_micro_batches
from meshsim.sim.schedule.fp8_ops import amax_reduce_ops, delayed_amax_gemms
from meshsim.sim.schedule.fp8_rules import FP8_BYTES, weight_cast_work
from meshsim.sim.schedule.fsdp_ops import FsdpConfig, fsdp_micro_batches
from meshsim.sim.schedule.head_ops import embedding_backward, embedding_forward, head_backward, head_forward
from meshsim.sim.schedule.layer_kinds import (
    PLAIN,
    LayerKind,
    LayerPlan,
    kind_templates,
    kv_replica_params,
    layer_kind,
    layer_plan,
    sp_params,
)
from meshsim.sim.schedule.layer_ops import backward_template, forward_template
from meshsim.sim.schedule.moe_shapes import fp8_linear_weights
from meshsim.sim.schedule.mtp_ops import (
    head_backward_with_mtp,
    head_forward_with_mtp,
    model_layer_ids,
    mtp_layer_ids,
)
from meshsim.sim.schedule.muon import newton_schulz_works, owned_muon_params
from meshsim.sim.schedule.ops import Elementwise, Op, Schedule
from meshsim.sim.schedule.optimizer_states import step_plan
from meshsim.sim.schedule.param_gather import fill_param_gathers, reserved_gathers
from meshsim.sim.schedule.run_settings import grad_reduce_bytes
from meshsim.sim.schedule.shapes import LayerDims, layer_dims
from meshsim.sim.schedule.stage_ops import op_list
from meshsim.sim.schedule.stamping import gc_paused, micro_batch_links, stamp_chain
from meshsim.sim.schedule.template import Template


class Templates:
    """The block templates of one step: per layer kind (sim/schedule/layer_kinds.py), embedding, head."""

    def __init__(self, d: LayerDims, tied: bool, plan: LayerPlan | None = None, model: ModelConfig | None = None,
                 run: RunConfig | None = None):
        self.plan, self.model, self.run = plan or LayerPlan(d), model, run
        self._kinds: dict[LayerKind, tuple[Template, Template]] = {}
        self._layers: dict[int, tuple[Template, Template]] = {}  # layer -> self.of(its kind) (layer())
        self.fwd, self.bwd = self.of(PLAIN) if plan is not None else (forward_template(d), backward_template(d))
        self.embed_fwd, self.embed_bwd = embedding_forward(d), embedding_backward(d)
        self.head_fwd, self.head_bwd = head_forward(d), head_backward(d, tied)
        self.amax: tuple[Template, Template] | None = None  # delayed FP8 scaling (fp8_amax_templates)

    def of(self, kind: LayerKind) -> tuple[Template, Template]:
        hit = self._kinds.get(kind)
        if hit is None:
            hit = self._kinds[kind] = kind_templates(self.plan, kind)
        return hit

    def layer(self, layer: int) -> tuple[Template, Template]:
        """(forward, backward) templates of `layer`: self.of(its layer_kind), looked up once per layer (a
        pipeline's builder asks per layer, micro-batch and direction); (fwd, bwd) without a model."""
        hit = self._layers.get(layer)
        if hit is None:
            hit = self._layers[layer] = self.of(layer_kind(self.model, layer, self.run)) \
                if self.model is not None else (self.fwd, self.bwd)
        return hit

    def layer_fwd(self, layer: int) -> Template:
        return self.layer(layer)[0]

    def layer_bwd(self, layer: int) -> Template:
        return self.layer(layer)[1]


def _micro_batch(ops: list[Op], t: Templates, layers: int, mb: int, grads: list[tuple[int, int]] | None,
                 expert_grads: list[tuple[int, int]] | None = None, links: tuple | None = None) -> None:
    """Stamp one micro-batch's forward and backward as one chain (stamping.stamp_chain); record gradient
    producers into `grads` (and the routed experts' into `expert_grads`) if given. `links`:
    stamping.micro_batch_links(t, layers), when the caller has them (the same for every micro-batch)."""
    chain, backward = links if links is not None else micro_batch_links(t, layers)
    bases = stamp_chain(ops, chain, mb, 0)
    for (tpl, *_), base, bwd in zip(chain, bases, backward, strict=True):
        if bwd and grads is not None:
            grads += [(base + i, n) for i, n in tpl.grads]
        if bwd and expert_grads is not None:
            expert_grads += [(base + i, n) for i, n in tpl.expert_grads]


def _grad_params(t: Templates, layers: int, expert: bool = False) -> list[int]:
    """Parameter counts of one micro-batch's gradient producers in backward order (as _micro_batch
    records them): the head, the layers last to first, the embedding (`expert`: the routed experts')."""
    if expert:
        return [n for _, n in t.head_bwd.expert_grads] + \
            [n for layer in reversed(range(layers)) for _, n in t.layer_bwd(layer).expert_grads]
    per_layer = [n for layer in reversed(range(layers)) for _, n in t.layer_bwd(layer).grads]
    return [n for _, n in t.head_bwd.grads] + per_layer + [n for _, n in t.embed_bwd.grads]


def bf16_layers(rs: ResolvedScenario) -> list[int]:
    """Decoder layers kept in 16 bit under an FP8 / NVFP4 recipe (run.fp8_first_last_layers_bf16)."""
    m, run = rs.scenario.model, rs.scenario.run
    return [layer for layer in range(m.layers) if run.bf16_layer(layer, m.layers)]


def fp8_amax_templates(rs: ResolvedScenario, layers: Sequence[int]) -> tuple[Template, Template] | None:
    """Delayed FP8 scaling's per-pass amax reduction and update (sim/schedule/fp8_ops.amax_reduce_ops) over
    the amax group: the stage's tp x dp ranks, or tp with run.tp_only_amax_reduction; None for other recipes."""
    r = rs.scenario.run
    if r.fp8 != "delayed":
        return None
    group, size = ("tp", rs.tp) if r.tp_only_amax_reduction else ("stage", rs.tp * rs.dp)
    m, keep = rs.scenario.model, set(bf16_layers(rs))
    gemms = delayed_amax_gemms(m, rs.ep, [layer for layer in layers if layer not in keep])
    tpls = (Template(), Template())
    for backward, tpl in enumerate(tpls):
        tpl.marks["out"] = amax_reduce_ops(tpl, gemms, bool(backward), r.fp8_amax_history_len,
                                           group if size > 1 else None)
    return tpls


def step_templates(rs: ResolvedScenario, d: LayerDims, tied: bool) -> Templates:
    """The templates of `rs`'s step: per layer kind for MoE / MLA / windowed models and for 16-bit first / last
    layers under FP8 (run.fp8_first_last_layers_bf16), the plain ones else."""
    m, run = rs.scenario.model, rs.scenario.run
    alike = m.moe is None and m.mla is None and m.sliding_window is None and not bf16_layers(rs)
    t = Templates(d, tied) if alike else Templates(d, tied, layer_plan(rs, d), m, run)
    t.amax = fp8_amax_templates(rs, range(m.layers)) if rs.pp == 1 else None
    if m.mtp_layers:  # multi-token prediction rides with the output layer and loss (sim/schedule/mtp_ops.py)
        last = mtp_layer_ids(m)[0]  # the kind of layer a depth runs
        t.head_fwd = head_forward_with_mtp(m.mtp_layers, d, t.head_fwd, t.embed_fwd, t.layer_fwd(last))
        t.head_bwd = head_backward_with_mtp(m.mtp_layers, d, t.head_bwd, head_backward(d, True), t.embed_bwd,
                                            t.layer_bwd(last), own_embedding=rs.pp > 1 and not m.tied_embeddings)
    return t


def dp_bucket_bytes(rs: ResolvedScenario) -> int:
    """DP gradient bucket size (sim/schedule/dp_ops.bucket_bytes)."""
    return bucket_bytes(rs.scenario.parallel.dp_bucket_mib, rs.grad_dp)


def layers_dp_params(rs: ResolvedScenario, t: Templates, layers: list[int], head: bool) -> tuple[int, int]:
    """(SP-replicated, replicated-KV) parameters of `layers` (+ the final norm with the head) whose
    gradients are summed over tp / the KV group once per step (sim/schedule/layer_kinds.py). Without SP,
    model.qk_norm's q and k norms still are (each TP rank normalizes its own heads): Megatron's
    finalize_model_grads sums "q_layernorm" / "k_layernorm" gradients over tp whenever qk_layernorm is on."""
    d, model = t.plan.d, rs.scenario.model
    sp = sum(sp_params(t.plan, layer_kind(model, layer)) for layer in layers) + (d.norm_params if head else 0)
    kv = len(layers) * kv_replica_params(t.plan) if rs.kv_replicas > 1 else 0
    qk = len(layers) * d.qk_norm_params if d.tp > 1 else 0
    return (sp if d.sp else qk), kv


def gather_param_bytes(rs: ResolvedScenario, d: LayerDims, params: int, layers: Sequence[int]) -> float:
    """Bytes per parameter of the DP parameter all-gather: 2, or with run.fp8_param_gather the average of
    1 byte per FP8 linear weight and 2 per other parameter (fp8_rules.py)."""
    if not rs.scenario.run.fp8_param_gather or params == 0:
        return PARAM_BYTES
    fp8 = fp8_linear_weights(rs, d, layers)
    return (PARAM_BYTES * (params - fp8) + FP8_BYTES * fp8) / params


def weight_cast_op(rs: ResolvedScenario, d: LayerDims, layers: Sequence[int], step_op: int,
                   next_id: int, head: bool = False) -> list[Op]:
    """FP8: the linear weights' once-per-step cast (and transpose) after the optimizer step (fp8_rules.py), of
    `layers` and, with `head`, of an FP8 LM head."""
    linear = fp8_linear_weights(rs, d, layers, head)
    if not linear:
        return []
    p = rs.scenario.parallel
    owned = -(-linear // rs.instance_shards[0]) if p.distributed_optimizer else linear  # its shard
    work = weight_cast_work(linear, owned, rs.scenario.run.fp8_param_gather, d.fp8.transpose_free, d.fp8.recipe)
    return [Op(next_id, f"{K.OPT_BLOCK}.{K.FP8_WEIGHT_CAST}", "compute", "compute", "opt", work, (step_op,))]


def dp_config(rs: ResolvedScenario, t: Templates, params: int, expert_params: int = 0) -> DpConfig:
    p, layers = rs.scenario.parallel, rs.scenario.model.layers
    sp, kv = layers_dp_params(rs, t, list(range(layers)), head=True)
    return DpConfig(dp=rs.grad_dp, distributed_optimizer=p.distributed_optimizer, overlap=p.dp_overlap,
                    gather_overlap=p.param_gather_overlapped,
                    bucket_bytes=dp_bucket_bytes(rs), sp_grad_params=sp, params=params,
                    kv_grad_params=kv, grad_bytes=grad_reduce_bytes(rs.scenario), edp=rs.edp,
                    expert_params=expert_params, param_bytes=gather_param_bytes(rs, t.plan.d, params, range(layers)),
                    step=step_plan(rs, owned_muon_params(rs, t.plan.d, model_layer_ids(rs.scenario.model))),
                    pre_step=tuple(newton_schulz_works(rs, t.plan.d, model_layer_ids(rs.scenario.model))),
                    instances=rs.instances)


def gathers_overlap(rs: ResolvedScenario) -> bool:
    """The distributed optimizer's parameter all-gathers open the step (sim/schedule/param_gather.py); under
    FSDP each block gathers its own weights instead (sim/schedule/fsdp_ops.py)."""
    p = rs.scenario.parallel
    return (rs.grad_dp > 1 or rs.edp > 1) and p.distributed_optimizer and p.param_gather_overlapped and not p.fsdp


def fsdp_config(rs: ResolvedScenario, t: Templates) -> FsdpConfig:
    """The gathers' and reduce-scatters' bytes per parameter, and FP8's per-forward weight cast when the
    gathered weights are 16-bit (sim/schedule/fsdp_ops.py)."""
    d, layers, run = t.plan.d, rs.scenario.model.layers, rs.scenario.run
    params = sum(_grad_params(t, layers)) + sum(_grad_params(t, layers, True))
    casts: dict[int, Elementwise | None] = {}

    def cast(layer: int) -> Elementwise | None:
        if layer not in casts:
            n = fp8_linear_weights(rs, d, [layer])
            casts[layer] = weight_cast_work(n, n, False, d.fp8.transpose_free, d.fp8.recipe) if n else None
        return casts[layer]

    return FsdpConfig(rs.grad_dp, rs.edp, gather_param_bytes(rs, d, params, range(layers)),
                      grad_reduce_bytes(rs.scenario), cast if d.fp8.on and not run.fp8_param_gather else None,
                      d.vocab * d.hidden if rs.scenario.model.tied_embeddings else 0, rs.instances)


def build_schedule(rs: ResolvedScenario) -> Schedule:
    """The ops one rank runs in a training step (all ranks of a symmetric TP x DP mesh run the same)."""
    with gc_paused():  # (stamping.gc_paused)
        return _build_schedule(rs)


def _build_schedule(rs: ResolvedScenario) -> Schedule:
    d = layer_dims(rs)
    model = rs.scenario.model
    t = step_templates(rs, d, model.tied_embeddings)
    overlap_gather = gathers_overlap(rs)
    bucket_bytes = dp_bucket_bytes(rs)
    reserved = reserved_gathers(_grad_params(t, model.layers), bucket_bytes, _grad_params(t, model.layers, True),
                                rs.grad_dp, rs.edp) if overlap_gather else 0
    ops = op_list(reserved)  # slots for the gathers that open the step; holds the stamps (stage_ops.py)
    grads: list[tuple[int, int]] = []
    expert_grads: list[tuple[int, int]] = []
    p = rs.scenario.parallel
    if p.fsdp:  # every block gathers its weights and reduce-scatters its gradients (sim/schedule/fsdp_ops.py)
        fsdp_micro_batches(ops, t, model.layers, rs.micro_batches, fsdp_config(rs, t), grads, expert_grads)
    elif p.moe_ep_overlap:  # Megatron's combined 1F1B (sim/schedule/ep_overlap.py)
        combined_micro_batches(ops, t, model.layers, rs.micro_batches, p.delay_wgrad_compute, grads, expert_grads)
    else:
        links = micro_batch_links(t, model.layers)
        for mb in range(rs.micro_batches):
            last = mb == rs.micro_batches - 1
            _micro_batch(ops, t, model.layers, mb, grads if last else None, expert_grads if last else None, links)
    params, expert_params = sum(n for _, n in grads), sum(n for _, n in expert_grads)
    cfg = dp_config(rs, t, params, expert_params)
    ops += step_end_ops(len(ops), grads, len(ops) - 1, cfg, [] if p.fsdp else None, expert_grads)
    step_op = next(op.id for op in reversed(ops) if op.name == "opt.step")
    if not (p.fsdp and d.fp8.on and not rs.scenario.run.fp8_param_gather):  # else cast per forward (fsdp_ops)
        ops += weight_cast_op(rs, d, model_layer_ids(model), step_op, len(ops), head=True)
    if overlap_gather:
        buckets = all_buckets(grads, expert_grads, bucket_bytes, rs.grad_dp, rs.edp, rs.instances)
        ops = fill_param_gathers(ops, buckets, cfg.param_bytes)
    meta = {"chunks": d.chunks, "params_per_rank": params + expert_params, "padded_vocab": d.vocab * d.tp,
            "grad_producers": len(grads) + len(expert_grads), "expert_params_per_rank": expert_params}
    ops_t = ops.frozen()  # the stamps' records are built again when read (sim/schedule/stamped_ops.py)
    return Schedule(ops_t, rs.tp, rs.dp, rs.micro_batches, meta, kv_replicas=rs.kv_replicas, ep=rs.ep,
                    etp=rs.etp, cp=rs.cp, tiling=ops.sealed(ops_t))
