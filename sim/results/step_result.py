"""StepResult: the headline numbers of one simulated training step, and the public results JSON.

- tokens_per_s = global_batch * seq_len / step_time_s
- tflops_per_gpu = model FLOPs per step / step_time_s / GPUs / 1e12 (model FLOPs: no recompute,
  Narayanan et al. 2021 convention; sim/cost/flops.py)
- mfu = tflops_per_gpu / GPU peak dense bf16 TFLOP/s (topologies/gpus.py), with FP8 training too: the
  sources (NeMo / Megatron-Bridge performance tables) report model TFLOP/s per GPU counted as Megatron
  counts them (the 16-bit formula, whatever precision the GEMMs ran in), and MFU against the 16-bit peak;
  so an FP8 run's MFU is never quoted on the FP8 peak
- hfu = hardware FLOPs per step (recompute included, sim/cost/flops.py) / step_time_s / GPUs / peak
The breakdown and layer spans are those of the representative rank (the lowest simulated rank: with
pipeline parallelism, a rank of the first stage). With pp > 1 the breakdown and critical-path shares gain
the P2P communication and pipeline-bubble categories, `pipeline` holds the bubble fraction and P2P share
of the stage that sets the step, and memory_gb gains the per-stage figures (sim/cost/memory.py).

The results JSON says its units in its keys: seconds `_s`, `memory_gb` in GB (1e9 B; reports show GiB),
bandwidth `_GBps` in GB/s (1e9 B/s). Files written before a key was renamed are read through
`upgrade_result_dict` (old `*_gbps` collective keys, old breakdown keys).

The blocks are typed records (sim/results/records.py, critical_path.Segment, steady_state.SteadyState);
`to_dict` / `from_dict` are the JSON boundary. Every StepResult is built by `assemble`, from a simulated
run (`build_result` reads the pieces off its event log) or an extrapolated one (simulate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, is_not

import numpy as np

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.cost.memory import MemoryBreakdown
from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.results import breakdown as bd
from meshsim.sim.results import path_columns as pc
from meshsim.sim.results import row_fields as rf
from meshsim.sim.results.critical_path import OpTypeRow, Segment, shares, top_op_types
from meshsim.sim.results.records import (
    COLLECTIVE_JSON_KEYS,
    CONFIG_KEYS,
    MEMORY_KEYS,
    CollectiveRow,
    ConfigEcho,
    EpComm,
    JsonDict,
    MemoryGB,
    PipelineSummary,
    TopOpType,
)
from meshsim.sim.results.steady_state import SteadyState
from meshsim.sim.schedule.ops import Collective, Schedule

HEADLINE_KEYS = ("scenario", "fits", "step_time_s", "layer_fwd_ms", "layer_bwd_ms", "tokens_per_s", "tflops_per_gpu",
                 "mfu", "hfu")
TOP_OP_TYPES = 10
__all__ = ["CONFIG_KEYS", "HEADLINE_KEYS", "MEMORY_KEYS", "StepResult", "assemble", "build_result"]


@dataclass(frozen=True)
class StepResult:
    scenario: str
    step_time_s: float
    layer_fwd_ms: float
    layer_bwd_ms: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    memory_gb: MemoryGB
    breakdown_s: Mapping[str, float]  # BREAKDOWN_KEYS (sim/results/breakdown.py)
    critical_path: tuple[Segment, ...]
    critical_path_share: Mapping[str, float]  # compute, tp_comm, dp_comm, waiting (+ pp_comm, ...)
    config: ConfigEcho  # flattened into the top level of to_dict()
    collectives: tuple[CollectiveRow, ...] = ()  # one per distinct collective: algo, protocol, busbw
    source: str = ""
    explicit_ranks: bool = False
    simulated_ranks: int = 1
    ops_per_rank: int = 0
    steady_state: SteadyState | None = None  # which path gave the figures (sim/results/steady_state.py)
    pipeline: PipelineSummary | None = None  # pp > 1
    hfu: float = 0.0
    ep_comm: EpComm | None = None  # MoE: one layer's dispatch / combine and their critical-path seconds
    # not serialized; in completion order: a tuple of Event, or the compiled core's arrays (an EventRows,
    # sim/engine/event_rows.py: each Event built when read, so stream it rather than list it)
    events: Sequence[Event] = field(default=(), compare=False, repr=False)
    # not serialized, for trace and timeline: (rank, op id) -> its collective row; (group kind, rank) -> ranks
    op_collectives: Mapping[tuple[int, int], CollectiveRow] = field(default_factory=dict, compare=False, repr=False)
    rank_groups: Mapping[tuple[str, int], tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)
    # not serialized: every op type on the critical path, top_op_types(critical_path, all), typed once
    # (results.json, the EP totals and the printed table read it): set by assemble, else when first read;
    # not an init field, so dataclasses.replace (a new critical path, sim/sweep/record.py) starts without it
    path_op_types: tuple[OpTypeRow, ...] | None = field(default=None, init=False, compare=False, repr=False)
    # not compared: the critical_path_top rows read back from a file that has no op-by-op path (from_dict)
    saved_top: tuple[TopOpType, ...] = field(default=(), compare=False, repr=False)

    @property
    def fits(self) -> bool:
        return self.memory_gb.fits

    def top_op_types(self, n: int) -> list[OpTypeRow]:
        """top_op_types(self.critical_path, n), from the list assemble computed (the same sort, cut at n)."""
        rows = self.path_op_types
        if rows is None:
            rows = all_op_types(self.critical_path)
            object.__setattr__(self, "path_op_types", rows)
        return list(rows[:n])

    def __getitem__(self, key: str) -> object:
        """result["tp"] reads a config echo, result["mfu"] a headline field."""
        return getattr(self.config, key) if self.config.has(key) else getattr(self, key)

    def to_dict(self, *, full_critical_path: bool = True) -> JsonDict:
        """The public results JSON: headline numbers, the config echo (flat), then the detail blocks.
        The critical path is summarised (`critical_path_top`); its op-by-op list only if asked for."""
        out: JsonDict = {k: getattr(self, k) for k in HEADLINE_KEYS}
        out.update(self.config.to_json())
        out.update(memory_gb=self.memory_gb.to_json(), breakdown_s=dict(self.breakdown_s),
                   critical_path_share=dict(self.critical_path_share),
                   critical_path_top=self._critical_path_top(), source=self.source,
                   explicit_ranks=self.explicit_ranks, simulated_ranks=self.simulated_ranks,
                   ops_per_rank=self.ops_per_rank,
                   steady_state=self.steady_state.to_json() if self.steady_state is not None else None,
                   collectives=[c.to_json() for c in self.collectives])
        if self.pipeline is not None:
            out["pipeline"] = self.pipeline.to_json()
        if self.ep_comm is not None:
            out["ep_comm"] = self.ep_comm.to_json()
        if full_critical_path:
            out["critical_path"] = [seg.to_json() for seg in self.critical_path]
        return out

    def _critical_path_top(self) -> list[JsonDict]:
        """critical_path_top of the op-by-op path (or of the op types assemble kept), else the saved rows."""
        if self.saved_top and not self.critical_path:
            return [row.to_json() for row in self.saved_top]
        return critical_path_top(self.top_op_types(TOP_OP_TYPES))

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> StepResult:
        """Inverse of to_dict (events are not saved); old files are upgraded first."""
        data = upgrade_result_dict(data)
        names = {f.name for f in fields(cls)} - {"events", "op_collectives", "rank_groups", "path_op_types",
                                                 "saved_top"}
        kw = {k: data[k] for k in names if k in data}
        kw.setdefault("layer_fwd_ms", 0.0)  # absent from partial files (compare reads them): not shown there
        kw.setdefault("layer_bwd_ms", 0.0)
        kw["memory_gb"] = MemoryGB.from_json(data["memory_gb"])
        kw["critical_path"] = tuple(Segment.from_json(s) for s in data.get("critical_path", ()))
        kw["collectives"] = tuple(CollectiveRow.from_json(c) for c in data.get("collectives", ()))
        kw["config"] = ConfigEcho.from_json(data)
        kw["steady_state"] = SteadyState.from_json(data["steady_state"]) if data.get("steady_state") else None
        kw["pipeline"] = PipelineSummary.from_json(data["pipeline"]) if data.get("pipeline") else None
        kw["ep_comm"] = EpComm.from_json(data["ep_comm"]) if data.get("ep_comm") else None
        if "critical_path" not in data:  # the path's summary is all the file has of it
            kw["saved_top"] = tuple(TopOpType.from_json(row) for row in data.get("critical_path_top", ()))
        return cls(**kw)


def critical_path_top(rows: Sequence[OpTypeRow]) -> list[JsonDict]:
    """The op types holding the most critical-path time (top_op_types rows): [{op_type, category, total_s,
    count}]."""
    return [{"op_type": kind, "category": cat, "total_s": total_us * 1e-6, "count": count}
            for kind, cat, total_us, count in rows]


def all_op_types(path: Sequence[Segment]) -> tuple[OpTypeRow, ...]:
    """Every op type on the path, top_op_types' order: any top-n list is its first n rows."""
    return tuple(top_op_types(path, len(path)))


def upgrade_result_dict(data: Mapping[str, object]) -> JsonDict:
    """A results dict from any meshsim version -> the current keys (old `*_gbps` collective keys, old
    breakdown keys compute/tp_comm/dp_comm/idle, no top-level `fits`)."""
    out = dict(data)
    if isinstance(out.get("breakdown_s"), Mapping):
        out["breakdown_s"] = bd.upgrade_breakdown(out["breakdown_s"], float(out.get("step_time_s", 0.0)))
    if isinstance(out.get("collectives"), list):
        out["collectives"] = [{COLLECTIVE_JSON_KEYS.get(k, k): v for k, v in c.items()} for c in out["collectives"]]
    if "fits" not in out and isinstance(out.get("memory_gb"), Mapping):
        out["fits"] = bool(out["memory_gb"].get("fits", True))
    return out


def config_echo(rs: ResolvedScenario) -> ConfigEcho:
    """The scenario settings a reader needs next to the numbers."""
    sc, par, run = rs.scenario, rs.scenario.parallel, rs.scenario.run
    moe = sc.model.moe is not None
    return ConfigEcho(
        tp=rs.tp, pp=rs.pp, sp=par.sp, dp=rs.dp, gpus=rs.gpus, micro_batch=par.micro_batch,
        micro_batches=rs.micro_batches, global_batch=par.global_batch, seq_len=sc.model.seq_len,
        recompute=par.recompute, tp_comm_overlap=par.tp_comm_overlap,
        topology=sc.topology.preset or rs.topology.name, nodes=rs.topology.nodes, gpu=rs.gpu.name,
        gpus_per_node=rs.topology.gpus_per_node, crosses_nodes=rs.crosses_nodes(),
        release=rs.release.name if rs.release is not None else None,
        vp=rs.vp if rs.pp > 1 else None,  # virtual stages only mean something with pp > 1
        ep=rs.ep if moe else None, etp=rs.etp if moe else None, edp=rs.edp if moe else None,
        moe_dispatcher=par.moe_dispatcher if moe else None, moe_ep_overlap=par.moe_ep_overlap if moe else None,
        fp8=run.fp8, fp8_format=run.fp8_format if run.fp8_on else None,
        fp8_param_gather=run.fp8_param_gather if run.fp8_on else None,
        fp8_attention=run.fp8_attention if run.fp8_on else None,
        recompute_modules=list(par.recompute_modules) if par.recompute_modules is not None else None,
        optimizer=non_defaults(sc.optimizer) or None,
        cp=rs.cp, cp_comm=par.cp_comm if rs.cp > 1 else None,
        delay_wgrad_compute=par.delay_wgrad_compute if moe and par.moe_ep_overlap else None,
        mtp_layers=sc.model.mtp_layers or None,
        fsdp=True if par.fsdp else None,
        dist_opt_instances=par.dist_opt_instances if par.dist_opt_instances > 1 else None,
    )


def non_defaults(section) -> JsonDict:
    """section.model_dump(exclude_defaults=True) for a section of plain fields (numbers, strings, bools, None):
    each field, in order, whose value != its default, read off the model without building pydantic's
    serializer (a few ms of a one-off run)."""
    out: JsonDict = {}
    for name, spec in type(section).model_fields.items():
        value = getattr(section, name)
        if value != spec.get_default(call_default_factory=True):
            out[name] = value
    return out


def pipeline_summary(rs: ResolvedScenario, path_shares: Mapping[str, float],
                     breakdown: Mapping[str, float]) -> PipelineSummary | None:
    """pp > 1: the bubble fraction and P2P share of the critical path (the stage that sets the step)."""
    if rs.pp == 1:
        return None
    p = rs.scenario.parallel
    return PipelineSummary(
        pp=rs.pp, vp=rs.vp, microbatch_group_size=p.microbatch_group_size or rs.pp,
        bubble_fraction=path_shares.get("pipeline_bubble", 0.0), p2p_share=path_shares.get("pp_comm", 0.0),
        ideal_bubble_fraction=(rs.pp - 1) / (rs.vp * rs.micro_batches + rs.pp - 1),
        rank0_bubble_s=breakdown.get("pipeline_bubble", 0.0))


def op_collectives(schedule: Schedule, collectives: Sequence[CollectiveRow]) -> dict[int, CollectiveRow]:
    """op id -> the row of `collectives` it runs, in op order: looked up once per work object (ops stamped
    from one template share theirs), then spread over the ops by C-level passes."""
    return dict(zip(*op_collective_columns(schedule, collectives), strict=True))


def op_collective_columns(schedule: Schedule, collectives: Sequence[CollectiveRow], as_array: bool = False
                          ) -> tuple[Sequence[int], list[CollectiveRow]]:
    """(op ids, their rows) of the ops that run a row of `collectives`, in op order (op_collectives' items).
    `as_array`: the ids of a tiled schedule (its ops' positions, strictly increasing) as an int64 array,
    8 bytes an entry instead of an int object and a list slot (~40 bytes)."""
    rows = {c.key: c for c in collectives}
    table = schedule.work_table
    row_of = [rows.get((w.op, w.group, w.nbytes, w.kernel)) if isinstance(w, Collective) else None
              for w in table.works]
    at = np.flatnonzero(np.fromiter(map(is_not, row_of, repeat(None)), bool, len(row_of))[table.index])
    if schedule.tiled_arrays is not None:
        ids = at.astype(np.int64) if as_array else at.tolist()
    else:
        ids = list(map(_ID, map(schedule.ops.__getitem__, at.tolist())))
    return ids, list(map(row_of.__getitem__, table.index[at].tolist()))


def op_collectives_per_op(schedule: Schedule, collectives: Sequence[CollectiveRow]) -> dict[int, CollectiveRow]:
    """op_collectives the long way, op by op (the reference tests compare it with)."""
    rows = {c.key: c for c in collectives}
    return {op.id: rows[key] for op in schedule.ops if isinstance(op.work, Collective)
            and (key := (op.work.op, op.work.group, op.work.nbytes, op.work.kernel)) in rows}


_ID = attrgetter("id")


def rows_by_event(schedules: Sequence[Schedule], collectives: Sequence[CollectiveRow], ranks: Sequence[int],
                  stage_size: int) -> RankOpRows:
    """(simulated rank, op id) -> its collective row; rank r runs the schedule of stage r // stage_size
    (pipeline stages outermost; one schedule: every rank runs it). A RankOpRows: the long way's mapping
    (tests/results_reference/rank_rows.py), each stage's rows found when first read (a run that writes no
    trace nor timeline never reads them), without one (rank, op id) tuple per entry."""
    collectives = tuple(collectives)
    return RankOpRows([partial(op_collective_columns, s, collectives, as_array=True) for s in schedules], ranks,
                      stage_size)


def _stage_of(rank: int, stage_size: int, stages: int) -> int:
    return min(rank // stage_size, stages - 1) if stages > 1 else 0


class RankOpRows(Mapping):
    """(rank, op id) -> collective row, held as each stage's (op ids, rows) in op order (`stages[s]()` gives
    them, called once, when first needed) and the stage each rank runs: the dict the long way
    (tests/results_reference/rank_rows.py) builds, item for item and in its order (ranks in first-seen order,
    each its stage's ops in op order; a stage's repeated op id: one item, at its first place, with its last row,
    as dict() keeps), without its tuples. `key_arrays` gives the keys as columns. A stage's op ids may be an
    int64 array: an int key is then found by bisection where they are strictly increasing (no dict built for it:
    a timeline's hover looks up a few thousand keys of 10^5), and iterated as ints."""

    def __init__(self, stages: Sequence[Callable[[], tuple[Sequence, Sequence]]], ranks: Sequence[int],
                 stage_size: int):
        self._sources = list(stages)
        self._columns: dict[int, tuple[Sequence, Sequence]] = {}
        self._dicts: dict[int, dict] = {}
        self._increasing: dict[int, bool] = {}
        self._stage = {rank: _stage_of(rank, stage_size, len(self._sources)) for rank in ranks}

    def _cols(self, stage: int) -> tuple[Sequence, Sequence]:
        hit = self._columns.get(stage)
        if hit is None:
            hit = self._columns[stage] = self._sources[stage]()
        return hit

    def _dict(self, stage: int) -> dict:
        hit = self._dicts.get(stage)
        if hit is None:
            ids, rows = self._cols(stage)
            hit = self._dicts[stage] = dict(zip(ids.tolist() if isinstance(ids, np.ndarray) else ids, rows,
                                                strict=True))
        return hit

    def _sorted_ids(self, stage: int) -> np.ndarray | None:
        """The stage's op ids where they are an int64 array, strictly increasing; else None."""
        ids = self._cols(stage)[0]
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64:
            return None
        hit = self._increasing.get(stage)
        if hit is None:
            hit = self._increasing[stage] = bool(len(ids) < 2 or (ids[1:] > ids[:-1]).all())
        return ids if hit else None

    def __getitem__(self, key: tuple[int, int]) -> CollectiveRow:
        if type(key) is not tuple or len(key) != 2:
            hash(key)  # an unhashable key raises TypeError, as a dict's lookup does
            raise KeyError(key)
        stage = self._stage.get(key[0])
        if stage is None:
            raise KeyError(key)
        op = key[1]
        ids = self._sorted_ids(stage) if type(op) is int and -2**63 <= op < 2**63 else None
        if ids is None:
            return self._dict(stage)[op]
        at = int(np.searchsorted(ids, op))
        if at < len(ids) and int(ids[at]) == op:
            return self._cols(stage)[1][at]
        raise KeyError(op)

    def __iter__(self):
        for rank, stage in self._stage.items():
            yield from zip(repeat(rank), self._dict(stage))

    def __len__(self) -> int:
        return sum(len(self._dict(stage)) for stage in self._stage.values())

    def key_arrays(self) -> tuple[np.ndarray, np.ndarray, list[CollectiveRow]] | None:
        """(ranks, op ids, rows) of every entry in iteration order, ranks and op ids as int64; None where an
        op id or a rank is not an int of 64 bits, or a stage repeats an op id."""
        ranks = _int64s(self._stage)
        if ranks is None:
            return None
        ids, rows = {}, {}
        for stage in dict.fromkeys(self._stage.values()):
            stage_ids, stage_rows = self._cols(stage)
            ids[stage] = stage_ids if isinstance(stage_ids, np.ndarray) and stage_ids.dtype == np.int64 \
                else _int64s(stage_ids)
            if ids[stage] is None or len(np.unique(ids[stage])) != len(ids[stage]):
                return None
            rows[stage] = stage_rows
        per_rank = [ids[stage] for stage in self._stage.values()]
        counts = np.fromiter(map(len, per_rank), np.int64, len(per_rank))
        return (np.repeat(ranks, counts), np.concatenate(per_rank) if per_rank else np.zeros(0, np.int64),
                list(chain.from_iterable(rows[stage] for stage in self._stage.values())))


def _int64s(values: Collection) -> np.ndarray | None:
    """The values as int64, None unless each is an int (exactly) of 64 bits."""
    if not all(type(v) is int for v in values):
        return None
    try:
        return np.fromiter(values, np.int64, len(values))
    except OverflowError:
        return None


def build_result(rs: ResolvedScenario, schedule: Schedule | Sequence[Schedule], log: EventLog, *,
                 memory: MemoryBreakdown, model_flops: float, collectives: Sequence[CollectiveRow] = (),
                 explicit_ranks: bool = False, hardware_flops: float | None = None,
                 rank_groups: Mapping[tuple[str, int], tuple[int, ...]] | None = None,
                 steady_state: SteadyState | None = None, lean: bool = False) -> StepResult:
    """`assemble` with the pieces read off a whole simulated step's event log (`schedule`: one, or one per
    pipeline stage). `lean`: without the op-by-op critical path, the events and the op -> collective map
    (what a sweep's record drops: sim/sweep/record.py)."""
    schedules = (schedule,) if isinstance(schedule, Schedule) else tuple(schedule)
    pipeline = len(schedules) > 1
    step_s = log.step_time_s
    rep = log.of_rank(log.ranks[0])
    path = pc.critical_path_columns(schedules, log)
    breakdown_s = bd.breakdown(rep, step_s, pipeline=pipeline, schedules=schedules)
    by_op = rows_by_event(schedules, collectives, log.ranks, rs.stage_size) if lean is False else {}
    return assemble(rs, step_s, rep, breakdown_s, path, memory=memory, model_flops=model_flops,
                    collectives=collectives, explicit_ranks=explicit_ranks, simulated_ranks=len(log.ranks),
                    ops_per_rank=max(len(s.ops) for s in schedules), events=log.events if lean is False else (),
                    steady_state=steady_state, hardware_flops=hardware_flops, op_collectives=by_op,
                    rank_groups=rank_groups, schedules=schedules, lean=lean)


def assemble(rs: ResolvedScenario, step_s: float, rep: Sequence[Event], breakdown_s: Mapping[str, float],
             path: Sequence[Segment], *, memory: MemoryBreakdown, model_flops: float,
             collectives: Sequence[CollectiveRow], explicit_ranks: bool, simulated_ranks: int, ops_per_rank: int,
             events: Sequence[Event], steady_state: SteadyState | None = None,
             hardware_flops: float | None = None,
             op_collectives: Mapping[tuple[int, int], CollectiveRow] | None = None,
             rank_groups: Mapping[tuple[str, int], tuple[int, ...]] | None = None,
             schedules: Sequence[Schedule] = (), lean: bool = False) -> StepResult:
    """The one constructor of a StepResult, from a step time, the representative rank's events (layer
    spans of micro-batch 0), its breakdown and the critical path: those of a whole simulated step
    (build_result) or of an extrapolated one (sim/results/simulate.py, steady_state.py). The optional
    op_collectives / rank_groups feed the trace's and timeline's collective details; `schedules` (those
    the events' ops belong to) lets the layer spans and EP times read their columns (row_fields.py).
    `path`: Segments or their PathColumns (summed over the columns, the Segments built only for the
    result's critical_path). `lean` (a sweep's record, sim/sweep/record.py): the result's critical_path
    is left empty; its op types are kept (path_op_types), so critical_path_top is the full run's."""
    moe = rs.scenario.model.moe is not None
    columns = isinstance(path, pc.PathColumns)
    if columns:
        path_shares = pc.shares(path, step_s, rs.pp > 1, moe=moe, cp_=rs.cp > 1)
    else:
        path_shares = shares(list(path), step_s, rs.pp > 1, moe=moe, cp=rs.cp > 1)
    op_types = tuple(pc.top_op_types(path, len(path))) if columns else all_op_types(path)
    fields_ = rf.row_fields(rep, schedules) if schedules else None
    layer = bd.middle_layer(rep) if fields_ is None else rf.middle_layer(fields_)
    tflops = model_flops / step_s / rs.gpus / 1e12 if step_s > 0 else 0.0
    hw_tflops = (hardware_flops if hardware_flops is not None else model_flops) / step_s / rs.gpus / 1e12 \
        if step_s > 0 else 0.0
    tokens = rs.scenario.parallel.global_batch * rs.scenario.model.seq_len
    result = StepResult(
        scenario=rs.name, step_time_s=step_s,
        layer_fwd_ms=_layer_span_ms(rep, fields_, layer, ("fwd",)),
        layer_bwd_ms=_layer_span_ms(rep, fields_, layer, ("bwd", "recompute")),
        tokens_per_s=tokens / step_s if step_s > 0 else 0.0,
        tflops_per_gpu=tflops, mfu=tflops / rs.datasheet_peak_tflops, hfu=hw_tflops / rs.datasheet_peak_tflops,
        memory_gb=MemoryGB.of(memory), breakdown_s=dict(breakdown_s),
        critical_path=() if lean else path.segment_tuple() if columns else tuple(path), critical_path_share=path_shares,
        config=config_echo(rs), collectives=tuple(collectives), source=rs.source,
        explicit_ranks=explicit_ranks, simulated_ranks=simulated_ranks, ops_per_rank=ops_per_rank,
        steady_state=steady_state, pipeline=pipeline_summary(rs, path_shares, breakdown_s), events=events,
        op_collectives=op_collectives if isinstance(op_collectives, RankOpRows) else dict(op_collectives or {}),
        rank_groups=dict(rank_groups or {}),
        ep_comm=ep_comm_summary(rep, op_types, fields_),
    )
    object.__setattr__(result, "path_op_types", op_types)  # frozen: set once, as top_op_types does
    return result


def _layer_span_ms(rep: Sequence[Event], fields_: rf.RowFields | None, layer: int | None,
                   phases: tuple[str, ...]) -> float:
    return bd.layer_span_ms(rep, layer, phases) if fields_ is None else rf.layer_span_ms(fields_, layer, phases)


def ep_comm_summary(rep: Sequence[Event], op_types: Sequence[OpTypeRow],
                    fields_: rf.RowFields | None = None) -> EpComm | None:
    """The MoE token all-to-alls: one layer's times (ms) and their critical-path seconds per op type
    (`op_types`: all_op_types of the critical path; `fields_`: rep's row_fields, when it has them)."""
    layer = bd.ep_layer_ms(rep) if fields_ is None else rf.ep_layer_ms(fields_)
    if not layer:
        return None
    on_path = {kind: total_us * 1e-6 for kind, _, total_us, _ in op_types if kind in bd.EP_OPS}
    return EpComm(layer, {k: on_path.get(k, 0.0) for k in bd.EP_OPS if k in layer})
