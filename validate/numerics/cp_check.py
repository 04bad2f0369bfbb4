"""Context-parallel attention for real against one process: ring (p2p) and all-to-all (a2a) attention with
causal load balancing, forward and backward (validate/stack/cp_attention.py), on every rank of a world that
is one cp group.

Per variant every rank builds the same full Q, K, V and dO (one seed), computes the single-process causal
attention and its gradients, takes its load-balanced chunks (i and 2 cp - 1 - i) of the input, runs the
context-parallel version and compares its output and dQ, dK, dV with the same chunks of the reference
(torch.testing.assert_close, float64). The control `wrong_chunks` hands each rank chunks 2i and 2i + 1
instead, as a loader that forgot the load balancing would: the algorithm still assumes the balanced
positions, so the comparison must fail. The calls each rank made are compared with the simulator's
schedule of the same shapes (`expected_calls`: sim/schedule/cp_ops.py, in elements of the model dtype).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import CP_GROUPS, Collective
from meshsim.validate.stack.cp_attention import (
    CpContext,
    RingAttention,
    a2a_attention,
    block_forward,
    local_chunks,
)

SEED = 1234
FAULTS = ("wrong_chunks",)


@dataclass(frozen=True)
class CpVariant:
    name: str
    cp_comm: str  # "p2p" or "a2a"
    cp: int
    batch: int = 2
    heads: int = 4
    kv_heads: int = 2
    seq: int = 64
    head_dim: int = 16
    fault: str | None = None  # one of FAULTS
    v_head_dim: int | None = None  # V and the output this wide (MLA: 128 against Q and K's 192); None: head_dim
    rope_dim: int = 8  # with v_head_dim: the rotary part of head_dim in the schedule's MLA model

    @property
    def v_width(self) -> int:
        return self.v_head_dim or self.head_dim


def _attention_overrides(v: CpVariant) -> dict:
    """The schedule's attention for v: its KV heads, or, with its own V width, MLA whose Q and K heads are
    head_dim wide (qk_head_dim + qk_rope_head_dim) and V heads v_head_dim wide (every head its own KV head)."""
    if v.v_head_dim is None:
        return {"model.kv_heads": v.kv_heads}
    if v.kv_heads != v.heads:
        raise ValueError(f"variant {v.name}: MLA's shapes need kv_heads = heads ({v.heads}), not {v.kv_heads}")
    return {"model.mla": {"q_lora_rank": 32, "kv_lora_rank": 32, "qk_head_dim": v.head_dim - v.rope_dim,
                          "qk_rope_head_dim": v.rope_dim, "v_head_dim": v.v_head_dim}}


def expected_calls(v: CpVariant) -> list[dict]:
    """The schedule's context-parallel collectives of layer 0, micro-batch 0, for a tiny scenario with v's
    shapes: (name, op, group, elements of the 2-byte model dtype)."""
    scenario, source = load_scenario("tiny-2gpu")
    over = {"model.layers": 1, "model.hidden": v.heads * v.head_dim, "model.heads": v.heads, **_attention_overrides(v),
            "model.seq_len": v.seq, "parallel.micro_batch": v.batch,
            "parallel.tp": 1, "parallel.sp": False, "parallel.cp": v.cp, "parallel.cp_comm": v.cp_comm,
            "parallel.gpus": v.cp, "parallel.global_batch": v.batch}
    rs = resolve(with_overrides(scenario, over, source), source)
    sched = build_schedule(rs)
    return [{"name": op.name, "op": op.work.op, "group": op.work.group, "numel": op.work.nbytes // 2}
            for op in sched.ops if isinstance(op.work, Collective) and op.work.group in CP_GROUPS
            and op.name.startswith("L0.mb0.")]


def call_diffs(got: list[dict], expected: list[dict]) -> list[str]:
    """What the real run issued that the schedule does not (and the reverse), as a multiset."""
    key = lambda c: (c["name"], c["op"], c["group"], c["numel"])  # noqa: E731
    have, want = Counter(map(key, got)), Counter(map(key, expected))
    return [f"extra {k}" for k in have - want] + [f"missing {k}" for k in want - have]


def payload(variants: list[CpVariant]) -> dict:
    return {"variants": [asdict(v) for v in variants]}


def _inputs(v: CpVariant) -> list[torch.Tensor]:
    """Q, K, V and dO of the whole sequence, the same on every rank."""
    gen = torch.Generator().manual_seed(SEED)
    shapes = [(v.batch, v.heads, v.head_dim), (v.batch, v.kv_heads, v.head_dim), (v.batch, v.kv_heads, v.v_width),
              (v.batch, v.heads, v.v_width)]
    return [torch.randn(b, h, v.seq, d, generator=gen, dtype=torch.float64) for b, h, d in shapes]


def reference(v: CpVariant) -> tuple[torch.Tensor, ...]:
    """Single-process causal attention: (out, dq, dk, dv) of the whole sequence."""
    q, k, v_, dout = _inputs(v)
    q, k, v_ = (t.clone().requires_grad_() for t in (q, k, v_))
    pos = torch.arange(v.seq)
    out, _ = block_forward(q, k, v_, pos, pos)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v_.grad


def run_variant(v: CpVariant) -> dict:
    """This rank's chunks through the context-parallel attention, compared with the reference's chunks."""
    rank = dist.get_rank()
    ctx = CpContext(tuple(range(v.cp)), rank)
    chunks = ctx.chunks(rank)
    given = (2 * rank, 2 * rank + 1) if v.fault == "wrong_chunks" else chunks
    q, k, v_, dout = (local_chunks(t, given, v.cp).clone() for t in _inputs(v))
    q, k, v_ = (t.requires_grad_() for t in (q, k, v_))
    out = RingAttention.apply(q, k, v_, ctx) if v.cp_comm == "p2p" else a2a_attention(q, k, v_, ctx)
    out.backward(dout)
    errors = []
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out.detach(), q.grad, k.grad, v_.grad),
                               reference(v), strict=True):
        try:
            torch.testing.assert_close(got, local_chunks(want, chunks, v.cp))
        except AssertionError as exc:
            errors.append(f"{name}: {str(exc).splitlines()[0]}")
    return {"errors": errors, "calls": ctx.calls}


def cp_task(payload: dict) -> dict:
    """Worker side (validate/launch/launch.py task "cp_numerics"): {variant name: {errors, calls}}."""
    return {v["name"]: run_variant(CpVariant(**v)) for v in payload["variants"]}
