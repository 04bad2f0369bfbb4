"""One Schedule per pipeline stage: the stage's compute blocks and P2P batches in Megatron's order.

For stage r the order of forward/backward blocks and P2P batches comes from sim/schedule/pipeline.py. A forward
block F(mb, c) stamps chunk c's layers (sim/schedule/pipeline_layout.py) with the same templates as the
non-pipelined builder (sim/schedule/builder.py), preceded by the embedding on the first virtual stage and followed
by the output layer + loss on the last; a backward block runs them in reverse.

Dependencies: a block's input is the P2P batch that receives it (or the embedding / the loss). Plain
1F1B (and interleaved without P2P overlap) is blocking, so every block and every batch also waits for
the step before it on the stage; with overlap a block waits only for the batch holding its receive, and
a batch is posted right after the compute block before it.

The P2P tensor is [s/(t if SP), b, h] in the model dtype. With `parallel.p2p_scatter_gather` (Megatron-LM
2021-2022, --scatter-gather-tensors-in-pipeline, on by default from 72e4230bb5 until Megatron-Core; megatron/
p2p_communication.py `_communicate` @5942af978a: only without SP and when tp divides the tensor) each TP rank
sends 1/t of it (`split_tensor_into_1d_equal_chunks`), and after the batch the receiver all-gathers the t
chunks over its TP group (`gather_split_1d_tensor`, a synchronous all-gather) before the block uses it:
the receiving block depends on that gather, not on the batch. Step end per stage (sim/schedule/dp_ops.py): SP and KV
gradient all-reduces of the stage's layers, DP buckets per model chunk (each made of the chunk's last
micro-batch gradients, so with dp_overlap a chunk's buckets reduce as its last backward produces them),
the tied-embedding all-reduce between the first and last stage (the last stage holds the output
layer's copy of the embedding), the optimizer over the stage's parameters, and the distributed
optimizer's parameter all-gathers (sim/schedule/param_gather.py).
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import (
    Templates,
    build_schedule,
    dp_bucket_bytes,
    fp8_amax_templates,
    gather_param_bytes,
    gathers_overlap,
    layers_dp_params,
    step_templates,
    weight_cast_op,
)
from meshsim.sim.schedule.dp_ops import DpConfig, all_buckets, step_end_ops
from meshsim.sim.schedule.ep_overlap import Chain, Emitter
from meshsim.sim.schedule.mtp_ops import mtp_layer_ids
from meshsim.sim.schedule.muon import newton_schulz_works, owned_muon_params
from meshsim.sim.schedule.ops import P2P, Collective, Op, P2PTransfer, Schedule
from meshsim.sim.schedule.optimizer_states import step_plan
from meshsim.sim.schedule.param_gather import fill_param_gathers, reserved_gathers
from meshsim.sim.schedule.pipeline import Combined, Comm, Compute, PipelineShape, peer, stage_order
from meshsim.sim.schedule.pipeline_combined import combined_compute
from meshsim.sim.schedule.pipeline_layout import ChunkLayout, pipeline_layout
from meshsim.sim.schedule.run_settings import grad_reduce_bytes
from meshsim.sim.schedule.shapes import LayerDims, layer_dims
from meshsim.sim.schedule.stage_ops import StageOps, op_list
from meshsim.sim.schedule.stamping import gc_paused, stamp_chain
from meshsim.sim.schedule.tiling import OpList


def pipeline_shape(rs: ResolvedScenario) -> PipelineShape:
    p = rs.scenario.parallel
    return PipelineShape(rs.pp, rs.vp, rs.micro_batches, p.microbatch_group_size or rs.pp, p.p2p_overlap,
                         p.moe_ep_overlap)


def p2p_bytes(d: LayerDims) -> int:
    """[s/(t if SP), b, h] in the model dtype."""
    return d.tokens_out * d.hidden * d.dtype_bytes


def scatter_gather(rs: ResolvedScenario, d: LayerDims) -> bool:
    """Megatron's P2P scatter-gather applies: asked for, tp > 1, no SP, and tp divides the tensor."""
    return rs.scenario.parallel.p2p_scatter_gather and rs.tp > 1 and not rs.scenario.parallel.sp \
        and p2p_bytes(d) % (rs.tp * d.dtype_bytes) == 0


def _gate(ops: StageOps | OpList, op_id: int, gate: tuple[int, ...]) -> None:
    deps = ops.deps_of(op_id)
    extra = tuple(g for g in gate if g not in deps)
    if extra:
        ops[op_id] = ops[op_id]._replace(deps=deps + extra)  # (dataclasses.replace's record, without its frame)


class _Stage:
    """Mutable state while one stage's ops are stamped."""

    def __init__(self, rs: ResolvedScenario, stage: int, chunks: list[ChunkLayout], t: Templates, reserved: int):
        self.rs, self.stage, self.chunks, self.t = rs, stage, chunks, t
        self.shape = pipeline_shape(rs)
        self.ops = op_list(reserved)  # slots for the parameter all-gathers; holds the stamps (stage_ops.py)
        self.received: dict[tuple[str, int, int], int] = {}  # (direction, mb, chunk) -> P2P op id
        self.loss: dict[tuple[int, int], int] = {}
        self.grads: list[list[tuple[int, int]]] = [[] for _ in chunks]
        self.expert_grads: list[list[tuple[int, int]]] = [[] for _ in chunks]
        self.last_item: tuple[int, ...] = ()  # what the next item waits for when P2P is blocking
        self.last_compute: tuple[int, ...] = ()  # what a posted (overlapped) P2P batch waits for
        # delayed FP8 scaling: one amax reduction per chunk pass (Megatron's region is the chunk's layer stack)
        self.amax = {tuple(ch.layers): fp8_amax_templates(rs, ch.layers) for ch in chunks if ch.layers}
        d = layer_dims(rs)
        self.gather_bytes = p2p_bytes(d) if scatter_gather(rs, d) else 0  # the whole tensor, gathered over tp
        self.nbytes = p2p_bytes(d) // rs.tp if self.gather_bytes else p2p_bytes(d)
        # parallel.moe_ep_overlap: Megatron's schedule plans (sim/schedule/pipeline_combined.py)
        self.emitter = Emitter(self.ops, rs.scenario.parallel.delay_wgrad_compute)
        self.chains: dict[tuple[int, int], Chain] = {}  # (micro-batch, chunk) -> its plan
        self.links: dict[tuple[int, str], tuple] = {}  # (chunk, "F" / "B") -> its blocks (stamp_chain's links)

    def comm(self, step: Comm, before: tuple[int, ...] | None = None) -> None:
        """Post one P2P batch; it waits for `before` (default: the blocking item or the compute before it)."""
        transfers = []
        for tr in step.transfers:
            peer_stage, sender = peer(self.shape, self.stage, tr)
            transfers.append(P2PTransfer(tr.send, tr.direction, tr.micro_batch, sender, peer_stage, self.nbytes))
        first = step.transfers[0]
        kinds = "+".join(f"{'send' if tr.send else 'recv'}_{tr.direction}" for tr in step.transfers)
        name = f"{K.PP_BLOCK}.{kinds}_c{first.chunk}.mb{first.micro_batch}"
        if before is None:
            before = self.last_item if self.shape.blocking else self.last_compute
        op_id = len(self.ops)
        self.ops.append(Op(op_id, name, "pp_comm", "pp_comm", first.direction, P2P(tuple(transfers)), before, None,
                           first.micro_batch))
        self.last_item = (op_id,)
        for tr in step.transfers:
            if not tr.send:
                self.received[(tr.direction, tr.micro_batch, tr.chunk)] = self.gather(tr, op_id)

    def gather(self, tr, batch_id: int) -> int:
        """The receive's input op: the batch itself, or (scatter-gather) the TP all-gather after it."""
        if not self.gather_bytes:
            return batch_id
        op_id = len(self.ops)
        name = f"{K.PP_BLOCK}.{K.PP_GATHER}_{tr.direction}_c{tr.chunk}.mb{tr.micro_batch}"
        work = Collective("all_gather", "tp", self.gather_bytes, K.PP_GATHER)
        self.ops.append(Op(op_id, name, "tp_comm", "tp_comm", tr.direction, work, (batch_id,), None, tr.micro_batch))
        if self.shape.blocking:  # _communicate returns after the gather: the next item waits for it
            self.last_item = (op_id,)
        return op_id

    def compute(self, step: Compute) -> None:
        direction = "fwd" if step.kind == "F" else "bwd"
        received = self.received.get((direction, step.micro_batch, step.chunk))
        gate = self.last_item if self.shape.blocking else (() if received is None else (received,))
        first_id = len(self.ops)
        ch = self.chunks[step.chunk]
        if step.kind == "F":
            out = self.forward(ch, step.micro_batch, received)
        else:
            out = self.backward(ch, step.micro_batch, received)
        _gate(self.ops, first_id, gate)
        self.last_item = self.last_compute = (out,)

    def forward(self, ch: ChunkLayout, mb: int, x: int | None) -> int:
        links = self.links.get((ch.chunk, "F"))
        if links is None:
            links = self.links[(ch.chunk, "F")] = self.forward_links(ch)
        if not links:  # a chunk of no block: its input passes through
            return x
        bases = stamp_chain(self.ops, links, mb, x)
        if ch.head:
            self.loss[(mb, ch.chunk)] = bases[-1] + links[-1][0].marks["out"]
        return bases[-1] + links[-1][0].marks["out"]

    def forward_links(self, ch: ChunkLayout) -> tuple:
        """A chunk's forward blocks (stamping.stamp_chain's links): embedding, layers, amax, head."""
        t = self.t
        links = [(t.embed_fwd, K.EMBED_BLOCK, None, None)] if ch.embedding else []
        links += [(t.layer_fwd(layer), K.layer_block(layer), layer, "in") for layer in ch.layers]
        amax = self.amax.get(tuple(ch.layers))
        links += [(amax[0], f"{K.FP8_BLOCK}.c{ch.chunk}", None, "in")] if amax is not None else []
        links += [(t.head_fwd, K.HEAD_BLOCK, None, "in")] if ch.head else []
        return tuple(links)

    def backward(self, ch: ChunkLayout, mb: int, g: int | None) -> int:
        links = self.links.get((ch.chunk, "B"))
        if links is None:
            links = self.links[(ch.chunk, "B")] = self.backward_links(ch)
        if not links:
            return g
        bases = stamp_chain(self.ops, links, mb, self.loss[(mb, ch.chunk)] if ch.head else g)
        if mb == self.rs.micro_batches - 1:  # DP reduces the last micro-batch's gradients
            for (tpl, *_), base in zip(links, bases, strict=True):
                self.grads[ch.chunk] += [(base + i, n) for i, n in tpl.grads]
                self.expert_grads[ch.chunk] += [(base + i, n) for i, n in tpl.expert_grads]
        return bases[-1] + links[-1][0].marks["out"]

    def backward_links(self, ch: ChunkLayout) -> tuple:
        """A chunk's backward blocks: head (on the loss), layers last to first, amax, embedding (on "gin")."""
        t = self.t
        links = [(t.head_bwd, K.HEAD_BLOCK, None)] if ch.head else []
        links += [(t.layer_bwd(layer), K.layer_block(layer), layer) for layer in reversed(ch.layers)]
        amax = self.amax.get(tuple(ch.layers))
        links += [(amax[1], f"{K.FP8_BLOCK}.c{ch.chunk}", None)] if amax is not None else []
        links += [(t.embed_bwd, K.EMBED_BLOCK, None)] if ch.embedding else []
        return tuple((*link, "loss" if ch.head and k == 0 else "gin") for k, link in enumerate(links))


def _chunk_grad_params(t: Templates, ch: ChunkLayout, expert: bool = False) -> list[int]:
    """Parameter counts of a chunk's gradient producers in backward order (as _Stage.backward records;
    `expert`: the routed experts')."""
    layers = [n for layer in reversed(ch.layers) for _, n in
              (t.layer_bwd(layer).expert_grads if expert else t.layer_bwd(layer).grads)]
    if expert:  # the head's: a multi-token prediction layer's experts (sim/schedule/mtp_ops.py)
        return ([n for _, n in t.head_bwd.expert_grads] if ch.head else []) + layers
    head = [n for _, n in t.head_bwd.grads] if ch.head else []
    embed = [n for _, n in t.embed_bwd.grads] if ch.embedding else []
    return head + layers + embed


def stage_dp_config(rs: ResolvedScenario, t: Templates, chunks: list[ChunkLayout], params: int,
                    expert_params: int = 0) -> DpConfig:
    """DpConfig of one stage: its layers' SP / KV gradient all-reduces and the tied-embedding one."""
    p, d = rs.scenario.parallel, t.plan.d
    head = any(ch.head for ch in chunks)
    sp, kv = layers_dp_params(rs, t, [layer for ch in chunks for layer in ch.layers], head)
    # a tied output layer, or multi-token prediction's embedding copy on the loss's stage (sim/schedule/mtp_ops.py)
    shared = rs.scenario.model.tied_embeddings or rs.scenario.model.mtp_layers > 0
    tied = shared and (head or any(ch.embedding for ch in chunks))
    return DpConfig(dp=rs.grad_dp, distributed_optimizer=p.distributed_optimizer, overlap=p.dp_overlap,
                    gather_overlap=p.param_gather_overlapped,
                    bucket_bytes=dp_bucket_bytes(rs), sp_grad_params=sp, params=params,
                    kv_grad_params=kv, embed_grad_params=d.vocab * d.hidden if tied else 0,
                    grad_bytes=grad_reduce_bytes(rs.scenario), edp=rs.edp, expert_params=expert_params,
                    param_bytes=gather_param_bytes(rs, d, params, [n for ch in chunks for n in ch.layers]),
                    step=step_plan(rs, owned_muon_params(rs, d, stage_layer_ids(rs, chunks))),
                    pre_step=tuple(newton_schulz_works(rs, d, stage_layer_ids(rs, chunks))), instances=rs.instances)


def stage_layer_ids(rs: ResolvedScenario, chunks: list[ChunkLayout]) -> list[int]:
    """The stage's decoder layers, and on the loss's stage the MTP depths (sim/schedule/mtp_ops.py)."""
    head = any(ch.head for ch in chunks)
    return [n for ch in chunks for n in ch.layers] + (mtp_layer_ids(rs.scenario.model) if head else [])


def build_stage(rs: ResolvedScenario, stage: int, chunks: list[ChunkLayout], t: Templates) -> Schedule:
    """The ops of one rank of pipeline stage `stage`."""
    d = layer_dims(rs)
    overlap_gather = gathers_overlap(rs)
    size = dp_bucket_bytes(rs)
    reserved = sum(reserved_gathers(_chunk_grad_params(t, ch), size, _chunk_grad_params(t, ch, True), rs.grad_dp,
                                    rs.edp) for ch in chunks) if overlap_gather else 0
    st = _Stage(rs, stage, chunks, t, reserved)
    for step in stage_order(st.shape, stage):
        if isinstance(step, Comm):
            st.comm(step)
        elif isinstance(step, Combined):
            combined_compute(st, step.f, step.b, step.posts)
        elif st.shape.combined:  # a warm-up forward or cool-down backward is a plan run alone
            combined_compute(st, step if step.kind == "F" else None, step if step.kind == "B" else None)
        else:
            st.compute(step)
    ops = st.ops
    # buckets chunk v-1 first: the backward finishes chunks in reverse, and the gathers run in reverse
    buckets = [b for c in reversed(range(len(chunks)))
               for b in all_buckets(st.grads[c], st.expert_grads[c], size, rs.grad_dp, rs.edp, rs.instances)]
    params = sum(n for grads in st.grads for _, n in grads)
    expert_params = sum(n for grads in st.expert_grads for _, n in grads)
    cfg = stage_dp_config(rs, t, chunks, params, expert_params)
    ops += step_end_ops(len(ops), [], len(ops) - 1, cfg, buckets)
    step_op = next(op.id for op in reversed(ops) if op.name == "opt.step")
    head = any(ch.head for ch in chunks)  # the loss's stage also runs the MTP depths (sim/schedule/mtp_ops.py)
    ops += weight_cast_op(rs, d, stage_layer_ids(rs, chunks), step_op, len(ops), head)
    if overlap_gather:
        ops = fill_param_gathers(ops, buckets, cfg.param_bytes)
    meta = {"chunks": d.chunks, "params_per_rank": params + expert_params, "padded_vocab": d.vocab * d.tp,
            "grad_producers": sum(len(g) + len(e) for g, e in zip(st.grads, st.expert_grads, strict=True)),
            "layers": [list(ch.layers) for ch in chunks], "expert_params_per_rank": expert_params}
    ops_t = ops.frozen()  # the stamps' records are built again when read (sim/schedule/stamped_ops.py)
    return Schedule(ops_t, rs.tp, rs.dp, rs.micro_batches, meta, kv_replicas=rs.kv_replicas, pp=rs.pp,
                    stage=stage, ep=rs.ep, etp=rs.etp, cp=rs.cp, tiling=ops.sealed(ops_t))


def build_stage_schedules(rs: ResolvedScenario) -> tuple[Schedule, ...]:
    """One Schedule per pipeline stage (pp = 1: the non-pipelined builder's single schedule)."""
    if rs.pp == 1:
        return (build_schedule(rs),)
    with gc_paused():
        d = layer_dims(rs)
        t = step_templates(rs, d, tied=False)  # with pp > 1 the last stage holds its own copy of a tied embedding
        layout = pipeline_layout(rs.scenario.parallel, rs.scenario.model.layers)
        return tuple(build_stage(rs, r, layout[r], t) for r in range(rs.pp))
