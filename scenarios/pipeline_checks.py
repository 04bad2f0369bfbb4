"""Pipeline checks (parallel.pp, vp, the layer split and the micro-batch count), Megatron-LM's rules:
every stage holds at least one layer; an even split needs layers (plus the embedding and the loss when
account_for_*_in_split are set) divisible by pp x vp unless first/last-stage layer counts or an explicit
pipeline_layout say otherwise; interleaving (vp > 1) needs micro-batches divisible by pp. Each rule raises
one UserError naming the field, the value and the fix; scenarios/checks.py runs them in its RULES order.
"""

from __future__ import annotations

from meshsim.scenarios.check_base import CheckContext, data_parallel, divisors, gpus_used, use_in
from meshsim.scenarios.check_base import rule_error as _err
from meshsim.scenarios.pipeline_split import LAYOUT_SYMBOLS, expand_layout
from meshsim.scenarios.schema import Scenario


def pipeline_units(s: Scenario) -> int:
    """Layers the pipeline split divides: transformer layers, plus one for the embedding and one for the
    output layer + loss when account_for_embedding_in_split / account_for_loss_in_split are set."""
    p = s.parallel
    return s.model.layers + int(p.account_for_embedding_in_split) + int(p.account_for_loss_in_split)


def check_pipeline_stages(s: Scenario, ctx: CheckContext) -> None:
    p, gpus = s.parallel, gpus_used(s, ctx.topology_gpus)
    if p.pp > gpus:
        raise _err(ctx, "parallel.pp", p.pp, f"pp exceeds the {gpus} GPUs used",
                   f"use pp <= {gpus}, or use more GPUs (parallel.gpus / topology.nodes)")
    if p.pp > s.model.layers:
        raise _err(ctx, "parallel.pp", p.pp, f"Each pipeline stage needs at least one of the "
                   f"model.layers = {s.model.layers} layers", f"use pp <= {s.model.layers}")
    if p.vp > 1 and p.pp == 1:
        raise _err(ctx, "parallel.vp", p.vp, "Virtual stages interleave the chunks of several pipeline "
                   "stages and need pp > 1", "set parallel.vp: 1, or parallel.pp > 1")
    if p.vp > 1 and p.pp <= 2 and p.p2p_overlap:
        raise _err(ctx, "parallel.vp", p.vp, f"Megatron's interleaved schedule with overlapped P2P "
                   f"communication (parallel.p2p_overlap: true) needs pp > 2, and pp = {p.pp}",
                   "set parallel.p2p_overlap: false, or parallel.pp > 2, or parallel.vp: 1")


def _uneven_split(s: Scenario, ctx: CheckContext) -> None:
    p, layers = s.parallel, s.model.layers
    first, last = p.first_stage_layers, p.last_stage_layers
    field, value = ("parallel.first_stage_layers", first) if first is not None else ("parallel.last_stage_layers", last)
    if p.vp > 1 or p.pp == 1 or p.account_for_embedding_in_split or p.account_for_loss_in_split:
        raise _err(ctx, field, value, "Uneven first/last stages need pp > 1, vp = 1 and neither "
                   "account_for_*_in_split option", f"remove {field}, or set parallel.vp: 1 and pp > 1")
    middle_stages = p.pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if rest < 0 or (middle_stages == 0 and rest != 0) or (middle_stages > 0 and (rest % middle_stages or rest == 0)):
        raise _err(ctx, field, value, f"The other {middle_stages} stage(s) must split the remaining "
                   f"{rest} of model.layers = {layers} layers evenly (at least one each)",
                   "choose first/last_stage_layers so that the rest divides evenly over the other stages")


def _explicit_layout(s: Scenario, ctx: CheckContext) -> None:
    """A pipeline_layout string: only its symbols, whole repetitions, pp x vp segments, model.layers 't's,
    'E' only at the start of the first segment and 'L' only at the end of the last, no other split option."""
    p, text = s.parallel, s.parallel.pipeline_layout
    try:
        segments = expand_layout(text) if set(text.replace(" ", "")) <= LAYOUT_SYMBOLS | set("()*,0123456789") else None
    except ValueError as exc:
        raise _err(ctx, "parallel.pipeline_layout", text[:60], f"It is too long: {exc}",
                   "write at most model.layers layers") from None
    problem, fix = None, "write one '|'-separated segment per virtual stage, e.g. Et|(tt|)*30mL for 32"
    if segments is None or any(set(seg) - LAYOUT_SYMBOLS for seg in segments):
        problem = "It may hold only t, E, m, L, '|', ',' and '(...)*n' / 'x*n' repetitions"
    elif len(segments) != p.pp * p.vp:
        problem = f"It has {len(segments)} segments and pp x vp = {p.pp * p.vp} virtual stages"
    elif sum(seg.count("t") for seg in segments) != s.model.layers:
        problem = f"Its segments hold {sum(seg.count('t') for seg in segments)} 't' layers, model.layers = {s.model.layers}"
    elif "".join(segments).count("E") != 1 or not segments[0].startswith("E") or \
            "".join(segments).count("L") != 1 or not segments[-1].endswith("L"):
        problem = "The embedding 'E' must open the first segment and the loss 'L' close the last, once each"
    elif "".join(segments).count("m") != s.model.mtp_layers or segments[-1].count("m") != s.model.mtp_layers:
        problem = (f"Its 'm' layers ({''.join(segments).count('m')}) must all sit in the last segment, with the "
                   f"loss, and number model.mtp_layers = {s.model.mtp_layers} (Megatron places every MTP layer "
                   "on one virtual stage; meshsim runs them beside the loss)")
        fix = ("put model.mtp_layers 'm's in the last segment, before 'L' (e.g. ...|mL), or set model.mtp_layers "
               "to their count")
    elif p.first_stage_layers is not None or p.last_stage_layers is not None or \
            p.account_for_embedding_in_split or p.account_for_loss_in_split:
        problem = "A layout replaces first/last_stage_layers and the account_for_*_in_split options"
    if problem is not None:
        raise _err(ctx, "parallel.pipeline_layout", text, problem, fix)


def check_pipeline_layers(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if p.pipeline_layout is not None:
        _explicit_layout(s, ctx)
        return
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        _uneven_split(s, ctx)
        return
    units, split = pipeline_units(s), p.pp * p.vp
    if units % split or units // split < 1:
        what = f"model.layers = {s.model.layers}" + ("" if units == s.model.layers else f" (+ embedding/loss = {units})")
        fits = [d for d in divisors(units) if d % p.vp == 0 and d // p.vp <= ctx.topology_gpus]
        options = sorted({d // p.vp for d in fits})
        raise _err(ctx, "parallel.pp", p.pp, f"pp x vp = {p.pp} x {p.vp} = {split} must divide {what}",
                   f"{use_in('pp', options)} at vp = {p.vp}, or change parallel.vp, or {_other_split(s, split)}")


def _other_split(s: Scenario, split: int) -> str:
    """The fix that keeps pp and vp: the account_for_*_in_split options that make the units divide (Megatron's
    --account-for-embedding/loss-in-pipeline-split), else a split written out (uneven stages or a layout,
    each of which replaces those options)."""
    p, layers = s.parallel, s.model.layers
    was = (p.account_for_embedding_in_split, p.account_for_loss_in_split)
    for now in ((True, True), (True, False), (False, True)):
        units = layers + sum(now)
        if units % split == 0 and units >= split and now[0] >= was[0] and now[1] >= was[1]:
            names = " and ".join(f"parallel.account_for_{part}_in_split: true"
                                 for part, on, before in zip(("embedding", "loss"), now, was, strict=True)
                                 if on and not before)
            return f"set {names} ({units} / {split} = {units // split} per virtual stage)"
    instead = " in place of the account_for_*_in_split options" if any(was) else ""
    if p.vp == 1:
        return f"give parallel.first_stage_layers / last_stage_layers, or parallel.pipeline_layout{instead}"
    return f"write the split as parallel.pipeline_layout ({split} '|'-separated segments){instead}"


MEGATRON_GROUP_RULE = "Megatron-LM's interleaved schedule (schedules.py, forward_backward_pipelining_with_interleaving)"


def check_interleaved_micro_batches(s: Scenario, ctx: CheckContext) -> None:
    """Megatron's interleaved schedule: p <= N <= m (else ValueError), and m mod N is 0 or >= p (else
    RuntimeError, "dependency bubbles"); N = group size, default p (Megatron-LM d98e8a64
    megatron/core/pipeline_parallel/schedules.py L1160-1180, model_parallel_config.py L567-568). These are the
    only values it refuses: every other N builds and runs (sim/schedule/pipeline.py received_after)."""
    p = s.parallel
    if p.vp == 1:
        return  # Megatron's non-interleaved schedule ignores the group size
    dp = data_parallel(s, gpus_used(s, ctx.topology_gpus))
    if dp < 1 or p.global_batch % (p.micro_batch * dp):
        return  # reported by check_dp_matches_gpus / check_global_batch
    m, n = p.global_batch // (p.micro_batch * dp), p.microbatch_group_size or p.pp
    field, value = ("parallel.microbatch_group_size", n) if p.microbatch_group_size else ("parallel.global_batch",
                                                                                       p.global_batch)
    if not p.pp <= n <= m:
        raise _err(ctx, field, value, f"{MEGATRON_GROUP_RULE} needs pp <= microbatch_group_size <= "
                   f"micro-batches, here {p.pp} <= {n} <= {m} fails", _group_fix(p, m, dp, n))
    if m % n and m % n < p.pp:
        raise _err(ctx, field, value, f"micro-batches {m} mod microbatch_group_size {n} = {m % n} is neither "
                   f"0 nor >= pp = {p.pp} (the dependency-bubble rule of {MEGATRON_GROUP_RULE})",
                   _group_fix(p, m, dp, n))


def _group_fix(p, m: int, dp: int, n: int) -> str:
    """The fix: group sizes that work with these micro-batches, else the global batch that fits N."""
    sizes = [g for g in range(p.pp, m + 1) if m % g == 0 or m % g >= p.pp]
    if p.microbatch_group_size and sizes:
        shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
        return (f"set parallel.microbatch_group_size to one of {shown} (for {m} micro-batches), or remove it "
                f"(default pp = {p.pp})" + ("" if p.pp in sizes else f" and use global_batch a multiple of "
                                             f"{p.pp * p.micro_batch * dp}"))
    least = max(n, p.pp)
    return (f"use global_batch a multiple of {n * p.micro_batch * dp} (micro-batches >= {least}, a multiple of "
            f"{n}), or parallel.microbatch_group_size between pp and the micro-batches")
