"""Execute a Schedule's works for real on one rank (the timing half of validate).

Each work becomes a prepared closure over preallocated operands (identical works share them):
- Gemm: torch.matmul of [batch, m, k] x [batch, k, n];
- Attention: F.scaled_dot_product_attention on [b, heads, s, head_dim] (KV heads expanded to the query
  heads beforehand, outside the timed call), causal as the work says. A backward work runs only the
  backward: torch.autograd.grad through a forward graph built once and retained, so it times the
  2.5x-forward backward kernel the work's FLOPs describe, not an extra forward;
- Elementwise: a memory-bound kernel touching the work's bytes: copy min(R, W) bytes, read the rest of
  R (sum) or write the rest of W (zero fill);
- OptimizerStep: the same memory-bound kernel over params x bytes_per_param bytes, half read, half written;
- Collective: the torch.distributed call on this rank's "tp", "dp", "kv", "embed", expert-mesh ("ep",
  "etp", "etp_ep", "edp") or distributed-optimizer-instance ("dp_in", "edp_in", "dp_out") group with the
  work's nbytes (all-gather / reduce-scatter: nbytes is the gathered total, as in nccl-tests; all-to-all:
  each rank's send buffer, equal splits); a group of one is a no-op, a kind without groups an error;
- P2P (a pipeline batch on the pp_comm stream): one dist.batch_isend_irecv of every transfer, each to the
  rank of its peer stage at this rank's (tp, dp) position (sim/core/mesh.py's "pp" group), nbytes each,
  tagged with validate/stack/comm.py's p2p_tag (the rendezvous key the simulator's engine matches on).
Operands are fp32 on CPU (gloo; CPU bf16 GEMMs are not representative) and bf16 on CUDA (NCCL); the
byte counts are the schedule's either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshsim.sim.schedule.ops import P2P, Attention, Collective, Elementwise, Gemm, OptimizerStep, Work
from meshsim.validate.stack.comm import ALL_GATHER, REDUCE_SCATTER, p2p_tag

Runner = Callable[[bool], object]  # runner(async_op) -> a torch.distributed Work handle or None


@dataclass(frozen=True)
class Device:
    device: torch.device
    dtype: torch.dtype

    @classmethod
    def for_backend(cls, backend: str) -> Device:
        if backend == "nccl":
            return cls(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
        return cls(torch.device("cpu"), torch.float32)

    def randn(self, *shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype, requires_grad=grad)

    def empty(self, n: int) -> torch.Tensor:
        return torch.empty(max(n, 1), device=self.device, dtype=self.dtype)

    @property
    def elem_bytes(self) -> int:
        return torch.finfo(self.dtype).bits // 8


def _gemm(g: Gemm, dev: Device) -> Runner:
    a, b = dev.randn(g.batch, g.m, g.k), dev.randn(g.batch, g.k, g.n)
    out = torch.empty(g.batch, g.m, g.n, device=dev.device, dtype=dev.dtype)
    return lambda async_op=False: torch.matmul(a, b, out=out)


def _attention(a: Attention, dev: Device) -> Runner:
    q = dev.randn(a.batch, a.heads, a.seq, a.head_dim, grad=a.backward)
    kv = [dev.randn(a.batch, a.kv_heads, a.seq, a.head_dim) for _ in range(2)]
    k, v = (t.repeat_interleave(a.heads // a.kv_heads, dim=1).requires_grad_(a.backward) for t in kv)
    if not a.backward:
        return lambda async_op=False: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
    grad = torch.randn_like(out)
    return lambda async_op=False: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def memory_kernel(read_bytes: int, write_bytes: int, dev: Device) -> Runner:
    """Touch read_bytes + write_bytes of memory: copy the common part, then sum / zero the remainder."""
    n_r, n_w = read_bytes // dev.elem_bytes, write_bytes // dev.elem_bytes
    common = min(n_r, n_w)
    src, dst = dev.randn(max(n_r, 1)), dev.empty(n_w)

    def run(async_op=False):
        dst[:common].copy_(src[:common])
        if n_r > common:
            src[common:].sum()
        elif n_w > common:
            dst[common:].zero_()

    return run


def _collective(c: Collective, dev: Device, groups: dict[str, object]) -> Runner:
    if c.group not in groups:  # a kind the worker built no groups for: a bug, never a silent no-op
        raise KeyError(f"no process group of kind {c.group!r} for {c.op} ({c.boundary}); built: {sorted(groups)}")
    group = groups[c.group]
    if group is None or dist.get_world_size(group) == 1:
        return lambda async_op=False: None
    n = dist.get_world_size(group)
    per_rank = -(-c.nbytes // (dev.elem_bytes * n))  # elements per rank, rounded up
    full, part = dev.empty(per_rank * n), dev.empty(per_rank)
    calls = {
        "all_reduce": lambda a: dist.all_reduce(full, group=group, async_op=a),
        "all_gather": lambda a: getattr(dist, ALL_GATHER)(full, part, group=group, async_op=a),
        "reduce_scatter": lambda a: getattr(dist, REDUCE_SCATTER)(part, full, group=group, async_op=a),
        "broadcast": lambda a: dist.broadcast(full, src=dist.get_global_rank(group, 0), group=group, async_op=a),
        "all_to_all": lambda a: dist.all_to_all_single(full, full.clone(), group=group, async_op=a),
    }
    call = calls[c.op]
    return lambda async_op=False: call(async_op)


@dataclass(frozen=True)
class Pipeline:
    """This rank's pipeline peers: pp_ranks[s] is stage s's rank at this rank's (tp, dp) position."""

    pp_ranks: tuple[int, ...] = (0,)
    vstages: int = 1  # pp x vp virtual stages (the tag's range)


class _Batch:
    """The requests of one batch_isend_irecv; wait() waits them all."""

    def __init__(self, requests: list):
        self.requests = requests

    def wait(self) -> None:
        for req in self.requests:
            req.wait()


def _p2p(p: P2P, dev: Device, pipe: Pipeline) -> Runner:
    ops = [dist.P2POp(dist.isend if t.send else dist.irecv, dev.empty(-(-t.nbytes // dev.elem_bytes)),
                      pipe.pp_ranks[t.peer_stage], tag=p2p_tag(t.direction, t.micro_batch, t.sender_vstage,
                                                                pipe.vstages))
           for t in p.transfers]

    def run(async_op=False):
        batch = _Batch(dist.batch_isend_irecv(ops))
        if not async_op:
            batch.wait()
            return None
        return batch

    return run


def make_runner(work: Work, dev: Device, groups: dict[str, object], pipe: Pipeline = Pipeline()) -> Runner:
    if isinstance(work, Gemm):
        return _gemm(work, dev)
    if isinstance(work, Attention):
        return _attention(work, dev)
    if isinstance(work, Elementwise):
        return memory_kernel(work.bytes_read, work.bytes_written, dev)
    if isinstance(work, OptimizerStep):
        total = work.params * work.bytes_per_param
        return memory_kernel(total // 2, total - total // 2, dev)
    if isinstance(work, Collective):
        return _collective(work, dev, groups)
    if isinstance(work, P2P):
        return _p2p(work, dev, pipe)
    raise TypeError(f"unknown work {work!r}")


class Runners:
    """One prepared runner per distinct work (memoized: a schedule repeats few shapes)."""

    def __init__(self, dev: Device, groups: dict[str, object], pipe: Pipeline = Pipeline()):
        self.dev, self.groups, self.pipe = dev, groups, pipe
        self.cache: dict[Work, Runner] = {}

    def __call__(self, work: Work) -> Runner:
        runner = self.cache.get(work)
        if runner is None:
            runner = self.cache[work] = make_runner(work, self.dev, self.groups, self.pipe)
        return runner
