"""One pipeline stage on real tensors: its model chunks, run in the simulator's order, with activations and
gradients exchanged by torch.distributed point-to-point calls.

- Layers: chunk c of stage r holds sim/schedule/pipeline_layout.py's layers (the same rule the schedule
  stamps); the first virtual stage also runs the embedding, the last the final norm, output layer and loss.
  With tied embeddings and pp > 1 the last stage holds its own copy of the embedding table (Megatron's).
- Order: sim/schedule/pipeline.py's stage_order (the steps build_stage_schedules turns into ops). A Comm
  step is one dist.batch_isend_irecv to the peer stages' ranks at this rank's (tp, dp) position, waited at
  once. With P2P overlap Megatron waits a receive only before the compute that uses it; the order in
  which batches are posted is the same, and so are the numerics, but on gloo (torch 2.13) deferring the
  waits hung the interleaved 4-stage step (cause not found), so every batch is waited at once here.
- Each transfer carries a tag unique to (direction, micro-batch, sender's virtual stage), its rendezvous key.
- Loss: each micro-batch's mean loss over its tokens, divided by m, so the accumulated gradient is the
  gradient of the mean over the step's tokens, as the single-process reference computes it.

Faults (negative controls, validate/numerics/check.py): "swap_p2p" issues every batch's transfers in
reverse order (the P2P counts differ); "drop_mb_grad" discards the weight gradients of the last micro-batch's
backward on every stage (its input gradient still flows, so the schedule completes; the numerics differ).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from meshsim.sim.schedule.pipeline import Comm, Compute, PipelineShape, Transfer, peer, stage_order
from meshsim.sim.schedule.pipeline_layout import ChunkLayout
from meshsim.validate.stack.comm import comm_tag, p2p_tag
from meshsim.validate.stack.decoder import transformer_layer
from meshsim.validate.stack.layers import Mesh, Plan
from meshsim.validate.stack.model import embed, head_loss


def stage_params(names: list[str], chunks: list[ChunkLayout], tied: bool) -> list[str]:
    """The full-model parameter names a stage holds, in model order."""
    layers = {i for ch in chunks for i in ch.layers}
    first, last = any(ch.embedding for ch in chunks), any(ch.head for ch in chunks)

    def held(n: str) -> bool:
        if n.startswith("layers."):
            return int(n.split(".")[1]) in layers
        if n == "embed.weight":
            return first or (last and tied)
        return last  # final_ln.*, head.weight

    return [n for n in names if held(n)]


def transfer_tag(shape: PipelineShape, stage: int, t: Transfer) -> int:
    """(direction, micro-batch, sender's virtual stage) as one int: the same on both ends."""
    _, sender = peer(shape, stage, t)
    return p2p_tag(t.direction, t.micro_batch, sender, shape.p * shape.v)


@dataclass
class StageRun:
    """State of one stage's step: the tensors in flight, keyed (micro-batch, chunk)."""

    w: dict
    plan: Plan
    mesh: Mesh
    shape: PipelineShape
    chunks: list[ChunkLayout]
    tokens: torch.Tensor  # [s, m b] this DP rank's columns, micro-batch-major
    labels: torch.Tensor
    inputs: dict = field(default_factory=dict)  # (mb, c) -> received activation (a leaf requiring grad)
    outputs: dict = field(default_factory=dict)  # (mb, c) -> activation out, or the scaled loss on the head
    grads_in: dict = field(default_factory=dict)  # (mb, c) -> d(loss)/d(input) to send backward
    received: dict = field(default_factory=dict)  # (direction, mb, c) -> received tensor
    losses: dict = field(default_factory=dict)  # mb -> (mean loss, logits) on the last virtual stage

    def micro_slice(self, mb: int) -> slice:
        b = self.plan.dims.micro_batch
        return slice(mb * b, (mb + 1) * b)

    def take(self, direction: str, mb: int, c: int) -> torch.Tensor:
        return self.received.pop((direction, mb, c))

    def comm(self, step: Comm) -> None:
        ops = []
        transfers = step.transfers[::-1] if "swap_p2p" in self.plan.faults else step.transfers
        for t in transfers:
            tensor = self.send_tensor(t) if t.send else self.recv_buffer()
            other = self.mesh.stage_rank(peer(self.shape, self.mesh.stage, t)[0])
            tag = transfer_tag(self.shape, self.mesh.stage, t)
            ops.append(dist.P2POp(dist.isend if t.send else dist.irecv, tensor, other, tag=tag))
            if not t.send:
                self.received[(t.direction, t.micro_batch, t.chunk)] = tensor
        for h in dist.batch_isend_irecv(ops):
            h.wait()  # at once, also with overlap: see the module docstring

    def send_tensor(self, t: Transfer) -> torch.Tensor:
        key = (t.micro_batch, t.chunk)
        return self.outputs[key].detach().contiguous() if t.direction == "fwd" else self.grads_in.pop(key)

    def recv_buffer(self) -> torch.Tensor:
        d = self.plan.dims
        seq = d.seq // d.tp if d.sp else d.seq
        return torch.empty(seq, d.micro_batch, d.hidden, dtype=next(iter(self.w.values())).dtype)

    def compute(self, step: Compute) -> None:
        mb, ch = step.micro_batch, self.chunks[step.chunk]
        with comm_tag(phase="fwd" if step.kind == "F" else "bwd", micro_batch=mb):
            self.forward(ch, mb) if step.kind == "F" else self.backward(ch, mb)

    def forward(self, ch: ChunkLayout, mb: int) -> None:
        cols = self.micro_slice(mb)
        if ch.embedding:
            x = embed(self.tokens[:, cols], self.w, self.plan.dims, self.mesh, self.plan.boundaries[1])
        else:
            x = self.inputs[(mb, ch.chunk)] = self.take("fwd", mb, ch.chunk).requires_grad_()
        for i in ch.layers:
            x = transformer_layer(x, self.w, i, self.plan, self.mesh)
        if ch.head:
            loss, logits = head_loss(x, self.w, self.labels[:, cols], self.plan, self.mesh)
            self.losses[mb] = (loss.detach(), logits.detach())
            x = loss / self.shape.m
        self.outputs[(mb, ch.chunk)] = x

    def backward(self, ch: ChunkLayout, mb: int) -> None:
        out = self.outputs.pop((mb, ch.chunk))
        kept = None
        if "drop_mb_grad" in self.plan.faults and mb == self.shape.m - 1:
            kept = {n: None if t.grad is None else t.grad.clone() for n, t in self.w.items()}
        if ch.head:
            out.backward()
        else:
            out.backward(self.take("bwd", mb, ch.chunk))
        if kept is not None:
            for n, t in self.w.items():
                t.grad = kept[n]
        x = self.inputs.pop((mb, ch.chunk), None)
        if x is not None:
            self.grads_in[(mb, ch.chunk)] = x.grad

    def run(self) -> None:
        for step in stage_order(self.shape, self.mesh.stage):
            self.comm(step) if isinstance(step, Comm) else self.compute(step)
