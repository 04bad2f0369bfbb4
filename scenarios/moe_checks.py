"""Mixture-of-experts and expert-parallel scenario rules, each Megatron-Core's own (file and line at
NVIDIA/Megatron-LM d98e8a64, the snapshot reference/public-measurements-2.md cites):

- experts divisible by ep (megatron/training/arguments.py L1655-1658); ep > 1 or etp > 1 needs an MoE
  model (transformer_config.py L1599);
- the expert mesh etp x ep x edp x pp must tile the GPUs: world % (etp x ep x pp) == 0
  (core/parallel_state.py L871-883, "parallel folding": the experts' mesh beside attention's tp x dp x pp);
- etp divides the per-expert FFN width (the expert linears are column/row-parallel over etp), tp
  divides the shared expert's (an attention-TP MLP, shared_experts.py);
- biases in MoE only with etp == 1 (transformer_config.py L2612-2615);
- MoE with tp > 1 needs sequence parallelism in training (moe/moe_layer.py L636-640);
- group-limited routing: group_topk needs num_groups, experts % num_groups == 0, group_topk <=
  num_groups (transformer_config.py L2671-2688), and top_k % group_topk == 0 (moe_utils.py L712:
  top-(topk // group_topk) scores per group);
- pad_to_capacity needs a capacity factor (transformer_config.py L1862-1866); the flex dispatcher's
  DeepEP backend cannot pad (L1754-1760);
- --overlap-moe-expert-parallel-comm: ep > 1, alltoall or flex dispatcher, no full recompute, and
  virtual stages when pp > 1 (transformer_config.py L3002-3032); --delay-wgrad-compute needs it
  (L3074-3077).
"""

from __future__ import annotations

from collections.abc import Callable

from meshsim.scenarios.check_base import CheckContext, divisors, gpus_used, rule_error, use_in
from meshsim.scenarios.schema import GATED_MLP_NAMES, ModelConfig, Scenario


def linear_bias(m: ModelConfig) -> bool:
    """model.bias, else the model-family default: no biases for gated (swiglu, quick_geglu) MLPs. The rule is
    sim/schedule/model_family.has_linear_bias, which this layer may not import; tests/test_moe_checks.py
    checks that the two agree."""
    return m.bias if m.bias is not None else m.mlp not in GATED_MLP_NAMES


def check_ep_needs_moe(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if s.model.moe is None and (p.ep > 1 or p.etp > 1):
        field, value = ("parallel.ep", p.ep) if p.ep > 1 else ("parallel.etp", p.etp)
        raise rule_error(ctx, field, value, "Expert parallelism splits the experts of an MoE model, and "
                         "model.moe is not set", f"set model.moe (experts, top_k, ffn_hidden), or {field}: 1")


def check_moe_layers(s: Scenario, ctx: CheckContext) -> None:
    moe = s.model.moe
    if moe is None:
        return
    if moe.dense_layers >= s.model.layers:
        raise rule_error(ctx, "model.moe.dense_layers", moe.dense_layers, f"No MoE layer is left of the "
                         f"model.layers = {s.model.layers} layers", f"use dense_layers < {s.model.layers}")
    if moe.top_k > moe.experts:
        raise rule_error(ctx, "model.moe.top_k", moe.top_k, f"Each token picks top_k of the {moe.experts} "
                         "experts", f"use top_k <= {moe.experts}")


def check_gated_activation(s: Scenario, ctx: CheckContext) -> None:
    """--activation-func-clamp-value clamps a GLU's gate and up (Megatron-LM d98e8a64 experts.py / mlp.py
    glu), so it needs a gated MLP. quick_geglu is priced on routed experts only: Megatron fuses it there
    (experts.py weighted_bias_quick_geglu_impl), while a dense MLP or shared expert (mlp.py L300-318) has
    no fused quick-GEGLU and runs it eagerly, which meshsim does not price."""
    m = s.model
    if m.activation_clamp is not None and m.mlp not in GATED_MLP_NAMES:
        raise rule_error(ctx, "model.activation_clamp", m.activation_clamp, f"Megatron clamps the gate and "
                         f"up of a gated MLP, and model.mlp is {m.mlp}",
                         f"use model.mlp: {' or '.join(GATED_MLP_NAMES)}, or drop activation_clamp")
    if m.mlp != "quick_geglu":
        return
    moe = m.moe
    dense = moe is None or moe.dense_layers > 0 or moe.every > 1 or moe.shared_ffn_hidden is not None
    if dense:
        raise rule_error(ctx, "model.mlp", m.mlp, "quick_geglu is priced on routed experts only (Megatron "
                         "runs a dense MLP's or shared expert's quick-GEGLU unfused, which meshsim does not "
                         "price), and this model has dense MLP layers or a shared expert",
                         "use model.mlp: swiglu (the same FLOPs and bytes, fused)")


def check_router_groups(s: Scenario, ctx: CheckContext) -> None:
    moe = s.model.moe
    if moe is None or (moe.router_groups is None and moe.router_group_topk is None):
        return
    groups, topk = moe.router_groups, moe.router_group_topk
    if groups is None or topk is None:
        field = "model.moe.router_groups" if groups is None else "model.moe.router_group_topk"
        raise rule_error(ctx, field, None, "Group-limited routing needs both router_groups and "
                         "router_group_topk", "set both, or neither")
    if moe.experts % groups or topk > groups:
        raise rule_error(ctx, "model.moe.router_groups", groups, f"The {moe.experts} experts split into "
                         f"router_groups equal groups, of which router_group_topk = {topk} are picked",
                         f"{use_in('router_groups', [g for g in divisors(moe.experts) if g >= topk])}")
    if moe.top_k % topk:
        raise rule_error(ctx, "model.moe.router_group_topk", topk, f"Each picked group contributes top_k / "
                         f"router_group_topk experts, and top_k = {moe.top_k}",
                         f"{use_in('router_group_topk', [g for g in divisors(moe.top_k) if g <= groups])}")


def check_capacity(s: Scenario, ctx: CheckContext) -> None:
    moe, p = s.model.moe, s.parallel
    if moe is None or not moe.pad_to_capacity:
        return
    if moe.capacity_factor is None:
        raise rule_error(ctx, "model.moe.pad_to_capacity", True, "Padding to capacity needs a capacity "
                         "factor", "set model.moe.capacity_factor, or pad_to_capacity: false")
    if p.moe_dispatcher == "flex" and p.moe_flex_backend == "deepep":
        raise rule_error(ctx, "model.moe.pad_to_capacity", True, "The flex dispatcher's DeepEP backend "
                         "does not pad experts to capacity", "set parallel.moe_flex_backend: hybridep, or "
                         "pad_to_capacity: false")


def check_experts_ep(s: Scenario, ctx: CheckContext) -> None:
    moe, ep = s.model.moe, s.parallel.ep
    if moe is not None and moe.experts % ep:
        raise rule_error(ctx, "parallel.ep", ep, f"Each expert-parallel rank holds experts / ep whole "
                         f"experts, and {ep} does not divide model.moe.experts = {moe.experts}",
                         f"{use_in('ep', divisors(moe.experts))}")


def check_expert_mesh(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    gpus = gpus_used(s, ctx.topology_gpus)
    fold = p.etp * p.ep * p.pp
    if s.model.moe is not None and gpus % fold:
        raise rule_error(ctx, "parallel.ep", p.ep, f"The experts' mesh etp x ep x edp x pp must tile the "
                         f"{gpus} GPUs, and etp x ep x pp = {p.etp} x {p.ep} x {p.pp} = {fold} does not "
                         "divide them", f"{use_in('ep', [e for e in divisors(gpus // p.pp) if (gpus // p.pp) % (e * p.etp) == 0])}")


def check_expert_widths(s: Scenario, ctx: CheckContext) -> None:
    m, p = s.model, s.parallel
    if m.moe is None:
        return
    if m.moe.ffn_hidden % p.etp:
        raise rule_error(ctx, "parallel.etp", p.etp, f"Expert tensor parallelism splits each expert's "
                         f"model.moe.ffn_hidden = {m.moe.ffn_hidden} over etp ranks",
                         f"{use_in('etp', divisors(m.moe.ffn_hidden)[:8])}")
    if m.moe.shared_ffn_hidden is not None and m.moe.shared_ffn_hidden % p.tp:
        raise rule_error(ctx, "parallel.tp", p.tp, f"The shared expert is a tensor-parallel MLP and tp does "
                         f"not divide model.moe.shared_ffn_hidden = {m.moe.shared_ffn_hidden}",
                         f"{use_in('tp', divisors(m.moe.shared_ffn_hidden)[:8])}")
    if p.etp > 1 and linear_bias(m):
        raise rule_error(ctx, "parallel.etp", p.etp, "Megatron-Core supports biases in MoE layers only with "
                         "etp = 1", "set model.bias: false, or parallel.etp: 1")


def check_moe_sequence_parallel(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if s.model.moe is not None and p.tp > 1 and not p.sp:
        raise rule_error(ctx, "parallel.sp", p.sp, "Megatron-Core trains MoE layers with tp > 1 only under "
                         "sequence parallelism", "set parallel.sp: true, or parallel.tp: 1")


def check_ep_overlap(s: Scenario, ctx: CheckContext) -> None:
    """Megatron-LM d98e8a64 transformer_config.py L3002-3046 (what --overlap-moe-expert-parallel-comm needs)
    and L3074-3077 (--delay-wgrad-compute needs it); the fields meshsim has."""
    p = s.parallel
    if not p.moe_ep_overlap:
        if p.delay_wgrad_compute:
            raise rule_error(ctx, "parallel.delay_wgrad_compute", True, "Delayed weight gradients run inside "
                             "the overlapped expert-parallel schedule", "set parallel.moe_ep_overlap: true, "
                             "or delay_wgrad_compute: false")
        return
    problems = [(p.ep == 1, "it needs ep > 1", "set parallel.ep > 1"),
                (p.moe_dispatcher == "allgather", "it needs the alltoall or flex dispatcher",
                 "set parallel.moe_dispatcher: alltoall"),
                (p.recompute == "full", "it cannot run with full recompute", "set parallel.recompute: selective"),
                (p.pp > 1 and p.vp == 1, "with pp > 1 it needs virtual stages", "set parallel.vp > 1"),
                (s.model.mtp_layers > 1, "it allows at most one multi-token prediction layer (L3042-3046)",
                 "set model.mtp_layers: 1, or moe_ep_overlap: false")]
    for bad, problem, fix in problems:
        if bad:
            raise rule_error(ctx, "parallel.moe_ep_overlap", True, f"Overlapping the expert-parallel "
                             f"all-to-all with another micro-batch's compute: {problem}", fix)


Rule = Callable[[Scenario, CheckContext], None]

MOE_RULES: tuple[Rule, ...] = (
    check_ep_needs_moe,
    check_moe_layers,
    check_gated_activation,
    check_router_groups,
    check_capacity,
    check_experts_ep,
    check_expert_mesh,
    check_expert_widths,
    check_moe_sequence_parallel,
    check_ep_overlap,
)
