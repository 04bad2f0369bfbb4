"""Numerics: the real TP/SP step equals the single-process reference, and issues the schedule's collectives.

For each variant of the shrunk scenario every rank builds the full model from one seed, runs the
reference on the whole batch (all DP ranks' sequences), then its own shard of the parallel step, and
asserts with torch.testing.assert_close (TOLERANCES by dtype) that the loss, its logits shard and EVERY
parameter shard's gradient equal the reference's. A mismatch names the tensor, the rank and the max error.

Variant specs join modifiers with "+": tp | sp, gelu | swiglu | quick_geglu, mha | gqa (kv = tp/2, so KV heads are
replicated when tp > 1), none | selective | full (recompute), tied, qknorm (model.qk_norm: a norm over each
query and key head), dp1 | dp2 | dp4 (tp = nproc, nproc/2
or nproc/4; default: the scenario's tp, shrunk; with a pipeline, tp = nproc / pp, ...), pipelines pp1 (none:
a pipelined scenario's default variants without a pipeline modifier take it) | pp2 | pp4 (1F1B), vp2
(interleaved), nooverlap (P2P not overlapped), and the negative controls swap_fg (entry
and exit boundaries replaced by their conjugates), no_ln_allreduce (without the norm-gradient all-reduce:
SP, or qknorm at tp > 1), swap_p2p (each P2P batch issued in reverse order) and drop_mb_grad (the last micro-batch's
weight gradients discarded); the pipeline faults need a pipeline. A pipeline variant runs each stage's
chunks in the simulator's order (validate/stack/pipeline.py) and compares every rank's P2P calls with its
stage schedule's, op by op.

An MoE scenario (model.moe; validate/stack/moe.py runs its layers) takes the MoE modifiers ep1 | ep2 | ep4
(parallel.ep, with launch/shrink.moe_experts experts), etp2, softmax | sigmoid (router), grouped
(group-limited routing), shared (a shared expert), dense1 (the first layer dense), bias (biases on every
linear), and the negative controls wrong_permute and wrong_combine (ep > 1; validate/stack/moe.py). Its
default variants are MOE_SPECS[nproc]. Every variant is checked by the scenario rules before any process
starts (scenarios/moe_checks.py: e.g. etp > 1 refuses biases). A variant that names its activation (gelu,
swiglu, quick_geglu) takes that family's default biases (sim/schedule/model_family.py), not the scenario's own
`model.bias` (GPT-OSS sets it for its quick-GEGLU); `bias` adds them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

from meshsim.scenarios.load import resolve
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules, pipeline_shape
from meshsim.validate.launch.launch import launch
from meshsim.validate.launch.shrink import NUMERICS, moe_experts, shrink, with_changes
from meshsim.validate.numerics.opcount import (
    compare_p2p,
    compare_records,
    mean_routed_sizes,
    routing_imbalance,
    schedule_p2p_records,
    schedule_records,
)
from meshsim.validate.numerics.tolerances import TOLERANCES
from meshsim.validate.numerics.worker import run_variants

MOE_FAULTS = ("wrong_permute", "wrong_combine")  # validate/stack/moe.py
FAULTS = ("swap_fg", "no_ln_allreduce", "swap_p2p", "drop_mb_grad", *MOE_FAULTS)
PIPELINE_FAULTS = ("swap_p2p", "drop_mb_grad")  # validate/stack/pipeline.py; need a pp token
LAYOUTS = {"dp1": 1, "dp2": 2, "dp4": 4}
EXPERT_PARALLEL = {"ep1": 1, "ep2": 2, "ep4": 4}
MOE_TOKENS = (*EXPERT_PARALLEL, "etp2", "softmax", "sigmoid", "grouped", "shared", "dense1", "bias")
# the default variants of an MoE scenario: ep 2 and 4, etp 2, both routers, grouped routing, shared expert,
# gelu with biases and swiglu, SP, full recompute, expert gradients over edp, and a pipeline
MOE_SPECS = {
    2: ["dp2+tp+swiglu+ep2", "dp2+tp+gelu+sigmoid+grouped+shared+ep2", "dp1+sp+swiglu+shared+full+ep2",
        "dp2+tp+swiglu+ep1+etp2+sigmoid", "dp1+sp+swiglu+dense1+ep1"],
    4: ["dp4+tp+swiglu+ep4", "dp2+sp+swiglu+sigmoid+shared+ep4", "dp2+sp+gelu+grouped+shared+full+ep2",
        "dp4+tp+swiglu+ep2+etp2+grouped", "dp2+sp+swiglu+ep2+etp2+shared+sigmoid", "dp1+sp+gelu+dense1+ep4",
        "pp2+dp1+sp+swiglu+shared+ep2"],
}
PIPELINES = {"pp1": {"pp": 1}, "pp2": {"pp": 2}, "pp4": {"pp": 4}, "vp2": {"vp": 2},
             "nooverlap": {"p2p_overlap": False}}
MATRIX = (("tp", "sp"), ("gelu", "swiglu"), ("mha", "gqa"), ("none", "selective", "full"))


@dataclass(frozen=True)
class Variant:
    name: str
    scenario: Scenario
    faults: tuple[str, ...] = ()


@dataclass(frozen=True)
class VariantResult:
    name: str
    ok: bool
    mismatches: list[dict]  # {tensor, rank, max_abs_err, max_abs_ref}, worst first
    errors: list[str]  # exceptions, "rank N: ..."
    checked: int  # tensors compared over all ranks
    calls: list[dict]  # rank 0's counted collectives (opcount.CallRecord as dicts)
    op_diffs: list[str] | None  # differences from the schedule; None when not compared (error / compare_ops off)
    imbalance: float | None = None  # MoE: max / mean rows the experts received (opcount.routing_imbalance)


def moe_specs(nproc: int) -> list[str]:
    """An MoE scenario's default variants: MOE_SPECS[nproc], else the scenario's own layout, shrunk."""
    return MOE_SPECS.get(nproc, [""])


def default_specs(nproc: int, tp_one: bool = False) -> list[str]:
    """The whole matrix at the scenario's layout, plus a DP layout (nproc >= 2). `tp_one`: the scenario has no
    tensor parallelism (tp 1), where SP variants without a layout cannot run: they run at dp 1 (tp = the
    processes a stage has) instead, and the scenario's own data-parallel layout is the dp variants'. (A
    scenario with tp > 1 whose tp shares no factor with nproc is refused with the --nproc to use.)"""
    specs = ["+".join(combo) for combo in itertools.product(*MATRIX)]
    if nproc >= 4:
        specs += ["dp2+sp+swiglu+gqa+full", "dp2+tp+gelu+mha+none"]
    elif nproc == 2:
        specs += ["dp2+tp+gelu+mha+none"]
    specs += pipeline_specs(nproc)
    return [_at_dp1(s) for s in specs] if tp_one else specs


def _at_dp1(spec: str) -> str:
    """An SP spec without a layout token, run at dp 1 (after its pipeline tokens)."""
    tokens = spec.split("+")
    if "sp" not in tokens or set(tokens) & set(LAYOUTS):
        return spec
    cut = next(i for i, t in enumerate(tokens) if t not in PIPELINES)
    return "+".join([*tokens[:cut], "dp1", *tokens[cut:]])


def scenario_defaults(scenario: Scenario, nproc: int) -> list[str]:
    """The default variants of `scenario` (moe_specs or default_specs); a pipelined scenario runs those
    without a pipeline modifier unpipelined ("pp1"), since the pipeline variants cover its stages."""
    specs = moe_specs(nproc) if scenario.model.moe is not None else default_specs(nproc, scenario.parallel.tp == 1)
    if scenario.parallel.pp == 1:
        return specs
    return [s if set(s.split("+")) & set(PIPELINES) else "+".join(t for t in ("pp1", s) if t) for s in specs]


def pipeline_specs(nproc: int) -> list[str]:
    """Pipeline variants that fit nproc processes: 1F1B and interleaved (without P2P overlap on two stages,
    Megatron's rule), on two stages (tp = nproc / 2 when nproc >= 4: tp x pp) and on four."""
    specs = []
    if nproc == 2:
        specs += ["pp2+tp+gelu+tied", "pp2+vp2+nooverlap+tp+swiglu+gqa"]
    if nproc % 4 == 0:
        specs += ["pp2+sp+swiglu+gqa", "pp2+tp+gelu+tied", "pp2+vp2+nooverlap+sp+gelu+tied"]
        specs += ["pp4+dp1+tp+gelu+tied", "pp4+dp1+vp2+tp+swiglu+tied", "pp4+dp1+vp2+nooverlap+tp+gelu"]
    return specs


def _token_changes(token: str, tp: int, heads: int) -> dict:
    simple = {"tp": {"sp": False}, "sp": {"sp": True}, "gelu": {"mlp": "gelu", "bias": None},
              "swiglu": {"mlp": "swiglu", "bias": None}, "quick_geglu": {"mlp": "quick_geglu", "bias": None},
              "none": {"recompute": "none"}, "selective": {"recompute": "selective"},
              "full": {"recompute": "full"}, "tied": {"tied_embeddings": True}, "mha": {"kv_heads": None},
              "qknorm": {"qk_norm": True},
              "gqa": {"kv_heads": max(1, tp // 2) if tp > 1 else max(1, heads // 2)}}
    if token not in simple:
        raise UserError("--variants", token, "use modifiers " + ", ".join(
            [*simple, *LAYOUTS, *PIPELINES, *MOE_TOKENS, *FAULTS]) + " joined with '+', e.g. sp+swiglu+gqa+full",
            problem="Unknown variant modifier")
    return simple[token]


def _moe_changes(tokens: list[str], s: Scenario, spec: str) -> dict:
    """The model.moe / parallel changes of a spec's MoE modifiers (module docstring)."""
    if not set(tokens) & set(MOE_TOKENS + MOE_FAULTS):
        return {}
    moe = s.model.moe
    if moe is None:
        raise UserError("--variants", spec, "use MoE modifiers with an MoE scenario (model.moe), e.g. "
                        "mixtral-8x7b-h100-ep8", problem="The scenario has no MoE layers")
    ep = next((EXPERT_PARALLEL[t] for t in tokens if t in EXPERT_PARALLEL), s.parallel.ep)
    traits: dict = {"experts": moe_experts(ep)}
    for token, change in (("softmax", {"router": "softmax"}), ("sigmoid", {"router": "sigmoid"}),
                          ("grouped", {"router_groups": 2, "router_group_topk": 1}),
                          ("shared", {"shared_ffn_hidden": s.model.hidden}), ("dense1", {"dense_layers": 1})):
        if token in tokens:
            traits.update(change)
    return {"moe": moe.model_copy(update=traits), "ep": ep, "etp": 2 if "etp2" in tokens else s.parallel.etp}


def make_variant(base: Scenario, spec: str, nproc: int, source: str = "") -> Variant:
    """The shrunk scenario a spec describes (module docstring)."""
    tokens = [t for t in spec.split("+") if t]
    pipe = {k: v for t in tokens if t in PIPELINES for k, v in PIPELINES[t].items()}
    if pipe:
        base = with_changes(base, **{"pp": 1, "vp": 1, "p2p_overlap": True, **pipe})
    stages = pipe.get("pp", math.gcd(base.parallel.pp, nproc))
    if nproc % stages:
        raise UserError("--variants", spec, f"use an --nproc that is a multiple of pp = {stages}",
                        problem="The pipeline stages do not divide the processes")
    layout = [LAYOUTS[t] for t in tokens if t in LAYOUTS]
    if layout:
        base = with_changes(base, tp=max(1, nproc // stages // layout[0]), kv_heads=None)
    s = shrink(base, nproc, NUMERICS, source)
    if set(tokens) & set(PIPELINE_FAULTS) and s.parallel.pp == 1:
        raise UserError("--variants", spec, "add pp2 or pp4 to the spec", problem="A pipeline fault needs pp > 1")
    changes: dict = _moe_changes(tokens, s, spec)
    for token in tokens:
        if token not in FAULTS and token not in LAYOUTS and token not in PIPELINES and token not in MOE_TOKENS:
            changes.update(_token_changes(token, s.parallel.tp, s.model.heads))
    if "bias" in tokens:  # the MoE modifier, after any activation token's family default
        changes["bias"] = True
    if changes.get("sp") and s.parallel.tp == 1:
        raise UserError("--variants", spec, "drop 'sp' or use a layout with tp > 1",
                        problem="Sequence parallelism needs tp > 1")
    faults = tuple(t for t in tokens if t in FAULTS)
    return Variant(spec, with_changes(s, **changes), faults)


def _resolved(variant: Variant, source: str):
    return resolve(variant.scenario, source or f"builtin:{variant.scenario.name}")


def _checked(variant: Variant, source: str) -> None:
    """The variant passes the scenario rules (scenarios/checks.py), else one line naming the variant."""
    try:
        _resolved(variant, source)
    except UserError as err:
        raise UserError("--variants", variant.name or "(the scenario's own layout)", err.fix, problem=f"The shrunk "
                        f"scenario breaks a rule ({err.field} = {err.value}: {err.problem})") from None


def _op_diffs(variant: Variant, source: str, calls: list[dict]) -> list[str]:
    """Counted collectives vs the schedule of the same shrunk scenario."""
    schedule = build_schedule(_resolved(variant, source))
    planned = schedule_records(schedule, variant.scenario.model.dtype_bytes)
    return compare_records(calls, planned)


def _pipeline_diffs(variant: Variant, source: str, rows: list[dict]) -> list[str]:
    """Per rank: the counted P2P transfers against its stage schedule's, op by op (kind, peer, size,
    batch, order), and its counted collectives of every micro-batch against the stage schedule's."""
    schedules = build_stage_schedules(_resolved(variant, source))
    dtype_bytes = variant.scenario.model.dtype_bytes
    lines = []
    for r in rows:
        stage = schedules[r["stage"]]
        lines += compare_p2p(r["p2p"], schedule_p2p_records(stage, r["rank"], dtype_bytes), r["rank"])
        planned = [c for c in schedule_records(stage, dtype_bytes, None) if c.group != "dp"]
        counted = [c for c in r["calls"] if c["group"] != "dp"]
        lines += [f"rank {r['rank']} {line}" for line in compare_records(counted, planned)]
    return lines


def merge(variants: list[Variant], per_rank: list[list[dict]], source: str, *,
          compare_ops: bool = True) -> list[VariantResult]:
    """Combine every rank's findings per variant, and compare counted collectives with the schedule."""
    out = []
    for i, v in enumerate(variants):
        rows = [ranks[i] for ranks in per_rank]
        routed = mean_routed_sizes([r["calls"] for r in rows])
        imbalance = routing_imbalance([r["calls"] for r in rows])
        rows = [{**r, "calls": calls} for r, calls in zip(rows, routed, strict=True)]
        mismatches = sorted((m for r in rows for m in r["mismatches"]), key=lambda m: -m["max_abs_err"])
        errors = [f"rank {r['rank']}: {r['error']}" for r in rows if r.get("error")]
        calls = rows[0]["calls"]
        if errors or not compare_ops:
            diffs = None
        elif v.scenario.parallel.pp > 1:
            diffs = _pipeline_diffs(v, source, rows)
        else:
            diffs = _op_diffs(v, source, calls)
            for r in rows[1:]:
                if [c["name"] for c in r["calls"]] != [c["name"] for c in calls]:
                    diffs.append(f"rank {r['rank']} issued a different sequence of collectives than rank 0")
        out.append(VariantResult(v.name, not mismatches and not errors, mismatches, errors,
                                 sum(r["checked"] for r in rows), calls, diffs, imbalance))
    return out


def check_numerics(scenario: Scenario, source: str, nproc: int, specs: list[str] | None = None, *,
                   seed: int = 0, dtype: str = "float32", timeout_s: float = 120.0) -> list[VariantResult]:
    """Run every variant in ONE spawn of nproc gloo processes; returns one result per variant."""
    variants, payload = numerics_payload(scenario, source, nproc, specs, seed=seed, dtype=dtype)
    return merge(variants, launch("numerics", payload, nproc, timeout_s=timeout_s), source)


def _variant(scenario: Scenario, spec: str, nproc: int, source: str, *, chosen: bool) -> Variant:
    """make_variant; a default variant that cannot run on nproc processes is blamed on --nproc, not on a
    --variants value the user never gave."""
    try:
        return make_variant(scenario, spec, nproc, source)
    except UserError as err:
        if chosen:
            raise
        raise UserError("--nproc", nproc, "use an --nproc whose shrunk layout has tp > 1 (e.g. 2 or 4), or "
                        "choose variants with --variants", problem=f"The default variant {spec!r} cannot run "
                        f"on {nproc} processes ({err.problem})") from None


def numerics_payload(scenario: Scenario, source: str, nproc: int, specs: list[str] | None, *, seed: int = 0,
                     dtype: str = "float32") -> tuple[list[Variant], dict]:
    """The variants and the worker payload (JSON-serialisable, for spawn or torchrun). Spec "" is the
    scenario's own configuration, shrunk."""
    if dtype not in TOLERANCES:
        raise UserError("--dtype", dtype, f"use one of {', '.join(TOLERANCES)}")
    defaults = scenario_defaults(scenario, nproc)
    variants = [_variant(scenario, spec, nproc, source, chosen=bool(specs)) for spec in (specs or defaults)]
    for v in variants:
        if "swap_fg" in v.faults and v.scenario.parallel.sp:
            raise UserError("--variants", v.name, "use swap_fg with 'tp' (no SP); under SP use no_ln_allreduce",
                            problem="swap_fg under SP changes tensor shapes instead of values")
        if "wrong_combine" in v.faults and v.scenario.parallel.ep == 1:
            raise UserError("--variants", v.name, "add ep2 or ep4", problem="wrong_combine needs an all-to-all")
        _checked(v, source)
    payload = {"seed": seed, "dtype": dtype, "variants": [
        {"name": v.name or "scenario", "scenario": v.scenario.model_dump(mode="json"), "faults": list(v.faults),
         **({"pipeline": asdict(pipeline_shape(_resolved(v, source)))} if v.scenario.parallel.pp > 1 else {})}
        for v in variants]}
    return variants, payload


def numerics_task(payload: dict) -> list[dict]:
    """Worker side (validate/launch/launch.py task "numerics")."""
    return run_variants(payload)
