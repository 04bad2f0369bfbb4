"""`meshsim compare results.json|SCENARIO --trace PATH`: the simulated step against a traced one.

The simulated side is the scenario's step simulated whole (`simulate_with_events`), from a scenario or
from a results.json's source and config echo; its representative rank (rank 0). The measured side is the
lowest traced rank, every traced step (or --step), as sim/kineto/ reads it; rows are per-step means.

First the structure (StructureCheck): a comparison of unlike steps would be noise, so the two must agree
on what they run before any time is compared:
- layers, when the trace names the schedule's ops (`meshsim validate --trace`): the distinct "L<i>" blocks;
- TP degree: the group size of the trace's most frequent collective against the scenario's tp;
- collectives per step (barriers and P2P left out) and attention cores per step (layers x micro-batches
  x passes) within STRUCTURE_TOLERANCE of the schedule's.
Then rows, each {name, simulated_s, measured_s, delta_s, delta_pct}, sorted by |delta|:
- categories: step, compute busy, communication busy (and TP / DP / PP apart), communication not hidden
  by compute, compute idle;
- kernel classes (sim/kineto/classify.py work_class against kernel_class; attention variants as one);
- op types: meshsim op types ("fwd.qkv") when the trace names the schedule's ops (`meshsim validate
  --trace`), GEMM shapes otherwise;
- collectives by size: the measured bus bandwidth against the model's for the same op, group and size
  (CollectiveCoster: the scenario's topology, NCCL's choice, a profile's table if it has one).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshsim.scenarios.library import BUILTIN_PREFIX
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.engine.events import Event
from meshsim.sim.kineto.classify import family, work_class
from meshsim.sim.kineto.document import collective_table
from meshsim.sim.kineto.kernels import Kernel, kernels_in, step_windows, trace_steps
from meshsim.sim.kineto.ranks import RankData
from meshsim.sim.kineto.step_summary import StepSummary, union_us
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.critical_path import op_type
from meshsim.sim.results.simulate import simulate_with_events
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.schedule.ops import Attention, Collective, Schedule
from meshsim.sim.sweep.compare import load_results, replay_overrides

STRUCTURE_TOLERANCE = 0.10
LAYER_BLOCK = re.compile(r"^L\d+\.")  # an op of a transformer layer (sim/schedule/op_keys.py layer_block)
MODEL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


@dataclass(frozen=True)
class SimSide:
    rs: ResolvedScenario
    result: StepResult
    events: tuple[Event, ...]  # rank 0's
    schedule: Schedule
    label: str


def simulated_side(target: str | Path, profile: Path | None = None) -> SimSide:
    """A scenario (path or built-in name), or a results.json whose source and config say how to re-run it;
    `profile` (a path from the working directory) replaces its hardware.profile."""
    path = Path(target)
    if path.suffix == ".json" and path.is_file():
        recorded = load_results(path)
        scenario, src = load_scenario(recorded.source.removeprefix(BUILTIN_PREFIX))
        overrides = replay_overrides(recorded.config)
    else:
        scenario, src = load_scenario(target)
        overrides = {}
    if profile is not None:
        overrides["hardware.profile"] = str(Path(profile).resolve())
    rs = resolve(with_overrides(scenario, overrides, src), src)
    result, log, schedule = simulate_with_events(rs)
    rank = log.ranks[0]
    return SimSide(rs, result, tuple(e for e in log.events if e.rank == rank), schedule, rs.name)


@dataclass(frozen=True)
class StructureCheck:
    rows: tuple[dict[str, Any], ...]  # {what, simulated, measured, agrees}
    issues: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.issues


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= STRUCTURE_TOLERANCE * max(abs(a), abs(b), 1.0)


def structure(sim: SimSide, steps: Sequence[StepSummary], kernels: Sequence[Sequence[Kernel]]) -> StructureCheck:
    """The structural agreement of the traced steps with the scenario (module docstring)."""
    n = len(steps) or 1
    colls = [k for ks in kernels for k in ks if k.coll is not None and not k.coll.p2p and k.coll.op != "barrier"]
    sim_colls = sum(isinstance(op.work, Collective) for op in sim.schedule.ops)
    attn = sum(1 for ks in kernels for k in ks if family(k.cls) == "attention" and k.cls != "attention.unfused")
    sim_attn = sum(isinstance(op.work, Attention) for op in sim.schedule.ops)
    sizes = Counter(k.coll.group for k in colls if k.coll.group)
    tp = sizes.most_common(1)[0][0] if sizes else None
    rows = [{"what": "collectives per step", "simulated": sim_colls, "measured": len(colls) / n},
            {"what": "attention cores per step", "simulated": sim_attn, "measured": attn / n},
            {"what": "TP degree (most frequent collective's group size)", "simulated": sim.rs.tp, "measured": tp}]
    layers = {name.split(".", 1)[0] for s in steps for name in s.labels if LAYER_BLOCK.match(name)}
    if layers:  # the trace names the schedule's ops: count its layers
        sim_layers = {op.name.split(".", 1)[0] for op in sim.schedule.ops if LAYER_BLOCK.match(op.name)}
        rows.insert(0, {"what": "layers (from the traced op names)", "simulated": len(sim_layers),
                        "measured": len(layers)})
    issues = []
    if layers and len(layers) != len(sim_layers):
        issues.append(f"the trace runs {len(layers)} layers, the scenario {len(sim_layers)}")
    if not _close(sim_colls, len(colls) / n):
        issues.append(f"the trace runs {len(colls) / n:g} collectives per step, the scenario {sim_colls}")
    if attn and not _close(sim_attn, attn / n):
        issues.append(f"the trace runs {attn / n:g} attention cores per step, the scenario {sim_attn} (layers x "
                      "micro-batches x passes)")
    if sim.rs.tp > 1 and tp is not None and tp != sim.rs.tp:
        issues.append(f"the trace's most frequent collectives run on groups of {tp} ranks, the scenario has "
                      f"tp {sim.rs.tp}")
    for row in rows:
        row["agrees"] = row["measured"] is None or _close(float(row["simulated"]), float(row["measured"]))
    return StructureCheck(tuple(rows), tuple(issues))


def _row(name: str, sim_s: float, meas_s: float, kind: str) -> dict[str, Any]:
    return {"name": name, "kind": kind, "simulated_s": sim_s, "measured_s": meas_s, "delta_s": sim_s - meas_s,
            "delta_pct": 100 * (sim_s - meas_s) / meas_s if meas_s else None}


def _sim_union(events: Sequence[Event], keep) -> float:
    return union_us((e.start_s * 1e6, e.end_s * 1e6) for e in events if keep(e)) * 1e-6


def category_rows(sim: SimSide, steps: Sequence[StepSummary]) -> list[dict[str, Any]]:
    b, n = sim.result.breakdown_s, len(steps) or 1

    def mean(attr: str) -> float:
        return sum(getattr(s, attr) for s in steps) / n
    comm_sim = _sim_union(sim.events, lambda e: e.stream != "compute")
    exposed_sim = b.get("exposed_comm", b.get("exposed_tp_comm", 0.0) + b.get("exposed_dp_comm_only", 0.0))
    return [_row("step", sim.result.step_time_s, mean("span_s"), "category"),
            _row("compute busy", b.get("compute_busy", 0.0), mean("compute_busy_s"), "category"),
            _row("communication busy", comm_sim, mean("comm_busy_s"), "category"),
            _row("communication not hidden by compute", exposed_sim, mean("exposed_comm_s"), "category"),
            _row("compute idle (waiting)", b.get("compute_waiting", 0.0), mean("span_s") - mean("compute_busy_s"),
                 "category")]


def comm_stream_rows(sim: SimSide, kernels: Sequence[Sequence[Kernel]]) -> list[dict[str, Any]]:
    """TP and DP communication busy time apart: a traced collective is on the stream of the schedule op it
    is labelled with, else on tp_comm when its group is the scenario's TP group size (tp > 1), dp_comm
    otherwise (pipeline P2P on pp_comm)."""
    stream_of = {op.name: op.stream for op in sim.schedule.ops}
    n = len(kernels) or 1
    meas: dict[str, float] = defaultdict(float)
    for ks in kernels:
        spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for k in ks:
            if k.coll is None:
                continue
            tp_group = sim.rs.tp > 1 and k.coll.group == sim.rs.tp
            stream = stream_of.get(k.label or "") or ("pp_comm" if k.coll.p2p else "tp_comm" if tp_group else "dp_comm")
            spans[stream].append((k.ev.ts, k.ev.end))
        for stream, sp in spans.items():
            meas[stream] += union_us(sp) * 1e-6 / n
    b = sim.result.breakdown_s
    return [_row(f"{name} communication busy", b.get(f"{stream}_busy", 0.0), meas.get(stream, 0.0), "category")
            for name, stream in (("TP", "tp_comm"), ("DP", "dp_comm"), ("PP", "pp_comm"))
            if f"{stream}_busy" in b or meas.get(stream)]


def _sim_class(sim: SimSide) -> dict[int, str]:
    return {op.id: family(work_class(op.work)) for op in sim.schedule.ops}


def class_rows(sim: SimSide, steps: Sequence[StepSummary]) -> list[dict[str, Any]]:
    cls_of, n = _sim_class(sim), len(steps) or 1
    sim_busy: dict[str, float] = defaultdict(float)
    groups: dict[str, list[Event]] = defaultdict(list)
    for e in sim.events:
        groups[cls_of.get(e.op_id, "other")].append(e)
    for cls, evs in groups.items():
        sim_busy[cls] = _sim_union(evs, lambda e: True)
    meas: dict[str, float] = defaultdict(float)
    for s in steps:
        for cls, t in s.busy_s.items():
            meas[family(cls)] += t / n
    return [_row(f"class {c}", sim_busy.get(c, 0.0), meas.get(c, 0.0), "class") for c in sorted(set(sim_busy) | set(meas))]


def op_type_rows(sim: SimSide, steps: Sequence[StepSummary], kernels: Sequence[Sequence[Kernel]]) -> list[dict]:
    """Sum of op time per step by meshsim op type when the trace is labelled, else by GEMM shape."""
    n = len(steps) or 1
    labelled = any(s.labels for s in steps)
    sim_t: dict[str, float] = defaultdict(float)
    meas_t: dict[str, float] = defaultdict(float)
    if labelled:
        for e in sim.events:
            sim_t[op_type(e.name)] += e.dur_s
        for s in steps:
            for name, (t, _) in s.labels.items():
                meas_t[op_type(name)] += t / n
    else:
        works = {op.id: op.work for op in sim.schedule.ops}
        for e in sim.events:
            w = works.get(e.op_id)
            if w is not None and work_class(w) == "gemm":
                sim_t[f"gemm {w.batch}x{w.m}x{w.n}x{w.k}" if w.batch > 1 else f"gemm {w.m}x{w.n}x{w.k}"] += e.dur_s
        for ks in kernels:
            for k in ks:
                if k.gemm is not None:
                    meas_t[f"gemm {k.gemm.label}"] += k.ev.dur * 1e-6 / n
    return [_row(name, sim_t.get(name, 0.0), meas_t.get(name, 0.0), "op type") for name in set(sim_t) | set(meas_t)]


def busbw_rows(sim: SimSide, steps: Sequence[StepSummary]) -> list[dict[str, Any]]:
    """Measured collectives by size with the model's time and busbw for the same op, group size and bytes."""
    coster, out = CollectiveCoster(sim.rs), []
    for r in collective_table(steps):
        row = {**r, "model_us": None, "model_busbw_GBps": None}
        g = r["group"]
        if r["op"] in MODEL_OPS and g and 1 < g <= sim.rs.gpus and r["bytes"]:
            kind = "tp" if g == sim.rs.tp else "dp"
            group = sim.rs.group(kind, 0)
            group = group if len(group) == g else tuple(range(g))
            _, model = coster.cost(Collective(r["op"], kind, r["bytes"]), group)
            row.update(model_us=model.time_us, model_busbw_GBps=model.busbw_gbps)
        out.append(row)
    return out


def step_kernels(data: RankData, step: int | None) -> list[list[Kernel]]:
    steps = trace_steps(data.trace)
    return [kernels_in(data.kernels, w, data.starts) for s, w in zip(steps, step_windows(steps), strict=True)
            if step is None or s.number == step]


def compare_trace(sim: SimSide, ranks: Sequence[RankData], steps: Sequence[StepSummary],
                  step: int | None = None) -> dict[str, Any]:
    """The comparison document (module docstring); `rows` empty when the structure disagrees."""
    rank = ranks[0].trace.rank
    mine = [s for s in steps if s.rank == rank]
    kernels = step_kernels(ranks[0], step)
    check = structure(sim, mine, kernels)
    doc: dict[str, Any] = {"simulated": sim.label, "trace": [d.trace.path for d in ranks], "rank": rank,
                           "steps": [s.step for s in mine], "structure": list(check.rows),
                           "structure_issues": list(check.issues), "rows": [], "collectives": []}
    if not check.ok:
        return doc
    rows = (category_rows(sim, mine) + comm_stream_rows(sim, kernels) + class_rows(sim, mine)
            + op_type_rows(sim, mine, kernels))
    doc["rows"] = sorted(rows, key=lambda r: -abs(r["delta_s"]))
    doc["collectives"] = busbw_rows(sim, mine)
    return doc
