"""Context-parallel attention on real tensors: Transformer Engine's KV ring (p2p) and all-to-all (a2a) with
causal load balancing, forward and backward, over torch.distributed (gloo on CPU).

The algorithms are the ones sim/schedule/cp_ops.py schedules (TE dot_product_attention/context_parallel.py at
d0067d0): each rank holds chunks i and 2 cp - 1 - i of the 2 cp chunks of a sequence (`local_chunks`);
- p2p forward: step j attends the local queries to rank i - j's K, V (received from rank i - 1 while step
  j - 1 computes), the partial outputs merged by their log-sum-exp; backward: the ring reversed, starting
  from the last block the forward received (rank i + 1's), each shift carrying the next K, V and the dK, dV
  accumulated so far, so a block's gradient reaches its owner with the last shift (the diagonal step);
- a2a: Q, K, V all-to-all'ed from [s / cp tokens, h heads] to [s tokens, h / cp heads], ordinary causal
  attention, the output all-to-all'ed back; backward: the same all-to-alls transposed (dO, then dQ, dK, dV).
Every message is recorded as the schedule names it ("L0.mb0.fwd.cp_ring_c0", op "send_recv", group "cp",
elements sent) so validate/numerics/cp_check.py can compare the counts with the simulator's.
Tensors are [b, heads, tokens, head_dim]; GQA: K, V have kv_heads heads, each serving heads / kv_heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.cp_ops import rank_chunks


@dataclass
class CpContext:
    """A rank's cp group: global ranks in cp order, its position, the process group, the call log."""

    ranks: tuple[int, ...]
    rank: int  # position in `ranks`
    group: object = None
    block: str = "L0.mb0"
    calls: list[dict] = field(default_factory=list)
    chunk_of: tuple[int, ...] | None = None  # chunks per rank (a negative control may change them)

    @property
    def cp(self) -> int:
        return len(self.ranks)

    def chunks(self, rank: int) -> tuple[int, int]:
        return tuple(self.chunk_of[2 * rank:2 * rank + 2]) if self.chunk_of else rank_chunks(rank, self.cp)

    def record(self, phase: str, key: str, op: str, group: str, numel: int) -> None:
        self.calls.append({"name": f"{self.block}.{phase}.{key}", "op": op, "group": group, "numel": int(numel)})


def local_chunks(x: torch.Tensor, chunks: tuple[int, int], cp: int, dim: int = 2) -> torch.Tensor:
    """The two sequence chunks `chunks` of 2 cp of x along `dim`, concatenated."""
    parts = x.chunk(2 * cp, dim=dim)
    return torch.cat([parts[c] for c in chunks], dim=dim)


def positions(chunks: tuple[int, int], chunk: int) -> torch.Tensor:
    """Global token positions of a rank's two chunks."""
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in chunks])


def _expand(k: torch.Tensor, heads: int) -> torch.Tensor:
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def _fold(dk: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Sum a gradient over the query heads each KV head serves."""
    b, h, t, d = dk.shape
    return dk.view(b, kv_heads, h // kv_heads, t, d).sum(2)


def block_forward(q, k, v, qpos, kpos) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d)) v over the causal pairs (key position <= query position); (out, lse) with
    out 0 and lse -inf on rows without a key."""
    scores = q @ _expand(k, q.shape[1]).transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None]).nan_to_num(0.0)
    return p @ _expand(v, q.shape[1]), lse


def block_backward(q, k, v, dout, out, lse, qpos, kpos):
    """(dq, dk, dv) of one block from the final output's log-sum-exp (flash attention's backward)."""
    h = q.shape[1]
    ke, ve = _expand(k, h), _expand(v, h)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ ke.transpose(-1, -2) * scale).masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
    p = torch.exp(scores - lse[..., None])
    dv = p.transpose(-1, -2) @ dout
    dp = dout @ ve.transpose(-1, -2)
    ds = p * (dp - (dout * out).sum(-1, keepdim=True))
    return ds @ ke * scale, _fold(ds.transpose(-1, -2) @ q * scale, k.shape[1]), _fold(dv, k.shape[1])


def _shift(ctx: CpContext, phase: str, step: int, send: list[torch.Tensor], backward: bool) -> list[torch.Tensor]:
    """One ring shift: send `send` to the next rank (the previous one in backward), receive the same shapes."""
    flat = torch.cat([t.reshape(-1) for t in send])
    got = torch.empty_like(flat)
    nxt, prv = (ctx.rank - 1) % ctx.cp, (ctx.rank + 1) % ctx.cp
    if not backward:
        nxt, prv = prv, nxt
    ctx.record(phase, f"{K.CP_RING}_c{step}", "send_recv", "cp", flat.numel())
    reqs = [dist.isend(flat, ctx.ranks[nxt], group=ctx.group), dist.irecv(got, ctx.ranks[prv], group=ctx.group)]
    for req in reqs:
        req.wait()
    out, at = [], 0
    for t in send:
        out.append(got[at:at + t.numel()].view_as(t))
        at += t.numel()
    return out


class RingAttention(torch.autograd.Function):
    """cp_comm p2p (module docstring). Inputs: the local q, k, v; ctx: a CpContext."""

    @staticmethod
    def forward(fn_ctx, q, k, v, ctx: CpContext):
        chunk = q.shape[2] // 2
        qpos = positions(ctx.chunks(ctx.rank), chunk)
        kv, outs, lses = (k, v), [], []
        for j in range(ctx.cp):
            src = (ctx.rank - j) % ctx.cp
            nxt = _shift(ctx, "fwd", j, list(kv), backward=False) if j < ctx.cp - 1 else None
            o, lse = block_forward(q, kv[0], kv[1], qpos, positions(ctx.chunks(src), chunk))
            outs.append(o)
            lses.append(lse)
            kv = tuple(nxt) if nxt is not None else kv
        lse = torch.logsumexp(torch.stack(lses), dim=0)
        out = sum(torch.exp(l_ - lse)[..., None] * o for o, l_ in zip(outs, lses, strict=True))
        fn_ctx.save_for_backward(q, kv[0], kv[1], out, lse)  # kv: the block received last (rank i + 1's)
        fn_ctx.cp = ctx
        return out

    @staticmethod
    def backward(fn_ctx, dout):
        q, k, v, out, lse = fn_ctx.saved_tensors
        ctx, chunk = fn_ctx.cp, q.shape[2] // 2
        qpos = positions(ctx.chunks(ctx.rank), chunk)
        dq, dkv, kv = torch.zeros_like(q), None, (k, v)
        for j in range(ctx.cp):
            src = (ctx.rank + 1 + j) % ctx.cp
            send = (list(kv) if j < ctx.cp - 1 else []) + (list(dkv) if dkv is not None else [])
            got = _shift(ctx, "bwd", j, send, backward=True)
            dq_, dk_, dv_ = block_backward(q, kv[0], kv[1], dout, out, lse, qpos, positions(ctx.chunks(src), chunk))
            dq = dq + dq_
            received = got[-2:] if j > 0 else (torch.zeros_like(dk_), torch.zeros_like(dv_))
            dkv = (received[0] + dk_, received[1] + dv_)
            kv = tuple(got[:2]) if j < ctx.cp - 1 else kv
        return dq, dkv[0], dkv[1], None


class AllToAll(torch.autograd.Function):
    """x [cp, ...]: slice i goes to cp rank i, slice i of the result came from rank i; its own transpose,
    so backward runs the same exchange on the gradient (recorded under `bwd_key`)."""

    @staticmethod
    def forward(fn_ctx, x, ctx: CpContext, phase: str, key: str, bwd_key: str):
        fn_ctx.cp, fn_ctx.bwd_key = ctx, bwd_key
        return _a2a(x, ctx, phase, key)

    @staticmethod
    def backward(fn_ctx, grad):
        return _a2a(grad, fn_ctx.cp, "bwd", fn_ctx.bwd_key), None, None, None, None


def _a2a(x: torch.Tensor, ctx: CpContext, phase: str, key: str) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    ctx.record(phase, f"{K.CP_A2A}_{key}", "all_to_all", "cp_a2a", x.numel())
    dist.all_to_all_single(out, x, group=ctx.group)
    return out


def _to_heads(x: torch.Tensor, ctx: CpContext, key: str, bwd_key: str) -> torch.Tensor:
    """[b, h, L, d] (this rank's chunks) -> [b, h / cp, s, d] (the whole sequence in order)."""
    b, h, n, d = x.shape
    parts = x.view(b, ctx.cp, h // ctx.cp, n, d).permute(1, 0, 2, 3, 4)
    got = AllToAll.apply(parts, ctx, "fwd", key, bwd_key)  # [cp (source rank), b, h / cp, L, d]
    chunks = {c: t for r in range(ctx.cp) for c, t in zip(ctx.chunks(r), got[r].chunk(2, dim=2), strict=True)}
    return torch.cat([chunks[c] for c in range(2 * ctx.cp)], dim=2)


def _to_tokens(y: torch.Tensor, ctx: CpContext) -> torch.Tensor:
    """The inverse of _to_heads for the output: [b, h / cp, s, d] -> [b, h, L, d]."""
    parts = y.chunk(2 * ctx.cp, dim=2)
    send = torch.stack([torch.cat([parts[c] for c in ctx.chunks(r)], dim=2) for r in range(ctx.cp)])
    got = AllToAll.apply(send, ctx, "fwd", "out", "dout")  # [cp (source rank = head group), b, h/cp, L, d]
    return torch.cat(list(got), dim=1)


def a2a_attention(q, k, v, ctx: CpContext) -> torch.Tensor:
    """cp_comm a2a (module docstring): autograd runs the transposed all-to-alls in backward."""
    qh, kh, vh = (_to_heads(t, ctx, n, "d" + n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    pos = torch.arange(qh.shape[2])
    out, _ = block_forward(qh, kh, vh, pos, pos)
    return _to_tokens(out, ctx)
