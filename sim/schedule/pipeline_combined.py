"""The interleaved pipeline's combined 1F1B (parallel.moe_ep_overlap with pp > 1): one stage's compute steps
stamped as Megatron-Core's schedule plans, merged pairwise in the steady phase.

Megatron-LM d98e8a64, megatron/core/pipeline_parallel/:
- schedules.py forward_backward_pipelining_with_interleaving: every compute step of the warm-up
  (L1622), the steady phase (L1890, L1902) and the cool-down (L2012) goes through
  forward_backward_helper_wrapper, which with the flag calls combined_1f1b_schedule_for_interleaved_pipelining
  (L1485-1507): a warm-up forward is a plan run with no backward, a cool-down backward one with no forward,
  and a steady step runs forward k and backward k - w as one combined step; one more warm-up forward
  (get_pp_rank_microbatches L966-970) keeps them independent (sim/schedule/pipeline.py);
- combined_1f1b.py L138-278 and combined_forward_backward_step (L281-512): the forward plan is built for
  one (micro-batch, model chunk) and carried to its backward on the output tensor (L421-428), so one plan,
  and one CUDA event, per (micro-batch, chunk): a Chain here;
- model_chunk_schedule_plan.py TransformerModelChunkSchedulePlan.run (L500-630): the layer pairing of two
  possibly different chunks (sim/schedule/ep_overlap.chunk_step); pre_forward / pre_backward (the waits on
  the P2P receives, L538-547) gate each plan's first op; with P2P overlap post_forward runs on the
  communication stream after the forward plan's event (L596-601) and post_backward on the compute stream
  after the backward plan's event (L603-607), both before the deferred weight gradients of the backward's
  first layer, the output layer + loss forward and the embedding backward. Without P2P overlap the merged
  step is followed by one blocking batch (schedules.py L1900-1952), which waits for both plans and the
  compute stream (run's closing wait_current_stream, L620-624).
Here a batch posted on a stream waits for the plan's last node and for the last op issued on that stream
(the NCCL kernel waits on the stream it is launched from): ep_comm for the forward's, compute for the
backward's and for the batches after a step. Costs are unchanged.
"""

from __future__ import annotations

from meshsim.sim.schedule.ep_overlap import Chain, Emitter, Side, chunk_step
from meshsim.sim.schedule.ops import Op
from meshsim.sim.schedule.pipeline import Comm, Compute


def last_on(ops: list[Op], stream: str, start: int) -> tuple[int, ...]:
    """The last op issued on `stream` at or after `start` (the FIFO makes it wait for the earlier ones)."""
    for op in reversed(ops[start:]):
        if op.stream == stream:
            return (op.id,)
    return ()


def _side(st, step: Compute, em: Emitter) -> Side:
    """The plan of `step` (a new chain for a forward, the forward's for a backward), gated on its input."""
    direction = "fwd" if step.kind == "F" else "bwd"
    key = (step.micro_batch, step.chunk)
    chain = st.chains.setdefault(key, Chain(step.micro_batch))
    ch = st.chunks[step.chunk]
    received = st.received.get((direction, step.micro_batch, step.chunk))
    if received is not None:  # the chunk's input (the head's backward reads the loss, kept in chain.out)
        chain.out = received
    chain.gate = st.last_item if st.shape.blocking else (() if received is None else (received,))
    if step.kind == "B" and step.micro_batch == st.rs.micro_batches - 1:  # DP reduces the last micro-batch's
        em.grads, em.expert_grads = st.grads[step.chunk], st.expert_grads[step.chunk]
    return Side(chain, ch.layers, ch.embedding, ch.head)


def _after(side: Side | None) -> tuple[int, ...]:
    if side is None:
        return ()
    out = (side.chain.out,) if side.chain.out is not None else ()
    return side.chain.last + tuple(o for o in out if o not in side.chain.last)


def combined_compute(st, f: Compute | None, b: Compute | None, posts: tuple[Comm, ...] = ()) -> None:
    """Stamp forward `f` and backward `b` of stage `st` (a pipeline_builder._Stage) as one combined step; the
    posted batches (forward's, then backward's) go where post_forward / post_backward run."""
    assert not any(st.amax.values()), "delayed FP8 scaling is refused for MoE models (scenarios/fp8_checks.py)"
    em = st.emitter
    em.grads = em.expert_grads = None
    start = len(st.ops)
    fs = _side(st, f, em) if f is not None else None
    bs = _side(st, b, em) if b is not None else None

    def post() -> None:
        for comm in posts:
            fwd = comm.transfers[0].direction == "fwd"
            side, stream = (fs, "ep_comm") if fwd else (bs, "compute")
            st.comm(comm, _after(side) + last_on(st.ops, stream, start))

    chunk_step(em, st.t, fs, bs, post if posts else None)
    end = _after(fs) + tuple(i for i in _after(bs) if i not in _after(fs))
    end += tuple(i for i in last_on(st.ops, "compute", start) if i not in end)
    st.last_item = st.last_compute = end
