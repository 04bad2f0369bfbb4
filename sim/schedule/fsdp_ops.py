"""Fully sharded data parallelism (parallel.fsdp): Megatron-FSDP's ZeRO-3 schedule on one rank.

Each rank keeps 1/dp of every weight, gradient and optimizer state (the routed experts' 1/edp). A block runs
on whole weights, so (Megatron-LM @d98e8a64, megatron/core/distributed/fsdp/src/docs/runtime_schedule.md and
docs/user-guide/features/megatron_fsdp.md, "optim_grads_params"):

- units: the embedding, each transformer layer, and the head (final norm, output layer and MTP depths; with
  tied embeddings the head gathers the shared table too, its gradient reduced with the embedding's);
  a unit's weights are all-gathered over "dp" (bf16, 2 B per parameter; with run.fp8_param_gather the
  step's average of 1 B per FP8 linear weight) and its routed experts' over "edp", before its forward and
  again before its backward (they are freed after the forward; the head's forward and backward follow
  each other, so it is gathered once per micro-batch), in every micro-batch;
- double buffering: two unit buffers, so the gather of the (k+1)-th unit in run order is issued before
  the k-th unit runs (prefetch) and waits until the (k-1)-th unit is done with its buffer;
- after a unit's backward its gradients are reduce-scattered over "dp" (the experts' over "edp") and
  accumulated into the sharded main gradients, in every micro-batch (not only the last, unlike DDP);
- gathers and reduce-scatters share one communicator, so they run in issue order on the dp_comm stream
  (the gather for unit k+1 is issued before unit k's reduce-scatter, as the runtime-schedule note says);
- FP8 without FP8 primary weights: the gathered 16-bit weights are cast before each forward (no FP8 copy
  outlives a micro-batch), in place of the distributed optimizer's once-per-step cast;
- hybrid sharding (parallel.dist_opt_instances I > 1, Megatron-FSDP's HSDP: --num-distributed-optimizer-
  instances with the default --outer-dp-sharding-strategy no_shard; megatron_fsdp.py L757-787 and
  param_and_grad_buffer.py L4134-4225 @d98e8a64): weights, gradients and states shard inside an instance
  ("dp_in" / "edp_in"), the gathers and reduce-scatters run there, and in the last micro-batch each
  reduce-scatter's shard is then all-reduced across the instances ("dp_out"). Megatron issues that
  all-reduce on a stream of its own; meshsim puts it on the dp_comm stream after the reduce-scatter, so it
  can hold back the next gather (an upper bound on its exposure).

The step then ends with the optimizer on the owned shard; the next step's first forward gathers again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.ops import Collective, Elementwise, Op, stream_of
from meshsim.sim.schedule.stamping import Block, micro_batch_blocks, stamp


@dataclass(frozen=True)
class FsdpConfig:
    dp: int  # ranks the dense weights are sharded over (dp x cp)
    edp: int  # ranks the routed experts are sharded over
    param_bytes: float  # bytes per parameter a gather moves (2, less with run.fp8_param_gather)
    grad_bytes: int  # bytes per parameter a reduce-scatter moves (sim/schedule/run_settings.grad_reduce_bytes)
    weight_cast: Callable[[int], Elementwise | None] | None = None  # layer -> its per-forward FP8 weight cast
    shared_head_params: int = 0  # tied embeddings: the table the head gathers too (its gradient: the embedding's)
    instances: int = 1  # hybrid sharding: shard inside dp / I (edp / I) ranks, all-reduce across the I instances

    def groups(self) -> tuple[tuple[str, int, str], tuple[str, int, str]]:
        """(group, ranks, op-name suffix) of the dense and the expert shards: over dp and edp, or with
        instances over their pieces dp_in (dp / I ranks) and edp_in (edp / I)."""
        if self.instances == 1:
            return ("dp", self.dp, ""), ("edp", self.edp, K.EXPERT_SUFFIX)
        return (("dp_in", self.dp // self.instances, ""),
                ("edp_in", self.edp // self.instances, K.EXPERT_SUFFIX))


@dataclass
class _Use:
    """A run of blocks that share one gathered unit: (dense, expert) parameters gathered for its first block."""

    params: tuple[int, int]
    blocks: list[Block]
    mb: int


def block_params(t, b: Block, shared_head: int = 0) -> tuple[int, int] | None:
    """(dense, expert) parameters the block's unit gathers, None when it runs on the unit already gathered
    (the head's backward) or has no weights (delayed FP8 scaling's amax block). Counted from the backward
    templates' gradient producers, so what is gathered is what is reduce-scattered; with tied embeddings
    the head gathers the shared table too (`shared_head`), whose gradient the embedding's block reduces."""
    if b.layer is not None:
        bwd = t.layer_bwd(b.layer)
    elif b.tpl is t.embed_fwd or b.tpl is t.embed_bwd:
        bwd = t.embed_bwd
    elif b.tpl is t.head_fwd:
        return sum(n for _, n in t.head_bwd.grads) + shared_head, sum(n for _, n in t.head_bwd.expert_grads)
    else:
        return None
    return sum(n for _, n in bwd.grads), sum(n for _, n in bwd.expert_grads)


def _uses(t, layers: int, micro_batches: int, shared_head: int) -> list[_Use]:
    uses: list[_Use] = []
    for mb in range(micro_batches):
        for b in micro_batch_blocks(t, layers, mb):
            params = block_params(t, b, shared_head)
            if params is None and uses:
                uses[-1].blocks.append(b)
            else:
                uses.append(_Use(params or (0, 0), [b], mb))
    return uses


def _emit(ops: list[Op], name: str, phase: str, work, deps: tuple[int, ...], layer: int | None, mb: int) -> int:
    stream = stream_of(work)
    ops.append(Op(len(ops), name, stream, stream, phase, work, tuple(sorted(set(deps))), layer, mb))
    return len(ops) - 1


def _gather(ops: list[Op], use: _Use, deps: tuple[int, ...], cfg: FsdpConfig) -> tuple[int, ...]:
    """The all-gathers of `use`'s unit (dense over dp, experts over edp); their op ids."""
    b, (dense, expert) = use.blocks[0], use.params
    phase, ids = "bwd" if b.backward else "fwd", []
    for (group, size, suffix), n in zip(cfg.groups(), (dense, expert), strict=True):
        if size > 1 and n > 0:
            work = Collective("all_gather", group, round(n * cfg.param_bytes), K.FSDP_GATHER)
            ids.append(_emit(ops, f"{b.prefix}{phase}.{K.FSDP_GATHER}{suffix}", phase, work, deps, b.layer, use.mb))
    return tuple(ids)


def _reduce(ops: list[Op], b: Block, base: int, mb: int, cfg: FsdpConfig, last: bool) -> None:
    """The reduce-scatters of a backward block's gradients (dense over dp, experts over edp; with instances
    inside one, and in the `last` micro-batch their shards all-reduced across the instances)."""
    for (group, size, suffix), producers in zip(cfg.groups(), (b.tpl.grads, b.tpl.expert_grads), strict=True):
        n = sum(p for _, p in producers)
        deps = tuple(base + i for i, _ in producers)
        if size > 1 and n > 0:
            work = Collective("reduce_scatter", group, n * cfg.grad_bytes, K.FSDP_GRAD)
            deps = (_emit(ops, f"{b.prefix}bwd.{K.FSDP_GRAD}{suffix}", "bwd", work, deps, b.layer, mb),)
        if cfg.instances > 1 and last and n > 0:
            work = Collective("all_reduce", "dp_out", -(-n // size) * cfg.grad_bytes, K.FSDP_GRAD + K.ACROSS_INSTANCES)
            _emit(ops, f"{b.prefix}bwd.{K.FSDP_GRAD}{K.ACROSS_INSTANCES}{suffix}", "bwd", work, deps, b.layer, mb)


def fsdp_micro_batches(ops: list[Op], t, layers: int, micro_batches: int, cfg: FsdpConfig,
                       grads: list[tuple[int, int]], expert_grads: list[tuple[int, int]]) -> None:
    """Stamp every micro-batch with its unit gathers and gradient reduce-scatters (module docstring); record
    the last micro-batch's gradient producers into `grads` / `expert_grads` (the optimizer's parameters)."""
    uses = _uses(t, layers, micro_batches, cfg.shared_head_params)
    gathers = [_gather(ops, uses[0], (), cfg)]
    released: list[tuple[int, ...]] = []  # per use: the ops after which its buffer is free
    x = 0
    for k, use in enumerate(uses):
        if k + 1 < len(uses):  # prefetch the next unit into the buffer use k-1 frees
            gathers.append(_gather(ops, uses[k + 1], released[k - 1] if k else (), cfg))
        ends: list[int] = []
        for b in use.blocks:
            if cfg.weight_cast is not None and b.layer is not None and not b.backward:
                cast = cfg.weight_cast(b.layer)
                if cast is not None:
                    _emit(ops, f"{b.prefix}fwd.{K.FP8_WEIGHT_CAST}", "fwd", cast, gathers[k], b.layer, use.mb)
            base = stamp(b.tpl, ops, b.prefix, {b.ext_key: x} if b.ext_key else {}, b.layer, use.mb, gathers[k])
            x = base + b.tpl.marks["out"]
            ends.append(x)
            if b.backward:
                ends += [base + i for i, _ in (*b.tpl.grads, *b.tpl.expert_grads)]
                _reduce(ops, b, base, use.mb, cfg, use.mb == micro_batches - 1)
                if use.mb == micro_batches - 1:
                    grads += [(base + i, n) for i, n in b.tpl.grads]
                    expert_grads += [(base + i, n) for i, n in b.tpl.expert_grads]
        released.append(tuple(ends))
