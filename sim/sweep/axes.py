"""Sweep axes, their product, and one configuration's run (meshsim sweep).

A sweep varies twelve parallel-configuration axes of one scenario at its fixed GPU count:
tp, sp, micro_batch, tp_comm_overlap, recompute, pp, vp, for MoE models ep and etp (edp follows), cp
(context parallel), fsdp (Megatron-FSDP's ZeRO-3; an fsdp point runs the distributed optimizer too, as
Megatron-FSDP turns it on itself), dist_opt_instances (the distributed optimizer cut into instances; a point
with more than one runs the distributed optimizer too), and one run setting, the FP8 recipe (`run.fp8`: off, delayed, tensorwise, blockwise,
mxfp8; RUN_AXES). The data-parallel degree follows from tp, cp and
pp (`parallel.dp = "auto"`: dp = gpus / (tp x cp x pp)); a combination whose tp x cp x pp does not divide the GPUs,
or that breaks a pipeline rule (layers divisible by pp x vp, interleaving needs pp > 2, ...), is skipped
with the rule. Axis values come, by priority, from command-line flags,
the scenario's `sweep:` block, then the scenario's own single value.

Every configuration is run by `run_point`, a module-level function so that process pools and Ray can
ship it: it returns a plain dict record, either `status="ok"` with the StepResult dict, or
`status="skipped"` with the reason the scenario checks gave (a UserError's problem and fix); it never
raises for a configuration the model cannot take.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from dataclasses import asdict, dataclass, replace

from meshsim.scenarios.load import referenced_files
from meshsim.scenarios.value_names import other_name
from meshsim.sim.core.errors import UserError, quote
from meshsim.sim.core.limits import MAX_SWEEP_POINTS, check_at_most
from meshsim.sim.core.userio import FileSnapshot, snapshot_files

AXES = ("tp", "sp", "micro_batch", "tp_comm_overlap", "recompute", "pp", "vp", "ep", "etp", "cp", "fp8", "fsdp",
        "dist_opt_instances")
RUN_AXES = ("fp8",)  # axes that set scenario run.<name> (the others set parallel.<name>)
RECOMPUTE_CHOICES = ("none", "selective", "full")
FP8_CHOICES = ("off", "delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4")
SWITCH_VALUES = {"on": (True,), "off": (False,), "both": (False, True)}


# ----- parsing --------------------------------------------------------------------------------------
def parse_int_list(field: str, text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); positive integers, duplicates dropped, order kept."""
    values: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or len(part) > 12 or int(part) <= 0:
            raise UserError(f"--{field.replace('_', '-')}", text, "give positive integers separated by commas, "
                            "e.g. 1,2,4,8", problem=f"{part!r} is not a positive integer")
        if int(part) not in values:
            values.append(int(part))
    return tuple(values)


def parse_switch(field: str, text: str) -> tuple[bool, ...]:
    """'on' -> (True,), 'off' -> (False,), 'both' -> (False, True)."""
    value = str(text).strip().lower()
    if value not in SWITCH_VALUES:
        raise UserError(f"--{field.replace('_', '-')}", text, "use on, off or both")
    return SWITCH_VALUES[value]


def _parse_choices(option: str, text: str, choices: tuple[str, ...], what: str) -> tuple[str, ...]:
    """'a,b,a' -> ('a', 'b'): a comma-separated subset of `choices`, in order, without repeats."""
    values: list[str] = []
    for part in str(text).split(","):
        part = part.strip().lower()
        if part not in choices:
            meant = other_name(option.lstrip("-").replace("-", "_"), part)
            hint = f"write {meant[0]!r} for {part!r}" + (f" ({meant[1]})" if meant[1] else "") + ", or " \
                if meant else ""
            raise UserError(option, text, f"{hint}use a comma-separated subset of {', '.join(choices)}",
                            problem=f"{part!r} is not {what}")
        if part not in values:
            values.append(part)
    return tuple(values)


def parse_recompute(text: str) -> tuple[str, ...]:
    """'none,selective,full' -> ('none', 'selective', 'full')."""
    return _parse_choices("--recompute", text, RECOMPUTE_CHOICES, "a recompute mode")


def parse_fp8(text: str) -> tuple[str, ...]:
    """'off,delayed' -> ('off', 'delayed'): FP8 recipes (run.fp8)."""
    return _parse_choices("--fp8", text, FP8_CHOICES, "an FP8 recipe")


PARSERS = {
    "tp": lambda t: parse_int_list("tp", t),
    "sp": lambda t: parse_switch("sp", t),
    "micro_batch": lambda t: parse_int_list("micro_batch", t),
    "tp_comm_overlap": lambda t: parse_switch("tp_comm_overlap", t),
    "recompute": parse_recompute,
    "pp": lambda t: parse_int_list("pp", t),
    "vp": lambda t: parse_int_list("vp", t),
    "ep": lambda t: parse_int_list("ep", t),
    "etp": lambda t: parse_int_list("etp", t),
    "cp": lambda t: parse_int_list("cp", t),
    "fp8": parse_fp8,
    "fsdp": lambda t: parse_switch("fsdp", t),
    "dist_opt_instances": lambda t: parse_int_list("dist_opt_instances", t),
}


# ----- axes and points ------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepAxes:
    tp: tuple[int, ...]
    sp: tuple[bool, ...]
    micro_batch: tuple[int, ...]
    tp_comm_overlap: tuple[bool, ...]
    recompute: tuple[str, ...]
    pp: tuple[int, ...] = (1,)
    vp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    etp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    fp8: tuple[str, ...] = ("off",)
    fsdp: tuple[bool, ...] = (False,)
    dist_opt_instances: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the sweep."""

    tp: int
    sp: bool
    micro_batch: int
    tp_comm_overlap: bool
    recompute: str
    pp: int = 1
    vp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    fp8: str = "off"
    fsdp: bool = False
    dist_opt_instances: int = 1

    @property
    def key(self) -> str:
        """Stable identifier, used to resume: 'tp=8,sp=on,mb=1,overlap=off,recompute=none' (+ ',pp=4,vp=2'
        when pipelined, + ',ep=16,etp=1' with expert parallelism, + ',cp=2' with context parallelism, +
        ',fp8=delayed' with FP8, + ',fsdp=on' with FSDP, + ',instances=2' with optimizer instances)."""
        pipe = f",pp={self.pp},vp={self.vp}" if (self.pp, self.vp) != (1, 1) else ""
        experts = f",ep={self.ep},etp={self.etp}" if (self.ep, self.etp) != (1, 1) else ""
        context = f",cp={self.cp}" if self.cp != 1 else ""
        fp8 = f",fp8={self.fp8}" if self.fp8 != "off" else ""
        fsdp = ",fsdp=on" if self.fsdp else ""
        fsdp += f",instances={self.dist_opt_instances}" if self.dist_opt_instances > 1 else ""
        return (f"tp={self.tp},sp={_onoff(self.sp)},mb={self.micro_batch},overlap={_onoff(self.tp_comm_overlap)},"
                f"recompute={self.recompute}{pipe}{experts}{context}{fp8}{fsdp}")

    def overrides(self) -> dict[str, object]:
        """Dotted scenario overrides for scenarios.load.with_overrides; dp follows from tp; an FSDP point, or one
        with optimizer instances, runs the distributed optimizer (Megatron-FSDP v1 turns it on,
        scenarios/fsdp_checks.py; the instances cut its shards, scenarios/instance_checks.py)."""
        fields = {f"{'run' if name in RUN_AXES else 'parallel'}.{name}": value for name, value in asdict(self).items()}
        optimizer = {"parallel.distributed_optimizer": True} if self.fsdp or self.dist_opt_instances > 1 else {}
        return {**fields, **optimizer, "parallel.dp": "auto"}


def _onoff(flag: bool) -> str:
    return "on" if flag else "off"


def sweep_axes(scenario, flags: dict[str, str | None] | None = None) -> SweepAxes:
    """Axis values: a flag (text, parsed here) beats the scenario's `sweep:` block, which beats the
    scenario's own single value."""
    flags = flags or {}
    block = scenario.sweep
    values = {}
    for axis in AXES:
        if flags.get(axis) is not None:
            values[axis] = PARSERS[axis](flags[axis])
        elif block is not None and getattr(block, axis):
            values[axis] = tuple(dict.fromkeys(getattr(block, axis)))
        else:
            values[axis] = (getattr(scenario.run if axis in RUN_AXES else scenario.parallel, axis),)
    return SweepAxes(**values)


def block_axes_swept(scenario, flags: dict[str, str | None]) -> list[str]:
    """The axes the scenario's `sweep:` block sweeps (more than one value) beside the flags given: they
    multiply with the flags' axes, which a reader of the command line alone would not expect. [] when no
    flag is given (the block is the whole sweep) or the block sweeps nothing else."""
    block = scenario.sweep
    if block is None or not any(v is not None for v in flags.values()):
        return []
    return [a for a in AXES if flags.get(a) is None and len(set(getattr(block, a) or ())) > 1]


def configurations(axes: SweepAxes) -> list[SweepPoint]:
    """The product of the axes, tp outermost (the table reads by tp); at most MAX_SWEEP_POINTS. At tp = 1
    sequence parallelism is off, as Megatron turns it off there ("Disabling sequence parallelism because
    tensor model parallelism is disabled", megatron/training/arguments.py @d98e8a64 L1430-1439): an sp-on
    point at tp = 1 runs as sp off, and appears once."""
    sizes = [len(getattr(axes, a)) for a in AXES]
    check_at_most("sweep", " x ".join(map(str, sizes)), MAX_SWEEP_POINTS, "give fewer values per axis (flags or "
                  "the scenario's sweep: block)", what="configurations", amount=math.prod(sizes))
    points = (SweepPoint(*combo) for combo in itertools.product(*(getattr(axes, a) for a in AXES)))
    return list(dict.fromkeys(replace(p, sp=False) if p.tp == 1 and p.sp else p for p in points))


def referenced_snapshot(scenario, source: str = "") -> FileSnapshot:
    """The bytes of every file the scenario references (topology.file, hardware.profile), read once: a
    sweep computes every configuration from these bytes (sim/core/userio.py pinned_files)."""
    return snapshot_files(referenced_files(scenario, source).values())


def scenario_digest(scenario, source: str = "", files: FileSnapshot | None = None) -> str:
    """Hash of everything a configuration's result depends on besides its point: the scenario without its
    sweep block and without the fields every point overrides, plus the bytes of every file it references
    (topology.file, hardware.profile; a missing file hashes as missing), taken from `files` (the sweep's
    snapshot, so the digest describes exactly what the configurations read) or read now. Resumed records
    must match it."""
    parallel_axes = {a for a in AXES if a not in RUN_AXES} | {"dp"}
    exclude = {"sweep": True, "parallel": parallel_axes, "run": set(RUN_AXES)}
    digest = hashlib.sha256(scenario.model_dump_json(exclude=exclude).encode())
    files = referenced_snapshot(scenario, source) if files is None else files
    for name, path in sorted(referenced_files(scenario, source).items()):
        data = files.get(os.path.normpath(str(path)))
        content = "missing" if data is None else hashlib.sha256(data).hexdigest()
        digest.update(f"\n{name}={content}".encode())
    return digest.hexdigest()[:16]


# ----- running one configuration --------------------------------------------------------------------
def skip_reason(err: UserError, source: str | None = None) -> str:
    """The problem and fix of a UserError: why a configuration was skipped; prefixed with the file it names
    when that is not the sweep's scenario `source` (a hardware profile, a topology file)."""
    problem = f"{err.problem}. " if err.problem else ""
    where = f"{err.source}: " if err.source and err.source != source else ""
    return f"{where}{err.field} = {quote(err.value)}: {problem}{err.fix}"
