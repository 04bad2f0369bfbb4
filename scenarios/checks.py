"""Cross-field scenario checks: one small function per rule, each raising a UserError with a concrete fix.

`check_scenario(scenario, source, topology_gpus)` runs them in the order of `RULES` and raises the first
violation, so the message is deterministic. Schema errors (types, ranges, unknown keys) are reported
before any of these: `schema_error` (scenarios/schema_errors.py) turns pydantic's first error into a
UserError.

The divisibility rules are Megatron-LM's (Shoeybi et al. 2019; Korthikanti et al. 2022): attention is
split by head and the MLP by ffn column, so tp must divide heads, hidden and ffn_hidden; sequence
parallelism splits the sequence over the tp ranks; with grouped-query attention each rank holds whole
KV heads, replicated t/n_kv times when there are fewer KV heads than ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from meshsim.scenarios.check_base import CheckContext, data_parallel, divisors, gpus_used, use_in
from meshsim.scenarios.check_base import rule_error as _err
from meshsim.scenarios.cp_checks import CP_RULES
from meshsim.scenarios.fsdp_checks import FSDP_RULES
from meshsim.scenarios.instance_checks import INSTANCE_RULES
from meshsim.scenarios.moe_checks import MOE_RULES
from meshsim.scenarios.optimizer_checks import OPTIMIZER_RULES
from meshsim.scenarios.pipeline_checks import (
    check_interleaved_micro_batches,
    check_pipeline_layers,
    check_pipeline_stages,
)
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import unknown_name_error
from meshsim.topologies.gpus import GPUS


def _kv_ok(kv_heads: int, tp: int) -> bool:
    """KV heads split evenly over the tp ranks, or are replicated evenly (tp a multiple of kv_heads)."""
    return kv_heads % tp == 0 if kv_heads >= tp else tp % kv_heads == 0


def valid_tp(scenario: Scenario, gpus: int) -> list[int]:
    """tp degrees the model admits on `gpus` GPUs: common divisors of heads, hidden and ffn_hidden that
    respect the KV-head rule and divide gpus."""
    m = scenario.model
    common = math.gcd(m.heads, m.hidden, m.ffn, gpus)
    return [t for t in divisors(common) if _kv_ok(m.num_kv_heads, t)]


# ----- rules, in reporting order -------------------------------------------------------------------
def check_topology_source(s: Scenario, ctx: CheckContext) -> None:
    t = s.topology
    if (t.preset is None) == (t.file is None):
        given = "both" if t.preset else "neither"
        raise _err(ctx, "topology", {"preset": t.preset, "file": t.file},
                   f"Exactly one of topology.preset and topology.file is required, {given} given",
                   "set exactly one: topology.preset (a name from `meshsim topologies`) or topology.file "
                   "(a topology YAML, relative to the scenario file)")


def check_gpu_preset(s: Scenario, ctx: CheckContext) -> None:
    gpu = s.hardware.gpu
    if gpu is not None and gpu not in GPUS:
        raise unknown_name_error("hardware.gpu", gpu, GPUS, source=ctx.source)


def check_head_dim(s: Scenario, ctx: CheckContext) -> None:
    m = s.model
    if m.head_dim is None and m.mla is None and m.hidden % m.heads:
        near = [m.heads * (m.hidden // m.heads), m.heads * (m.hidden // m.heads + 1)]
        raise _err(ctx, "model.hidden", m.hidden, f"Attention splits hidden into model.heads = {m.heads} "
                   "heads of equal dimension, so heads must divide hidden",
                   f"use hidden a multiple of {m.heads} (e.g. {' or '.join(str(v) for v in near if v)})")


def check_kv_heads(s: Scenario, ctx: CheckContext) -> None:
    m = s.model
    if m.heads % m.num_kv_heads:
        raise _err(ctx, "model.kv_heads", m.kv_heads,
                   f"Each KV head serves heads/kv_heads query heads, but model.heads = {m.heads} is not "
                   "a multiple of it", f"{use_in('kv_heads', divisors(m.heads))}")


def check_gpus_fit(s: Scenario, ctx: CheckContext) -> None:
    gpus = s.parallel.gpus
    if gpus is not None and gpus > ctx.topology_gpus:
        per_node = ctx.gpus_per_node or ctx.topology_gpus // s.topology.nodes
        nodes, need = ctx.topology_gpus // per_node, math.ceil(gpus / per_node)
        raise _err(ctx, "parallel.gpus", gpus,
                   f"The topology has {ctx.topology_gpus} GPUs ({nodes} node(s) x {per_node})",
                   f"use parallel.gpus <= {ctx.topology_gpus}, or topology.nodes: {need}")


def check_tp_fits(s: Scenario, ctx: CheckContext) -> None:
    tp, gpus = s.parallel.tp, gpus_used(s, ctx.topology_gpus)
    if tp > gpus:
        raise _err(ctx, "parallel.tp", tp, f"tp exceeds the {gpus} GPUs used",
                   f"{use_in('tp', valid_tp(s, gpus))}, or use more GPUs (parallel.gpus / topology.nodes)")


def check_tp_divides_model(s: Scenario, ctx: CheckContext) -> None:
    m, tp = s.model, s.parallel.tp
    for name, size in (("heads", m.heads), ("hidden", m.hidden), ("ffn_hidden", m.ffn)):
        if size % tp:
            raise _err(ctx, "parallel.tp", tp,
                       f"Tensor parallelism splits model.{name} = {size} over tp ranks, and {tp} does not "
                       "divide it", f"{use_in('tp', valid_tp(s, gpus_used(s, ctx.topology_gpus)))}")


def check_tp_kv_heads(s: Scenario, ctx: CheckContext) -> None:
    kv, tp = s.model.num_kv_heads, s.parallel.tp
    if not _kv_ok(kv, tp):
        how = ("KV heads are replicated when kv_heads < tp, so tp must be a multiple of kv_heads"
               if kv < tp else "each tp rank holds kv_heads/tp whole KV heads, so tp must divide kv_heads")
        raise _err(ctx, "parallel.tp", tp, f"model.kv_heads = {kv}: {how}",
                   f"{use_in('tp', valid_tp(s, gpus_used(s, ctx.topology_gpus)))}")


def check_dp_matches_gpus(s: Scenario, ctx: CheckContext) -> None:
    p, gpus = s.parallel, gpus_used(s, ctx.topology_gpus)
    model = p.tp * p.cp * p.pp
    names = "tp x cp x pp" if p.cp > 1 else "tp x pp"
    sizes = f"{p.tp} x {p.cp} x {p.pp}" if p.cp > 1 else f"{p.tp} x {p.pp}"
    if p.dp == "auto":
        if gpus % p.tp:
            raise _err(ctx, "parallel.tp", p.tp, f"dp = auto needs tp to divide the {gpus} GPUs used",
                       f"{use_in('tp', valid_tp(s, gpus))}, or parallel.gpus a multiple of {p.tp}")
        if gpus % model:
            field, value = ("parallel.cp", p.cp) if p.cp > 1 and gpus % (p.tp * p.pp) == 0 else ("parallel.pp", p.pp)
            raise _err(ctx, field, value, f"dp = auto needs {names} = {sizes} to divide the "
                       f"{gpus} GPUs used ({names} x dp = GPUs)",
                       f"{use_in('pp', [d for d in divisors(gpus // p.tp)])}, or other GPUs" if field == "parallel.pp"
                       else f"{use_in('cp', divisors(gpus // (p.tp * p.pp)))}, or other GPUs")
    elif model * p.dp != gpus:
        raise _err(ctx, "parallel.dp", p.dp, f"{names} x dp = {sizes} x {p.dp} = {model * p.dp} but "
                   f"{gpus} GPUs are used", f"set parallel.dp: auto, or parallel.dp: {gpus // model}, or "
                   f"parallel.gpus: {model * p.dp}")


def check_global_batch(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    dp = data_parallel(s, gpus_used(s, ctx.topology_gpus))
    step = p.micro_batch * dp
    if p.global_batch % step:
        lower, upper = p.global_batch // step * step, (p.global_batch // step + 1) * step
        options = f"{lower} or {upper}" if lower else f"{upper}"
        raise _err(ctx, "parallel.global_batch", p.global_batch,
                   f"It must be a multiple of micro_batch x dp = {p.micro_batch} x {dp} = {step}",
                   f"use global_batch {options}, or change parallel.micro_batch")


def check_sequence_parallel(s: Scenario, ctx: CheckContext) -> None:
    p, seq = s.parallel, s.model.seq_len
    if p.sp and p.tp == 1:
        raise _err(ctx, "parallel.sp", p.sp, "Sequence parallelism shards activations over the tp group "
                   "and needs tp > 1", "set parallel.sp: false, or parallel.tp > 1")
    if p.sp and seq % p.tp:
        lower = seq // p.tp * p.tp
        raise _err(ctx, "model.seq_len", seq, f"Sequence parallelism splits the sequence over tp = {p.tp} "
                   "ranks", f"use seq_len a multiple of {p.tp} (e.g. {lower or p.tp}), or parallel.sp: false")


def check_tp_comm_overlap(s: Scenario, ctx: CheckContext) -> None:
    """Megatron-LM asserts sequence parallelism for --tp-comm-overlap (megatron/training/arguments.py
    @d98e8a64 L1441-1442), and turns SP off at tp = 1 just before."""
    p = s.parallel
    if p.tp_comm_overlap and not p.sp:
        raise _err(ctx, "parallel.tp_comm_overlap", True, "Megatron overlaps TP communication with the GEMMs "
                   "only under sequence parallelism", "set parallel.sp: true (with tp > 1), or "
                   "parallel.tp_comm_overlap: false")


def check_recompute_modules(s: Scenario, ctx: CheckContext) -> None:
    """Megatron-LM reads --recompute-modules only under --recompute-granularity selective; mla_up_proj
    needs MLA and moe_act an MoE layer to act on."""
    p, m = s.parallel, s.model
    mods = p.recompute_modules
    if mods is None:
        return
    if p.recompute != "selective":
        raise _err(ctx, "parallel.recompute_modules", mods, "Recompute modules apply to selective recompute",
                   "set parallel.recompute: selective, or remove parallel.recompute_modules")
    for name, present, what in (("mla_up_proj", m.mla is not None, "model.mla"), ("moe_act", m.moe is not None,
                                                                                 "model.moe")):
        if name in mods and not present:
            raise _err(ctx, "parallel.recompute_modules", mods, f"{name} recomputes a part the model lacks",
                       f"remove {name}, or add {what}")


def check_param_gather_overlap(s: Scenario, ctx: CheckContext) -> None:
    """Megatron-LM: --overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce."""
    p = s.parallel
    if p.overlap_param_gather and not (p.distributed_optimizer and p.dp_overlap):
        raise _err(ctx, "parallel.overlap_param_gather", True, "Overlapping the parameter all-gather needs the "
                   "distributed optimizer and overlapped gradient reduction", "set parallel.distributed_optimizer: "
                   "true and parallel.dp_overlap: true, or drop parallel.overlap_param_gather")


Rule = Callable[[Scenario, CheckContext], None]

RULES: tuple[Rule, ...] = (
    check_topology_source,
    check_gpu_preset,
    check_pipeline_stages,
    check_pipeline_layers,
    check_head_dim,
    check_kv_heads,
    check_gpus_fit,
    check_tp_fits,
    check_tp_divides_model,
    check_tp_kv_heads,
    check_dp_matches_gpus,
    check_global_batch,
    check_interleaved_micro_batches,
    check_sequence_parallel,
    check_tp_comm_overlap,
    check_recompute_modules,
    check_param_gather_overlap,
    *MOE_RULES,
    *OPTIMIZER_RULES,
    *CP_RULES,
    *FSDP_RULES,
    *INSTANCE_RULES,
)


def check_scenario(scenario: Scenario, source: str, topology_gpus: int, gpus_per_node: int | None = None) -> None:
    """Run every cross-field rule in order; raise the first violation as a UserError."""
    ctx = CheckContext(source, topology_gpus, gpus_per_node)
    for rule in RULES:
        rule(scenario, ctx)
