"""The typed blocks of a StepResult (sim/results/step_result.py): one frozen record per concept, shared by
run, sweep, compare, the outputs and validate's cross-check. Dicts appear only at the JSON boundary:
each record's `to_json()` writes its results-JSON block (keys in field order) and `from_json()` reads it
back, so that `Record.from_json(r.to_json()) == r`.

- ConfigEcho: the scenario settings echoed at the top level of results.json
- MemoryGB / StageMemory: the memory_gb block (GB, 1e9 B), per stage with pipeline parallelism
- CollectiveRow: one row of `collectives` per distinct collective (op, group, bytes, kernel)
- PipelineSummary: the `pipeline` block (pp > 1)
- EpComm: the `ep_comm` block (MoE models: per-layer dispatch / combine, their critical-path seconds)
The critical-path segments (critical_path.Segment) and the steady-state block (steady_state.SteadyState)
are records of their own modules with the same to_json / from_json pair.

Adding a results field (see docs/architecture.md, "Results records"): add it to the record it belongs to
with a default, fill it where the record is built (step_result.py: config_echo, memory_echo,
pipeline_summary; simulate.py: CollectiveCoster for collective rows). An optional field of ConfigEcho or
MemoryGB is written only when it is not None, so results that lack it keep their bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from meshsim.sim.core.fmt import rank_label
from meshsim.sim.cost.memory import MemoryBreakdown

JsonDict = dict[str, Any]  # a JSON object (the boundary's type; values are JSON scalars, lists or objects)


def _present(record: object) -> JsonDict:
    """Fields in declaration order, those that are None left out (optional echoes)."""
    return {f.name: v for f in fields(record) if (v := getattr(record, f.name)) is not None}


def _known(cls: type, data: Mapping[str, Any], rename: Mapping[str, str] | None = None) -> JsonDict:
    """The keys of `data` that are fields of `cls` (JSON key -> field name through `rename`); keys a newer
    or older meshsim wrote are ignored, absent ones take the field's default."""
    names = {f.name for f in fields(cls)}
    rename = rename or {}
    return {rename.get(k, k): v for k, v in data.items() if rename.get(k, k) in names}


@dataclass(frozen=True)
class ConfigEcho:
    """The settings a reader needs next to the numbers. None: not echoed (vp without pipeline
    parallelism, the MoE keys without MoE layers, or a key absent from a partial file)."""

    tp: int | None = None
    pp: int | None = None
    sp: bool | None = None
    dp: int | None = None
    gpus: int | None = None
    micro_batch: int | None = None
    micro_batches: int | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    recompute: str | None = None
    tp_comm_overlap: bool | None = None
    topology: str | None = None
    nodes: int | None = None
    gpu: str | None = None
    gpus_per_node: int | None = None
    crosses_nodes: bool | None = None
    release: str | None = None  # the software-release profile the constants came from (scenarios/releases.py)
    vp: int | None = None  # pp > 1
    ep: int | None = None  # MoE models: ep .. moe_ep_overlap
    etp: int | None = None
    edp: int | None = None
    moe_dispatcher: str | None = None
    moe_ep_overlap: bool | None = None
    fp8: str | None = None  # run.fp8, "off" included (None: a file written before FP8 existed)
    fp8_format: str | None = None  # with FP8 on: fp8_format .. fp8_attention
    fp8_param_gather: bool | None = None
    fp8_attention: bool | None = None
    recompute_modules: list[str] | None = None  # parallel.recompute_modules, when set
    optimizer: dict[str, Any] | None = None  # the optimizer section's fields a scenario sets (not defaults)
    cp: int | None = None  # parallel.cp (None: a file written before CP existed); cp_comm with cp > 1
    cp_comm: str | None = None
    delay_wgrad_compute: bool | None = None  # with moe_ep_overlap (None without it)
    mtp_layers: int | None = None  # model.mtp_layers, when > 0
    fsdp: bool | None = None  # parallel.fsdp, when on
    dist_opt_instances: int | None = None  # parallel.dist_opt_instances, when > 1

    def to_json(self) -> JsonDict:
        return _present(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConfigEcho:
        """From the top level of a results JSON (the other top-level keys are ignored)."""
        return cls(**_known(cls, data))

    def has(self, key: str) -> bool:
        """Whether `key` is echoed."""
        return key in KEYS and getattr(self, key) is not None

    def rank_label(self, rank: int) -> str:
        """'rank 9 (tp 1, dp 1, node 1)': the rank's mesh position under this configuration."""
        return rank_label(rank, self.tp or 1, self.dp or 1, self.pp or 1, self.gpus_per_node or 0, self.cp or 1)


KEYS = tuple(f.name for f in fields(ConfigEcho))
CONFIG_KEYS = KEYS[:KEYS.index("vp")]  # echoed for every scenario


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's memory per GPU (GB)."""

    stage: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    total: float

    def to_json(self) -> JsonDict:
        return _present(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageMemory:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class MemoryGB:
    """The results-JSON memory_gb block (GB per GPU; pipeline: the worst stage's figures, `worst_stage`
    and one StageMemory per stage). Fields absent from a partial file read as 0 (fits: True)."""

    weights: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    workspace: float = 0.0
    total: float = 0.0
    capacity: float = 0.0
    fits: bool = True
    worst_stage: int | None = None  # pp > 1
    stages: tuple[StageMemory, ...] | None = None  # pp > 1
    host_optimizer: float | None = None  # optimizer.cpu_offload: the offloaded states in host memory

    @classmethod
    def of(cls, mem: MemoryBreakdown) -> MemoryGB:
        """From the memory model's breakdown (sim/cost/memory.py)."""
        stages = tuple(StageMemory(i, s.weights_gb, s.grads_gb, s.optimizer_gb, s.activations_gb, s.total_gb)
                       for i, s in enumerate(mem.stages)) or None
        return cls(mem.weights_gb, mem.grads_gb, mem.optimizer_gb, mem.activations_gb, mem.workspace_gb,
                   mem.total_gb, mem.capacity_gb, bool(mem.fits), mem.worst_stage if stages else None, stages,
                   mem.host_gb or None)

    def to_json(self) -> JsonDict:
        out = _present(self)
        if self.stages is not None:
            out["stages"] = [s.to_json() for s in self.stages]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MemoryGB:
        kw = _known(cls, data)
        if kw.get("stages") is not None:
            kw["stages"] = tuple(StageMemory.from_json(s) for s in kw["stages"])
        return cls(**kw)


OPTIONAL_MEMORY_KEYS = ("worst_stage", "stages", "host_optimizer")
MEMORY_KEYS = tuple(f.name for f in fields(MemoryGB) if f.name not in OPTIONAL_MEMORY_KEYS)  # every scenario's

# collective rows: field -> results-JSON key (the JSON spells GB/s; old files used the field names)
COLLECTIVE_JSON_KEYS = {"busbw_gbps": "busbw_GBps", "algbw_gbps": "algbw_GBps"}


@dataclass(frozen=True)
class CollectiveRow:
    """One distinct collective of a step: what it moves, how NCCL would run it, its time and count."""

    op: str
    group: str  # tp | dp | ep ... (sim/schedule)
    ranks: int
    nbytes: int
    kernel: str = "nccl"  # written only when not "nccl"
    algo: str = ""
    protocol: str = ""
    time_us: float = 0.0
    algbw_gbps: float = 0.0
    busbw_gbps: float = 0.0
    source: str = ""  # model | calibrated | trivial
    count: int = 1  # per step

    @property
    def key(self) -> tuple[str, str, int, str]:
        """(op, group, nbytes, kernel): what identifies the collective of a schedule op."""
        return self.op, self.group, self.nbytes, self.kernel

    def to_json(self) -> JsonDict:
        out = {COLLECTIVE_JSON_KEYS.get(k, k): v for k, v in _present(self).items()}
        if self.kernel == "nccl":
            del out["kernel"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CollectiveRow:
        """From a results-JSON row (new `*_GBps` or old `*_gbps` keys)."""
        return cls(**_known(cls, data, {v: k for k, v in COLLECTIVE_JSON_KEYS.items()}))


@dataclass(frozen=True)
class PipelineSummary:
    """pp > 1: the bubble fraction and P2P share of the critical path (the stage that sets the step),
    the ideal bubble (p - 1) / (v m + p - 1), and rank 0's bubble seconds."""

    pp: int
    vp: int
    microbatch_group_size: int
    bubble_fraction: float
    p2p_share: float
    ideal_bubble_fraction: float
    rank0_bubble_s: float

    def to_json(self) -> JsonDict:
        return _present(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PipelineSummary:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class EpComm:
    """MoE models: one MoE layer's token all-to-alls in ms (the middle layer that has them, micro-batch 0,
    rendezvous wait excluded; sim/results/breakdown.ep_layer_ms) and the seconds each of those op types
    holds on the step's critical path."""

    layer_ms: Mapping[str, float]  # fwd.dispatch, fwd.combine, bwd.dispatch, bwd.combine
    critical_path_s: Mapping[str, float]

    def to_json(self) -> JsonDict:
        return {"layer_ms": dict(self.layer_ms), "critical_path_s": dict(self.critical_path_s)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpComm:
        return cls(dict(data.get("layer_ms", {})), dict(data.get("critical_path_s", {})))


@dataclass(frozen=True)
class TopOpType:
    """One critical_path_top row as a results file holds it: an op type, its category, the seconds it holds
    on the critical path and its count. Kept when a result is read back from a file without the op-by-op
    path (a results.json written without --full-critical-path, a sweep record), so writing it again gives
    the same rows."""

    op_type: str
    category: str
    total_s: float
    count: int

    def to_json(self) -> JsonDict:
        return {"op_type": self.op_type, "category": self.category, "total_s": self.total_s, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopOpType:
        return cls(data["op_type"], data["category"], data["total_s"], data["count"])
