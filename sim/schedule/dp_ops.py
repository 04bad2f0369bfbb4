"""The end of a step: SP gradient all-reduce, DP gradient buckets, optimizer step, parameter all-gather.

Gradients (Megatron DDP): fp32 main grads (bf16 training forces fp32 gradient accumulation and reduction,
Megatron-LM arguments.py), 4 bytes per parameter, grouped in buckets (`bucket_bytes`: parallel.dp_bucket_mib
MiB, else Megatron-Core's max(40M, 1M x dp) parameters) in the order backward produces them (a parameter
is never split; a bucket closes once it reaches the size). Only the last micro-batch's backward triggers
reductions (earlier ones accumulate locally).

- dp_overlap: a bucket is reduced as soon as its last gradient of the LAST micro-batch is produced;
  otherwise every bucket waits for the end of backward. Stream "dp_comm", group "dp".
- distributed_optimizer: reduce-scatter per bucket, the optimizer updates this rank's 1/dp shard, then
  an all-gather of the updated bf16 parameters per bucket (2 bytes per parameter). With dp_overlap that
  gather overlaps the next step's forward (Megatron's --overlap-param-gather), so the steady-state step
  starts with it (sim/schedule/param_gather.py); without it (parallel.overlap_param_gather false, which
  defaults to dp_overlap) the gather trails the optimizer here, exposed.
  Otherwise: all-reduce per bucket, every rank updates all its parameters.
- dist_opt_instances I > 1 (Megatron's --num-distributed-optimizer-instances, param_and_grad_buffer.py
  L699-760 @d98e8a64): each bucket is reduce-scattered inside its instance ("dp_in" / "edp_in": dp / I
  ranks, sim/core/mesh.py), then its shard (bucket / (dp / I)) is all-reduced across the I instances
  ("dp_out"), both on the one communication stream in that order; the optimizer updates a 1/(dp / I)
  shard and the parameter all-gather runs inside the instance.

GQA with kv_heads < tp: each KV head (its K and V weights, and biases) is replicated on tp/kv_heads ranks,
each of which back-propagates only its own query heads' share; the replicas' gradients are summed once
per step in one coalesced "opt.kv_grad" all-reduce over that KV group (group "kv"), like "opt.ln_grad".

SP: replicated parameters updated from sequence shards (norms, row-parallel biases) hold partial
gradients on each TP rank; Megatron sums them over tp once per step, after the last micro-batch, in one
coalesced all-reduce (finalize_model_grads / _allreduce_layernorm_grads). Modeled as one "opt.ln_grad"
all-reduce of (all such params) x 4 bytes, issued when backward ends; the optimizer waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.sim.core.units import BF16_BYTES, FP32_BYTES
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.ops import Collective, Op, Work, stream_of
from meshsim.sim.schedule.optimizer_states import StepPlan

GRAD_BYTES = FP32_BYTES  # fp32 main gradient per parameter
PARAM_BYTES = BF16_BYTES  # bf16 parameter (all-gathered after a distributed-optimizer step)
MIB = 1024 * 1024
# Megatron-Core's default DDP bucket (distributed_data_parallel_config.bucket_size unset): max(40M, 1M x dp)
# parameters, "larger DP sizes need larger buckets so that collectives do not become latency-bound"
BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_DP_RANK = 1_000_000
DENSE_GROUPS = ("dp", "dp_in")  # a dense bucket's group: the DP group, or its piece with instances


def bucket_bytes(bucket_mib: float | None, dp: int) -> int:
    """Gradient bytes per DP bucket: parallel.dp_bucket_mib MiB, else Megatron-Core's default of
    max(40M, 1M x dp) parameters of fp32 gradients (GRAD_BYTES each)."""
    if bucket_mib is not None:
        return int(bucket_mib * MIB)
    return max(BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * dp) * GRAD_BYTES


@dataclass(frozen=True)
class DpConfig:
    dp: int
    distributed_optimizer: bool
    overlap: bool
    bucket_bytes: int
    sp_grad_params: int  # params whose grads need the SP all-reduce over tp (without SP: model.qk_norm's only)
    params: int  # parameters this rank holds (all TP shards' share, before DP sharding)
    kv_grad_params: int = 0  # replicated K/V params (kv_heads < tp) whose grads sum over the KV group
    grad_bytes: int = GRAD_BYTES  # bytes per parameter the DP reduction moves (sim/schedule/run_settings.py)
    embed_grad_params: int = 0  # pp > 1, tied embeddings: the word-embedding grad summed over first/last stage
    gather_overlap: bool | None = None  # param all-gather overlaps the next forward (param_gather.py); None: overlap
    edp: int = 1  # expert data parallel: the routed experts' gradients reduce (and shard) over edp
    expert_params: int = 0  # routed-expert parameters this rank holds (not in `params`)
    # bytes per parameter of the distributed optimizer's all-gather: 2 (bf16), less with run.fp8_param_gather
    # (the FP8 linear weights move 1 byte: sim/schedule/fp8_rules.py; the step's average, applied per bucket)
    param_bytes: float = PARAM_BYTES
    step: StepPlan = StepPlan()  # the optimizer step's bytes and host offload (sim/schedule/optimizer_states.py)
    pre_step: tuple[Work, ...] = ()  # Muon's momentum gathers and Newton-Schulz GEMMs (sim/schedule/muon.py)
    instances: int = 1  # distributed-optimizer instances: the dp and edp shards are dp / I and edp / I

    def shards(self) -> tuple[int, int]:
        """Ranks the dense and the expert optimizer states are sharded over: dp / I and edp / I with the
        distributed optimizer, 1 (replicated) without."""
        if not self.distributed_optimizer:
            return 1, 1
        return self.dp // self.instances, self.edp // self.instances


@dataclass(frozen=True)
class Bucket:
    producers: tuple[int, ...]  # op ids producing the bucket's gradients (last micro-batch)
    params: int
    group: str = "dp"  # "dp", or "edp" for the routed experts' buffer; "dp_in" / "edp_in" with instances


def make_buckets(producers: list[tuple[int, int]], bucket_bytes: int, group: str = "dp") -> list[Bucket]:
    """Group (op id, params) gradient producers, in backward order, into buckets of >= bucket_bytes."""
    buckets, ids, params = [], [], 0
    for op_id, n in producers:
        if n <= 0:
            continue
        ids.append(op_id)
        params += n
        if params * GRAD_BYTES >= bucket_bytes:
            buckets.append(Bucket(tuple(dict.fromkeys(ids)), params, group))
            ids, params = [], 0
    if params:
        buckets.append(Bucket(tuple(dict.fromkeys(ids)), params, group))
    return buckets


def all_buckets(producers: list[tuple[int, int]], expert_producers: list[tuple[int, int]], bucket_bytes: int,
                dp: int, edp: int, instances: int = 1) -> list[Bucket]:
    """The dense buckets (over dp) and the routed experts' (over edp, Megatron-Core DDP's separate expert
    buffers), each only when its group has more than one rank, in the order backward completes them (the
    dp_comm stream issues them in that order); with distributed-optimizer instances their groups are the
    instances' pieces, "dp_in" / "edp_in"."""
    dense, expert = ("dp_in", "edp_in") if instances > 1 else ("dp", "edp")
    buckets = make_buckets(producers, bucket_bytes, dense) if dp > 1 else []
    if edp > 1 and expert_producers:
        buckets += make_buckets(expert_producers, bucket_bytes, expert)
        buckets.sort(key=lambda b: max(b.producers))
    return buckets


def param_gather(bucket: Bucket, param_bytes: float = PARAM_BYTES) -> Collective:
    """The distributed optimizer's all-gather of one bucket's updated parameters over its group: bf16, 2 bytes
    per parameter; with FP8 primary weights (run.fp8_param_gather) the step's average `param_bytes`."""
    return Collective("all_gather", bucket.group, round(bucket.params * param_bytes), K.DP_PARAM)


class _Emitter:
    """Appends ops with consecutive ids starting at `start`."""

    def __init__(self, start: int):
        self.ops: list[Op] = []
        self.next_id = start

    def add(self, name: str, phase: str, work: Work, deps: tuple[int, ...]) -> int:
        stream = stream_of(work)
        op = Op(self.next_id, name, stream, stream, phase, work, tuple(sorted(set(deps))))
        self.ops.append(op)
        self.next_id += 1
        return op.id


def step_end_ops(start: int, producers: list[tuple[int, int]], end_of_bwd: int, cfg: DpConfig,
                 buckets: list[Bucket] | None = None, expert_producers: list[tuple[int, int]] = ()) -> list[Op]:
    """Ops after the last micro-batch's backward: SP grad all-reduce, DP buckets, optimizer, param gather.

    `producers`: (op id, params) of the last micro-batch's gradient-producing ops, in backward order;
    `end_of_bwd`: the last backward op; `buckets`: given ones instead of make_buckets(producers) (a
    pipeline stage with model chunks buckets each chunk apart). With cfg.embed_grad_params, the
    tied-embedding gradient all-reduce over the "embed" group follows the gradient sync (Megatron's
    finalize_model_grads order) and the optimizer waits for it."""
    em = _Emitter(start)
    before_opt: list[int] = [end_of_bwd]
    if cfg.sp_grad_params:
        ln = Collective("all_reduce", "tp", cfg.sp_grad_params * GRAD_BYTES, K.LN_GRAD)
        before_opt.append(em.add("opt.ln_grad", "bwd", ln, (end_of_bwd,)))
    if cfg.kv_grad_params:
        kv = Collective("all_reduce", "kv", cfg.kv_grad_params * GRAD_BYTES, K.KV_GRAD)
        before_opt.append(em.add("opt.kv_grad", "bwd", kv, (end_of_bwd,)))
    if buckets is None:
        buckets = all_buckets(producers, list(expert_producers), cfg.bucket_bytes, cfg.dp, cfg.edp, cfg.instances)
    elif cfg.dp == 1:
        buckets = [b for b in buckets if b.group not in DENSE_GROUPS]
    reduce_op = "reduce_scatter" if cfg.distributed_optimizer else "all_reduce"
    shard, eshard = cfg.shards()
    for i, b in enumerate(buckets):
        deps = b.producers if cfg.overlap else (end_of_bwd,)
        key = K.DP_GRAD if b.group in DENSE_GROUPS else K.EXPERT_GRAD
        work = Collective(reduce_op, b.group, b.params * cfg.grad_bytes, key)
        before_opt.append(em.add(f"dp.bucket{i}.{reduce_op}", "bwd", work, deps))
        if cfg.instances > 1:  # the shard, summed across the instances
            part = -(-b.params // (shard if b.group in DENSE_GROUPS else eshard))
            across = Collective("all_reduce", "dp_out", part * cfg.grad_bytes, key + K.ACROSS_INSTANCES)
            before_opt.append(em.add(f"dp.bucket{i}.all_reduce{K.ACROSS_INSTANCES}", "bwd", across,
                                     (before_opt[-1],)))
    if cfg.embed_grad_params:
        embed = Collective("all_reduce", "embed", cfg.embed_grad_params * GRAD_BYTES, K.EMBED_GRAD)
        before_opt.append(em.add(f"{K.OPT_BLOCK}.{K.EMBED_GRAD}", "bwd", embed, tuple(before_opt)))
    owned = -(-cfg.params // shard) + -(-cfg.expert_params // eshard)
    ready = tuple(before_opt)
    for i, work in enumerate(cfg.pre_step):  # Muon: gathers, then Newton-Schulz, once the gradients are reduced
        key = f"{K.MUON_GATHER}_{work.group}" if isinstance(work, Collective) else f"{K.MUON_NS}{i}"
        ready = (em.add(f"{K.OPT_BLOCK}.{key}", "opt", work, ready),)
    step = em.add("opt.step", "opt", cfg.step.work(owned), ready)
    gather_overlap = cfg.overlap if cfg.gather_overlap is None else cfg.gather_overlap
    if cfg.distributed_optimizer and not gather_overlap:  # overlapped: sim/schedule/param_gather.py, next fwd
        for i, b in enumerate(buckets):
            em.add(f"dp.bucket{i}.all_gather", "opt", param_gather(b, cfg.param_bytes), (step,))
    return em.ops
