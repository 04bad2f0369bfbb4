"""The accuracy report's rows: each case simulated (or priced) next to its measurement.

A Row is one case: measured, simulated, its error (simulated / measured - 1; negative = the simulation is
too fast), whether it fits in memory under its stated assumptions, the fits that used it (fits.yaml), and
its assumptions. A step case that does not fit in memory is not scored: its assumptions contradict
meshsim's own model, so its figure is not a prediction of the run that was measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from accuracy_cases import MIB, Assumption, Curve, KernelCase, Ratio, StepCase

from meshsim.scenarios.load import resolve, validate_scenario, with_overrides
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.gemm_ceiling import BURST
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm

SMALL_MIB = 16  # nccl-tests points below this size form the collectives-small group


@dataclass(frozen=True)
class Row:
    group: str
    name: str  # case id: step case file name, <curve id>-<MiB>, kernel id, ratio label
    label: str
    measured: float
    simulated: float | None  # None: not simulated (note says why)
    unit: str
    fits: bool | None = None  # memory, step cases only
    used_in_fit: tuple[str, ...] = ()
    assumptions: tuple[Assumption, ...] = ()
    note: str = ""
    release: str = ""  # step cases: the software-release profile it was simulated under (accuracy.release)

    @property
    def error(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.measured - 1.0

    @property
    def scored(self) -> bool:
        """Counted in its group's MAPE: simulated, and (step cases) fits in memory."""
        return self.simulated is not None and self.fits is not False

    @property
    def out_of_fit(self) -> bool:
        return not self.used_in_fit

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, "label": self.label, "unit": self.unit,
                "measured": self.measured, "simulated": self.simulated, "error": self.error,
                "fits": self.fits, "scored": self.scored, "used_in_fit": list(self.used_in_fit),
                "assumptions": [a.as_json() for a in self.assumptions], "note": self.note, "release": self.release}


@dataclass(frozen=True)
class Context:
    profile: str | None = None  # a hardware profile applied to every case
    only: str = ""  # step cases whose name starts with this
    used: dict[str, tuple[str, ...]] = field(default_factory=dict)  # case name -> fits that used it
    release: str | None = None  # every step case under this release profile instead of its own (what-if)


def _profiled(scenario, source: str, profile: str | None):
    return with_overrides(scenario, {"hardware.profile": str(Path(profile).resolve())}, source) if profile else scenario


def what_if_step_s(case: StepCase, overrides: dict) -> float:
    """The case's simulated step under its release's profile with `overrides` (dotted fields) applied: the
    what-if scripts' one step (accuracy_ci_terms.py, accuracy_fp8_terms.py); nothing scored."""
    scenario = with_overrides(case.scenario, {"hardware.release": case.release, **overrides}, str(case.path))
    return simulate(resolve(scenario, str(case.path))).step_time_s


def has_field(dotted: str) -> bool:
    """Whether the scenario schema has this dotted field (e.g. "run.fp8")."""
    model = Scenario
    for part in dotted.split("."):
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return False
        model = info.annotation
    return True


def _pending(case: StepCase):
    """The case's scenario with its pending settings applied, or the fields this schema lacks."""
    missing = [f for f, _ in case.pending if not has_field(f)]
    if missing:
        return None, missing
    return with_overrides(case.scenario, dict(case.pending), str(case.path)), []


def step_row(case: StepCase, ctx: Context) -> Row:
    release = ctx.release or case.release
    base = Row(case.group, case.name, case.name, case.measured_s, None, "s", None, ctx.used.get(case.name, ()),
               case.assumptions, release=release)
    case = replace(case, scenario=with_overrides(case.scenario, {"hardware.release": release}, str(case.path)))
    scenario, missing = _pending(case)
    if missing:  # the measured run used a setting meshsim cannot express yet: show the stand-in, do not score
        try:
            stand_in = simulate(resolve(case.scenario, str(case.path))).step_time_s
            note = f"needs {', '.join(missing)}, not scored (without it: {stand_in:.3f} s)"
        except UserError as err:
            note = f"needs {', '.join(missing)}; refused: {err.field}"
        return replace(base, note=note)
    try:
        rs = resolve(_profiled(scenario, str(case.path), ctx.profile), str(case.path))
        memory = memory_per_gpu(rs)
        step_s = simulate(rs).step_time_s
    except UserError as err:
        return replace(base, note=f"refused: {err.field}")
    note = "" if memory.fits else (f"DOES NOT FIT: {memory.total_gb:.0f} of {memory.capacity_gb:.0f} GB under its "
                                   "stated assumptions; not scored")
    return replace(base, simulated=step_s, fits=memory.fits, note=note)


def ratio_rows(ratios: list[Ratio], steps: list[Row], ctx: Context) -> list[Row]:
    """Measured ratio vs simulated ratio; a ratio is in fit when either of its cases is."""
    by = {r.name: r for r in steps}
    rows = []
    for q in ratios:
        if q.num not in by or q.den not in by:
            continue
        a, b = by[q.num], by[q.den]
        sim = a.simulated / b.simulated if a.scored and b.scored else None
        used = tuple(dict.fromkeys(a.used_in_fit + b.used_in_fit))
        rows.append(Row("scaling", q.label, q.label, a.measured / b.measured, sim, "x", used_in_fit=used,
                        note="" if sim is not None else "a case is not scored"))
    return rows


def bare_scenario(preset: str, gpus: int, gpu: str, profile: str | None, algo: str = "auto",
                  nvlink_gbps: float | None = None):
    """A minimal resolved scenario on `gpus` GPUs of `preset`, all in one TP group (costing only)."""
    data: dict[str, Any] = {
        "name": f"accuracy-{preset}", "model": {"layers": 1, "hidden": 1024, "heads": 8, "seq_len": 128, "vocab": 1024},
        "hardware": {"gpu": gpu, "network": {"algo": algo}}, "topology": {"preset": preset},
        "parallel": {"tp": gpus, "gpus": gpus, "dp": 1, "global_batch": 1}}
    if nvlink_gbps:
        data["topology"]["nvlink_gbps"] = nvlink_gbps
    if profile:
        data["hardware"]["profile"] = str(Path(profile).resolve())
    return resolve(validate_scenario(data, "benchmarks/accuracy.py"), "benchmarks/accuracy.py")


def collective_s(rs, work: Collective) -> float:
    latency_s, bandwidth_s, _ = CollectiveCoster(rs).cost(work, rs.tp_group(0))[0]
    return latency_s + bandwidth_s


def curve_rows(curve: Curve, ctx: Context) -> list[Row]:
    """One row per point; busbw = nbytes / time x 2(n-1)/n (all-reduce)."""
    rs = bare_scenario(curve.preset, curve.gpus, curve.gpu, ctx.profile, curve.algo)
    rows = []
    for mib, busbw in curve.busbw_gbps:
        nbytes = mib * MIB
        time_s = collective_s(rs, Collective("all_reduce", "tp", nbytes))
        sim = nbytes / time_s * 2 * (curve.gpus - 1) / curve.gpus / 1e9
        size = f"{mib // 1024} GiB" if mib >= 1024 else f"{mib} MiB"
        name = f"{curve.id}-{mib}"
        group = "collectives" if mib >= SMALL_MIB else "collectives-small"
        rows.append(Row(group, name, f"{curve.label} all_reduce {size} busbw", busbw, sim, "GB/s",
                        used_in_fit=ctx.used.get(name, ())))
    return rows


def lone_kernel_model(rs) -> ComputeModel:
    """The scenario's compute model at the burst clock of a kernel timed alone for a few iterations (FLUX's
    kernels, Megatron's moe_perf layers: sim/cost/gemm_ceiling.py), as sim/results/costers.compute_fn builds
    it otherwise."""
    return ComputeModel(rs.gpu, rs.scenario.hardware.compute, rs.profile,
                        fill_uninitialized=rs.scenario.run.deterministic, fp8_recipe=rs.scenario.run.fp8,
                        fp8_gemm_rate=rs.fp8_gemm_rate, clock=BURST)


def lone_kernel_compute_fn(rs):
    """compute_s(op, rank) at the burst clock (lone_kernel_model), for the engine."""
    model = lone_kernel_model(rs)

    def compute_s(op, rank: int) -> float:
        return model.time_s(op.work)
    return compute_s


def flux_gemm_s(k: KernelCase, model: ComputeModel) -> float:
    """A FLUX GEMM row as its baseline timed it: the GEMM, and for `scaled_output` the multiply that reads and
    writes its 16-bit output (accuracy_cases.KernelCase)."""
    m, n, _ = k.gemm
    scale_s = model.time_s(Elementwise("flux_alpha_scale", 2 * m * n, 2 * m * n)) if k.scaled_output else 0.0
    return model.time_s(Gemm(*k.gemm)) + scale_s


def kernel_row(k: KernelCase, nvlink_gbps: float, ctx: Context) -> Row:
    rs = bare_scenario(k.preset, 8, k.gpu, ctx.profile, nvlink_gbps=nvlink_gbps)
    if k.gemm is not None:
        sim_s = flux_gemm_s(k, lone_kernel_model(rs))
    else:
        sim_s = collective_s(rs, Collective(k.collective, "tp", k.nbytes, "flux"))
    return Row("kernels", k.id, k.label, k.measured_ms, sim_s * 1e3, "ms", used_in_fit=ctx.used.get(k.id, ()))
