"""The search space: which values each layout axis takes, parsed from --fix / --space, and its layouts.

A layout is a sweep configuration (sim/sweep/axes.SweepPoint: tp, sp, micro_batch, tp_comm_overlap,
recompute, pp, vp, ep, etp, cp, fp8, fsdp, dist_opt_instances) plus the settings a sweep point does not
carry (VARIANT_AXES: cp_comm, moe_dispatcher, flex_backend, ep_overlap, delay_wgrad, recompute_modules,
dp_overlap, overlap_param_gather, distributed_optimizer, and the pipeline split's embedding_in_split and
loss_in_split),
applied to the scenario as dotted overrides. Which values are legal is not decided here: every layout is
resolved with the scenario checks (sim/search/screen.py); the space only says which values to try.

Default values (an axis the user neither fixes nor opens), DEFAULT_VALUES: powers of two for the degrees,
vp derived per pp from the layer count (`vp_values`: every vp that the scenario's own pipeline checks,
scenarios/pipeline_checks.py, accept with that pp and one of the split options searched, e.g. 80 layers
at pp 4: 1, 2, 4, 5, 10, 20, so NeMo's Llama 3 70B pp 4 x vp 5 is in the space; vp 1 only at pp 1), every
recompute mode, both TP overlaps, the distributed optimizer and FSDP, both pipeline-split options
(with pp > 1: what lets 126 layers + embedding + loss split over 8 stages); the scenario's own value for
the FP8 recipe (opened only by --space fp8=...), the variant settings and dist_opt_instances. For a MoE
model also the three dispatchers (alltoall, allgather, flex) and EP overlap on and off; selective
recompute tries the scenario's module set and Megatron's default (unset: core_attn); module sets are
written joined by '+' (--space recompute_modules=core_attn+mlp,none). sp is on
(Megatron's choice with tp > 1; --space sp=on,off opens it). A scenario with a pipeline_layout keeps its
pp and vp (the layout fixes both); opening them drops the layout for the layouts that change them.
Canonical forms, so no layout appears twice: sp off at tp = 1 (Megatron turns it off there), the
scenario's cp_comm at cp = 1, the scenario's split options at pp = 1 (and under its own pipeline_layout),
ep = etp = 1 and the scenario's MoE settings for a dense model, the scenario's flex backend with another
dispatcher, delay_wgrad off without EP overlap, no module set without selective recompute.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import get_args

from meshsim.scenarios.check_base import CheckContext
from meshsim.scenarios.pipeline_checks import check_pipeline_layers, check_pipeline_stages
from meshsim.scenarios.schema import ParallelConfig, Scenario
from meshsim.sim.core.errors import UserError, closest
from meshsim.sim.sweep.axes import AXES, PARSERS, SweepPoint, parse_switch

MAX_LAYOUTS = 200_000  # layouts one search enumerates (each is resolved: ~1 ms)


def _choices(field: str) -> tuple[str, ...]:
    return tuple(get_args(ParallelConfig.model_fields[field].annotation))


def _parse_choice(axis: str, text: str, field: str | None = None) -> tuple[str, ...]:
    allowed = _choices(field or axis)
    values = tuple(dict.fromkeys(v.strip() for v in str(text).split(",")))
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UserError(axis, text, f"use a comma-separated subset of {', '.join(allowed)}",
                        problem=f"{bad[0]!r} is not a {axis.replace('_', ' ')}")
    return values


def parse_modules(text: str) -> tuple[tuple[str, ...] | None, ...]:
    """'core_attn+mlp,none' -> (('core_attn', 'mlp'), None): module sets joined by '+', 'none' for unset
    (Megatron's default, core_attn)."""
    allowed = get_args(get_args(get_args(ParallelConfig.model_fields["recompute_modules"].annotation)[0])[0])
    out: list[tuple[str, ...] | None] = []
    for part in str(text).split(","):
        part = part.strip()
        mods = None if part == "none" else tuple(dict.fromkeys(m.strip() for m in part.split("+")))
        bad = [m for m in mods or () if m not in allowed]
        if bad or part == "":
            raise UserError("recompute_modules", text, f"give module sets joined by '+' (of {', '.join(allowed)}) "
                            "or 'none', separated by commas", problem=f"{(bad or [part])[0]!r} is not a module")
        out.append(mods)
    return tuple(dict.fromkeys(out))


VARIANT_AXES = {  # axis -> (scenario field, parser)
    "cp_comm": ("parallel.cp_comm", lambda t: _parse_choice("cp_comm", t)),
    "moe_dispatcher": ("parallel.moe_dispatcher", lambda t: _parse_choice("moe_dispatcher", t)),
    "flex_backend": ("parallel.moe_flex_backend", lambda t: _parse_choice("flex_backend", t, "moe_flex_backend")),
    "ep_overlap": ("parallel.moe_ep_overlap", lambda t: parse_switch("ep_overlap", t)),
    "delay_wgrad": ("parallel.delay_wgrad_compute", lambda t: parse_switch("delay_wgrad", t)),
    "recompute_modules": ("parallel.recompute_modules", parse_modules),
    "dp_overlap": ("parallel.dp_overlap", lambda t: parse_switch("dp_overlap", t)),
    "overlap_param_gather": ("parallel.overlap_param_gather", lambda t: parse_switch("overlap_param_gather", t)),
    "distributed_optimizer": ("parallel.distributed_optimizer", lambda t: parse_switch("distributed_optimizer", t)),
    # the pipeline split: the embedding / the loss counted as a layer of the first / last stage (Megatron's
    # --account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split)
    "embedding_in_split": ("parallel.account_for_embedding_in_split",
                           lambda t: parse_switch("embedding_in_split", t)),
    "loss_in_split": ("parallel.account_for_loss_in_split", lambda t: parse_switch("loss_in_split", t)),
}
PIPELINE_SPLIT_AXES = ("embedding_in_split", "loss_in_split")  # only with pp > 1
ALL_AXES = (*AXES, *VARIANT_AXES)
ALIASES = {"mb": "micro_batch", "micro-batch": "micro_batch", "overlap": "tp_comm_overlap", "instances":
           "dist_opt_instances", "dispatcher": "moe_dispatcher", "dist_opt": "distributed_optimizer"}
DEFAULT_VALUES: dict[str, tuple] = {
    "tp": (1, 2, 4, 8), "sp": (True,), "micro_batch": (1, 2, 4), "tp_comm_overlap": (False, True),
    "recompute": ("none", "selective", "full"), "pp": (1, 2, 4, 8, 16), "cp": (1, 2, 4),
    "fsdp": (False, True), "embedding_in_split": (False, True), "loss_in_split": (False, True),
}
MOE_DEFAULTS: dict[str, tuple] = {"ep": (1, 2, 4, 8, 16, 32, 64), "etp": (1, 2),
                                  "moe_dispatcher": ("alltoall", "allgather", "flex"), "ep_overlap": (False, True)}
MOE_ONLY_AXES = ("moe_dispatcher", "flex_backend", "ep_overlap", "delay_wgrad")  # the scenario's value for dense


@dataclass(frozen=True)
class Layout:
    """One layout: a sweep point and the variant settings (dotted key, value), sorted by key."""

    point: SweepPoint
    variant: tuple[tuple[str, object], ...] = ()

    @property
    def key(self) -> str:
        """The point's sweep key, then the variant settings: 'tp=8,...,recompute=none;cp_comm=a2a'."""
        extra = ",".join(f"{k.split('.')[-1]}={_text(v)}" for k, v in self.variant)
        return self.point.key + (f";{extra}" if extra else "")


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return "+".join(value)
    return "none" if value is None else str(value)


@dataclass(frozen=True)
class SearchSpace:
    """axis -> the values the search tries (ALL_AXES order); `vp_by_pp`, when vp is derived (module
    docstring), pp -> its vp values, and the vp axis holds their union."""

    values: tuple[tuple[str, tuple], ...]
    vp_by_pp: tuple[tuple[int, tuple[int, ...]], ...] | None = None

    def of(self, axis: str) -> tuple:
        return dict(self.values)[axis]

    @property
    def size(self) -> int:
        if self.vp_by_pp is None:
            return math.prod(len(v) for _, v in self.values)
        rest = math.prod(len(v) for a, v in self.values if a not in ("pp", "vp"))
        return rest * sum(len(v) for _, v in self.vp_by_pp)

    def combos(self):
        """Every combination of the axes' values (vp per pp when derived), as value tuples in ALL_AXES order."""
        if self.vp_by_pp is None:
            yield from itertools.product(*(v for _, v in self.values))
            return
        names = [a for a, _ in self.values]
        ipp, ivp = names.index("pp"), names.index("vp")
        by_pp = dict(self.vp_by_pp)
        lists = [v for _, v in self.values]
        lists[ivp] = (None,)
        for combo in itertools.product(*lists):
            for vp in by_pp[combo[ipp]]:
                yield combo[:ivp] + (vp,) + combo[ivp + 1:]


def _with_pipeline(scenario: Scenario, pp: int, vp: int, split: tuple[bool, bool]) -> Scenario:
    """The scenario at this pp, vp and split, as a layout sets them (_canonical: its own pipeline_layout only
    at its own pp and vp)."""
    p = scenario.parallel
    layout = p.pipeline_layout if (pp, vp) == (p.pp, p.vp) else None
    parallel = p.model_copy(update={"pp": pp, "vp": vp, "account_for_embedding_in_split": split[0],
                                    "account_for_loss_in_split": split[1], "pipeline_layout": layout})
    return scenario.model_copy(update={"parallel": parallel})


def vp_values(scenario: Scenario, pp: int, splits: Sequence[tuple[bool, bool]]) -> tuple[int, ...]:
    """Every vp in 1..(layers + 2) / pp that the scenario's pipeline checks (scenarios/pipeline_checks.py
    check_pipeline_stages, check_pipeline_layers: the rules a scenario file meets, not a copy of them) accept
    with this pp and one of `splits` (embedding_in_split, loss_in_split); (1,) at pp 1, and (1,) when none
    is accepted (the layouts are then refused by the rule, and counted)."""
    ctx = CheckContext("search", topology_gpus=scenario.parallel.gpus or pp)  # pp > GPUs: refused on resolving
    out = [1]
    for vp in range(2, (scenario.model.layers + 2) // pp + 1) if pp > 1 else ():
        for split in splits:
            candidate = _with_pipeline(scenario, pp, vp, split)
            try:
                check_pipeline_stages(candidate, ctx)
                check_pipeline_layers(candidate, ctx)
            except UserError:
                continue
            out.append(vp)
            break
    return tuple(out)


def axis_name(text: str, option: str, given: str) -> str:
    """'micro-batch' -> 'micro_batch'; an unknown axis is a UserError naming the closest one."""
    name = ALIASES.get(text.strip(), text.strip().replace("-", "_"))
    if name not in ALL_AXES:
        near = closest(name, ALL_AXES)
        hint = f"did you mean {near}? " if near else ""
        raise UserError(option, given, f"{hint}axes: {', '.join(ALL_AXES)}", problem=f"{text!r} is not an axis")
    return name


def parse_assignment(option: str, text: str, single: bool) -> tuple[str, tuple]:
    """'tp=2,4' -> ('tp', (2, 4)) for --space; --fix (single) takes exactly one value."""
    if "=" not in text:
        raise UserError(option, text, "write AXIS=VALUE" + ("" if single else "S, e.g. tp=2,4,8") +
                        (", e.g. tp=8" if single else ""), problem="no '=' in it")
    axis, _, value = text.partition("=")
    name = axis_name(axis, option, text)
    parser = PARSERS.get(name) or VARIANT_AXES[name][1]
    try:
        values = parser(value)
    except UserError as err:
        raise UserError(option, text, err.fix, problem=err.problem or f"{value!r} is not a value of {name}") from None
    if single and len(values) != 1:
        raise UserError(option, text, f"give one value with --fix (--space {name}=A,B for several)",
                        problem=f"{len(values)} values")
    return name, values


def scenario_value(scenario: Scenario, axis: str) -> object:
    if axis == "fp8":
        return scenario.run.fp8
    field = VARIANT_AXES[axis][0].split(".")[-1] if axis in VARIANT_AXES else axis
    value = getattr(scenario.parallel, field)
    return tuple(value) if isinstance(value, list) else value


def build_space(scenario: Scenario, fixed: Mapping[str, tuple] = (), opened: Mapping[str, tuple] = ()) -> SearchSpace:
    """The values of every axis: --fix, else --space, else the defaults of the module docstring."""
    fixed, opened = dict(fixed), dict(opened)
    moe = scenario.model.moe is not None
    pinned_pipeline = scenario.parallel.pipeline_layout is not None
    values = []
    for axis in ALL_AXES:
        if axis in fixed:
            chosen = fixed[axis]
        elif axis in opened:
            chosen = opened[axis]
        elif axis in ("pp", "vp") and pinned_pipeline:
            chosen = (scenario_value(scenario, axis),)
        elif axis == "vp":
            chosen = ()  # derived per pp below
        elif axis == "recompute_modules":  # the scenario's module set and Megatron's default (core_attn)
            chosen = tuple(dict.fromkeys((scenario_value(scenario, axis), None)))
        elif axis in MOE_DEFAULTS:
            chosen = MOE_DEFAULTS[axis] if moe else (scenario_value(scenario, axis) if axis in MOE_ONLY_AXES else 1,)
        elif axis in DEFAULT_VALUES:
            chosen = DEFAULT_VALUES[axis]
        else:
            chosen = (scenario_value(scenario, axis),)
        values.append((axis, tuple(chosen)))
    values = _unsplit(scenario, dict(values), fixed, opened)
    if values["vp"]:
        return SearchSpace(tuple(values.items()))
    splits = tuple(itertools.product(values["embedding_in_split"], values["loss_in_split"]))
    by_pp = tuple((pp, vp_values(scenario, pp, splits)) for pp in values["pp"])
    values["vp"] = tuple(sorted({v for _, vps in by_pp for v in vps}))
    return SearchSpace(tuple(values.items()), by_pp)


def _unsplit(scenario: Scenario, values: dict, fixed: Mapping, opened: Mapping) -> dict:
    """The split options at the scenario's value when no layout of the space splits layers itself (every pp
    is 1, or the scenario's pipeline_layout holds for every one): the canonical form, without enumerating
    the copies (module docstring)."""
    p = scenario.parallel
    pinned = p.pipeline_layout is not None and values["pp"] == (p.pp,) and values["vp"] == (p.vp,)
    if values["pp"] == (1,) or pinned:
        for axis in PIPELINE_SPLIT_AXES:
            if axis not in fixed and axis not in opened:
                values[axis] = (scenario_value(scenario, axis),)
    return values


def layouts(scenario: Scenario, space: SearchSpace) -> list[Layout]:
    """Every layout of the space in canonical form (module docstring), without repeats; at most MAX_LAYOUTS."""
    if space.size > MAX_LAYOUTS:
        raise UserError("--space", f"{space.size:,} layouts", "fix more axes (--fix AXIS=V) or give fewer values "
                        "(--space AXIS=V1,V2)", problem=f"more than {MAX_LAYOUTS:,} layouts to enumerate")
    names = [a for a, _ in space.values]
    out = (_canonical(scenario, dict(zip(names, combo, strict=True))) for combo in space.combos())
    return list(dict.fromkeys(out))


def _canonical(scenario: Scenario, combo: dict) -> Layout:
    p = scenario.parallel
    if combo["tp"] == 1:
        combo["sp"] = False
    if combo["cp"] == 1:
        combo["cp_comm"] = p.cp_comm
    if combo["pp"] == 1 or p.pipeline_layout is not None and (combo["pp"], combo["vp"]) == (p.pp, p.vp):
        combo.update({a: scenario_value(scenario, a) for a in PIPELINE_SPLIT_AXES})
    if scenario.model.moe is None:
        combo["ep"] = combo["etp"] = 1
        combo.update({a: scenario_value(scenario, a) for a in MOE_ONLY_AXES})
    if combo["moe_dispatcher"] != "flex":
        combo["flex_backend"] = scenario_value(scenario, "flex_backend")
    if not combo["ep_overlap"]:
        combo["delay_wgrad"] = False
    if combo["recompute"] != "selective":
        combo["recompute_modules"] = None
    point = SweepPoint(**{a: combo[a] for a in AXES})
    variant = {VARIANT_AXES[a][0]: combo[a] for a in VARIANT_AXES if combo[a] != scenario_value(scenario, a)}
    if p.pipeline_layout is not None and (point.pp, point.vp) != (p.pp, p.vp):
        variant["parallel.pipeline_layout"] = None
    return Layout(point, tuple(sorted(variant.items())))
