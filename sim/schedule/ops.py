"""A schedule is data: the ordered ops one rank runs in a training step, with their dependencies.

The simulator (sim/engine/events.py) and the real executor (validate/) both consume this structure.
Every rank of a symmetric TP/DP mesh runs the same schedule; collectives name their group symbolically
("tp", "dp", or "kv": the tp/kv_heads ranks of a TP group that replicate one KV head when kv_heads < tp)
and are resolved to ranks by the caller.

Stream order is list order: ops on one stream run FIFO in the order they appear in `Schedule.ops`,
each starting once its stream is free and all its `deps` have finished.

Shapes use Megatron's activation layout [s, b, h]. Units: bytes, FLOPs (not rates).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Literal, Protocol

import numpy as np

from meshsim.sim.schedule.work_table import WorkTable

FUSED_WGRAD_OUT_BYTES = 4 + 4  # fp32 main grad read + written per element of dW (gradient-accumulation fusion)

Stream = Literal["compute", "tp_comm", "dp_comm", "pp_comm", "ep_comm", "cp_comm"]
# every rank has the first three; pp_comm (pipeline P2P batches, not FIFO) only when pp > 1; ep_comm (the MoE
# token dispatch / combine and the expert-tensor-parallel collectives) only with MoE layers; cp_comm (context
# parallelism's KV ring, all-to-alls and KV all-gathers: TE's cp_stream) only with cp > 1
STREAMS: tuple[Stream, ...] = ("compute", "tp_comm", "dp_comm", "pp_comm", "ep_comm", "cp_comm")
FIFO_STREAMS: tuple[Stream, ...] = ("compute", "tp_comm", "dp_comm", "ep_comm", "cp_comm")  # run in list order
EP_GROUPS = ("ep", "etp", "etp_ep")  # expert-mesh groups whose collectives run on ep_comm
CP_GROUPS = ("cp", "cp_a2a", "cp_p2p")  # context-parallel groups whose collectives run on cp_comm
Phase = Literal["fwd", "bwd", "recompute", "opt"]


@dataclass(frozen=True)
class Gemm:
    """C[m, n] = A[m, k] @ B[k, n], `batch` independent copies. FLOPs = 2 m n k batch.

    out_bytes: bytes per element of C the epilogue moves: 2 (writes a 16-bit C); FUSED_WGRAD_OUT_BYTES
    = 8 for a weight-gradient GEMM that accumulates into the fp32 main grad (reads and writes 4-byte C:
    Megatron's gradient-accumulation fusion, C = C + X^T dY with beta = 1).
    fp8: A and B are FP8 (1 byte per element), run at the GPU's FP8 peak (sim/schedule/fp8_rules.py).
    comm_sms: the GEMM runs on sm_count - comm_sms SMs (tp_comm_overlap's pipeline and bulk GEMMs,
    sim/schedule/shapes.UB_COMM_SMS)."""

    m: int
    n: int
    k: int
    batch: int = 1
    out_bytes: int = 2
    fp8: bool = False
    comm_sms: int = 0  # SMs a concurrent userbuffers kernel holds: the GEMM runs on the others (TE's sm margin)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class Attention:
    """Flash-attention core for `heads` query heads on this rank (GQA: `kv_heads` KV heads).

    Forward FLOPs = 4 b s_q s_kv heads head_dim (QK^T and PV), halved under a causal mask;
    backward = 2.5x forward (recomputes the scores, then four GEMM-like products).
    """

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool = True
    backward: bool = False
    deterministic: bool = False  # run.deterministic: no atomic dQ accumulation (sim/schedule/run_settings.py)
    window: int | None = None  # sliding-window attention: each query sees the last `window` keys (causal)
    v_head_dim: int | None = None  # V's head width when it differs from Q/K's (MLA: 128 vs 192)
    fp8: bool = False  # run.fp8_attention: FP8 dot-product attention at the FP8 peak
    # keys when they differ from the `seq` queries (context parallelism's ring steps and all-gathered KV);
    # causal then means the queries are the last `seq` of the `kv_seq` positions (a bottom-right mask)
    kv_seq: int | None = None
    dropout: bool = False  # attention dropout (model.dropout): picks TE's deterministic backend (fa2_deterministic.py)

    @property
    def keys(self) -> int:
        """Key positions each query row sees before masking: kv_seq when set, else seq."""
        return self.kv_seq if self.kv_seq is not None else self.seq

    @property
    def score_pairs(self) -> float:
        """Query-key pairs with kv_seq set: seq kv_seq, less seq^2 / 2 under the causal mask (the
        continuous count the s^2 / 2 of the square case uses)."""
        return self.seq * self.keys - (self.seq * self.seq / 2.0 if self.causal else 0.0)

    @property
    def flops(self) -> float:
        """QK^T at head_dim and PV at v_head_dim: 2 b pairs heads (head_dim + v_head_dim) forward."""
        width = 2.0 * (self.head_dim + (self.v_head_dim or self.head_dim))
        if self.kv_seq is not None:
            return width * self.batch * self.score_pairs * self.heads * (2.5 if self.backward else 1.0)
        if self.window is not None and self.window < self.seq:
            # causal window w: query i sees min(i + 1, w) keys, sum = s w - w (w - 1) / 2 score pairs
            pairs = self.seq * self.window - self.window * (self.window - 1) / 2.0
            return width * self.batch * pairs * self.heads * (2.5 if self.backward else 1.0)
        fwd = 4.0 * self.batch * self.seq * self.seq * self.heads * self.head_dim
        if self.v_head_dim is not None:
            fwd = width * self.batch * self.seq * self.seq * self.heads
        if self.causal:
            fwd /= 2.0
        return fwd * (2.5 if self.backward else 1.0)


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound kernel (layernorm, gelu, swiglu, dropout, residual add, softmax, cross-entropy...)."""

    kernel: str
    bytes_read: int
    bytes_written: int
    flops: float = 0.0


@dataclass(frozen=True)
class Collective:
    """A collective on a symbolic group. `nbytes` follows nccl-tests: for all-gather / reduce-scatter it
    is the total (gathered) size; for all-reduce the buffer size.

    `boundary` names the duality-table operator that issued it (f, g, sp_gather, sp_scatter), or a
    purpose such as "ln_grad", "dp_grad", "dp_param", "xent_max", "xent_sum".
    """

    op: Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"]
    group: Literal["tp", "dp", "kv", "embed", "ep", "etp", "etp_ep", "edp", "stage", "cp", "cp_a2a", "cp_p2p",
                   "dp_in", "edp_in", "dp_out"]
    nbytes: int
    boundary: str = ""
    # who moves the bytes: "nccl", a fused expert-parallel kernel of the flex dispatcher ("deepep",
    # "hybridep": sim/cost/collectives/flex.py prices it, with the SMs it occupies), or "userbuffers" (one
    # chunk of tp_comm_overlap's pipelined reduce-scatter: sim/schedule/shapes.USERBUFFERS)
    kernel: str = "nccl"


@dataclass(frozen=True)
class P2PTransfer:
    """One pipeline send or receive: the [s/(t if SP), b, h] tensor of (direction, micro_batch) leaving
    virtual stage `sender_vstage`; `peer_stage` is the pipeline stage at the other end (sim/schedule/pipeline.py)."""

    send: bool
    direction: Literal["fwd", "bwd"]
    micro_batch: int
    sender_vstage: int
    peer_stage: int
    nbytes: int


@dataclass(frozen=True)
class P2P:
    """A batch of pipeline sends/receives issued together (one batch_isend_irecv); it ends when all end.
    Runs on the "pp_comm" stream, which is not FIFO: each batch starts once its deps are done."""

    transfers: tuple[P2PTransfer, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


@dataclass(frozen=True)
class OptimizerStep:
    """Mixed-precision Adam over `params` parameters owned by this rank: memory-bound."""

    params: int
    bytes_per_param: int = 32  # read+write: fp32 master, two moments, fp32 grad, bf16 weight
    # optimizer.cpu_offload: parameters the host updates after the GPU share, and the achieved bytes/s of
    # their PCIe copies and of the CPU Adam's DRAM traffic (sim/schedule/optimizer_states.py)
    host_params: int = 0
    pcie_bytes_s: float = 0.0
    host_bytes_s: float = 0.0
    host_overlap: bool = False  # --overlap-cpu-optimizer-d2h-h2d

    @property
    def flops(self) -> float:
        return 12.0 * self.params


def comm_stream(group: str) -> Stream:
    """The stream (and category) of a collective on `group`: DP traffic (the expert gradients' too, those of
    distributed-optimizer instances, and the
    tied-embedding gradient all-reduce between the first and last pipeline stage, and FP8 delayed scaling's
    amax all-reduce over the whole stage) on dp_comm, the MoE dispatch / combine and expert-TP collectives on
    ep_comm, context parallelism's on cp_comm, TP and KV on tp_comm."""
    if group in ("dp", "embed", "edp", "stage", "dp_in", "edp_in", "dp_out"):
        return "dp_comm"
    if group in CP_GROUPS:
        return "cp_comm"
    return "ep_comm" if group in EP_GROUPS else "tp_comm"


def stream_of(work: object) -> Stream:
    """The stream an op of this work runs on: collectives on their group's comm stream, pipeline P2P
    batches on pp_comm, the rest compute."""
    if isinstance(work, P2P):
        return "pp_comm"
    return comm_stream(work.group) if isinstance(work, Collective) else "compute"


Work = Gemm | Attention | Elementwise | Collective | P2P | OptimizerStep


OP_FIELDS = ("id", "name", "stream", "category", "phase", "work", "deps", "layer", "micro_batch", "host_calls",
             "host_wait")


@dataclass(frozen=True)
class _OpSpec:
    """Op's fields, typed and documented (Op takes its dataclass fields from here, so `dataclasses.fields`,
    `dataclasses.replace` and `dataclasses.asdict` work on an Op as on any frozen dataclass)."""

    id: int
    name: str  # e.g. "L3.mb0.fwd.qkv"
    stream: Stream
    category: Stream  # the op's result category is its stream
    phase: Phase
    work: Work
    deps: tuple[int, ...] = ()
    layer: int | None = None  # transformer layer index; None for embedding / head / optimizer
    micro_batch: int | None = None
    # the host's side (sim/cost/host_dispatch.py): the PyTorch calls it makes to issue this op (2: the
    # kernel and one small call around it, what HOST_DISPATCH_US stands for), and an earlier op it must
    # see finished before it issues this one (a device-to-host sync: .item(), .tolist(), an event wait)
    host_calls: int = 2
    host_wait: int | None = None


class Op(namedtuple("_OpRecord", OP_FIELDS, defaults=((), None, None, 2, None))):
    """One op of a schedule: an immutable record of _OpSpec's fields, stored as a tuple (no __dict__: ~128
    bytes an op), so a template stamps a block of them with C-level passes (`new_op`, sim/schedule/stamping.py).

    It behaves as the frozen dataclass it replaces: keyword or positional construction with the same
    defaults, read-only fields, `dataclasses.replace` / `fields` / `asdict`, equality and hash over the
    fields in order, pickling. Being a tuple it also compares equal to a plain tuple of the same values."""

    __slots__ = ()
    __dataclass_fields__ = _OpSpec.__dataclass_fields__
    __dataclass_params__ = _OpSpec.__dataclass_params__

    @property
    def flops(self) -> float:
        return getattr(self.work, "flops", 0.0) if not isinstance(self.work, Collective | P2P) else 0.0


new_op = partial(tuple.__new__, Op)  # Op from an iterable of its 11 field values, no Python frame: stamping's path


def kind_of(work: object) -> int:
    """ScheduleArrays.kind of an op of this work: 0 compute, 1 collective, 2 P2P batch."""
    return 1 if isinstance(work, Collective) else 2 if isinstance(work, P2P) else 0


@dataclass(frozen=True, eq=False)
class ScheduleArrays:
    """A schedule as arrays (np.intc), ops by position: `kind` (kind_of), `stream` (index in STREAMS), deps in
    CSR form (op i's are dep_idx[dep_ptr[i]:dep_ptr[i + 1]], as positions, in its deps order), `host_calls`,
    `host_wait` (a position, -1: none). Equal when every array is."""

    kind: np.ndarray
    stream: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray
    host_calls: np.ndarray
    host_wait: np.ndarray

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScheduleArrays) and all(
            a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(astuple_arrays(self), astuple_arrays(other), strict=True))

    __hash__ = None


def astuple_arrays(a: ScheduleArrays) -> tuple[np.ndarray, ...]:
    return a.kind, a.stream, a.dep_ptr, a.dep_idx, a.host_calls, a.host_wait


def arrays_from_ops(ops: Sequence[Op]) -> ScheduleArrays:
    """The long way: ScheduleArrays read off the Op records one by one (the reference the tiled arrays of
    sim/schedule/tiling.py are proven equal to)."""
    position = {op.id: i for i, op in enumerate(ops)}
    deps = [[position[d] for d in op.deps] for op in ops]
    ptr = np.zeros(len(ops) + 1, dtype=np.intc)
    np.cumsum([len(d) for d in deps], out=ptr[1:])
    col = partial(np.array, dtype=np.intc)
    return ScheduleArrays(col([kind_of(op.work) for op in ops]), col([STREAMS.index(op.stream) for op in ops]), ptr,
                          col([p for d in deps for p in d]), col([op.host_calls for op in ops]),
                          col([-1 if op.host_wait is None else position[op.host_wait] for op in ops]))


class Tiling(Protocol):
    """How a builder made its ops (sim/schedule/tiling.py): it computes their arrays without reading each op."""

    def arrays(self, ops: tuple[Op, ...]) -> ScheduleArrays: ...

    def tiled(self, ops: tuple[Op, ...]) -> ScheduleArrays | None: ...

    def work_table(self, ops: tuple[Op, ...]) -> WorkTable | None: ...

    def fields(self, ops: tuple[Op, ...]) -> object | None: ...


@dataclass(frozen=True)
class Schedule:
    ops: tuple[Op, ...]
    tp: int
    dp: int
    micro_batches: int  # per DP rank per step (gradient accumulation steps)
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    kv_replicas: int = 1  # ranks of a TP group sharing one KV head (tp / kv_heads when kv_heads < tp)
    pp: int = 1  # pipeline stages (every stage has its own Schedule; sim/schedule/pipeline_builder.py)
    stage: int = 0  # the stage this schedule runs on
    ep: int = 1  # expert parallel: the expert mesh etp x ep x edp of a stage (sim/core/mesh.py) names
    etp: int = 1  # its groups "ep", "etp", "etp_ep" and "edp"
    cp: int = 1  # context parallel: a stage holds tp x cp x dp ranks (groups "cp", "cp_a2a", "cp_p2p")
    # the builder's record of the templates it stamped (sim/schedule/tiling.py); None: arrays from the ops
    tiling: Tiling | None = field(default=None, compare=False, repr=False)

    @cached_property
    def arrays(self) -> ScheduleArrays:
        """The ops as arrays, built once: tiled from the stamped templates, or read off the ops."""
        tiled = self.tiled_arrays
        return tiled if tiled is not None else arrays_from_ops(self.ops)

    @cached_property
    def work_table(self) -> WorkTable:
        """The ops' distinct works and each op's index among them (WorkTable), built once: from the
        builder's stamps where its record covers the ops, else read off the ops."""
        tiled = self.tiling.work_table(self.ops) if self.tiling is not None else None
        return tiled if tiled is not None else WorkTable.of(self.ops)

    @cached_property
    def tiled_arrays(self) -> ScheduleArrays | None:
        """`arrays` when the builder's record tiles them (a few numpy passes, op ids = list positions), else
        None: callers then read the ops one by one (the long way, which tests compare these against)."""
        return self.tiling.tiled(self.ops) if self.tiling is not None else None

    @cached_property
    def fields(self):
        """The ops' phase, layer and micro-batch as columns (sim/schedule/tiling.OpFields) when the builder's
        record covers the ops and holds their values exactly, else None (callers read the ops)."""
        return self.tiling.fields(self.ops) if self.tiling is not None else None

    def __getstate__(self) -> dict:
        """Pickled without the tiling record and the arrays (rebuilt from the ops on demand)."""
        state = dict(self.__dict__)
        state.pop("arrays", None)
        state.pop("tiled_arrays", None)
        state.pop("work_table", None)
        state.pop("fields", None)
        state["tiling"] = None
        return state

    def by_stream(self, stream: Stream) -> list[Op]:
        return [op for op in self.ops if op.stream == stream]
