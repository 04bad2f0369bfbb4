"""Pipeline schedules as data: the order of forward/backward compute and P2P transfers on one stage.

Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py; ../shared/reference/
megatron-pipeline.md), p stages, stage r, v model chunks per rank, m micro-batches, N micro-batches per
group (default p):

- plain 1F1B (v = 1): w = min(p - r - 1, m) warm-up forwards [recv_fwd, F, send_fwd]; one recv_fwd; m - w
  steady rounds [F, send_fwd+recv_bwd, B, send_bwd+recv_fwd] (the last round only sends the backward);
  cool-down [recv_bwd, B, send_bwd]. Every batch is one blocking batch_isend_irecv.
- interleaved 1F1B (v > 1): forwards follow the schedule table (groups of N micro-batches, chunk 0 over
  the group, then chunk 1, ...), backwards the same table with chunk v - 1 - c; w = min(2(p - r - 1) +
  (v - 1) N, v m) warm-up forwards, then steady F/B pairs, then cool-down backwards. With P2P overlap
  each compute posts one batch (its send + one receive), waited only by the compute that uses the
  received tensor; without overlap the steady round's sends and receives form one blocking batch after
  the backward. A batch's receive is the input of the stage's next compute of that direction, except
  on the leading stage (0 for activations, p - 1 for gradients), which receives what the ending stage
  sent p - 1 entries earlier (received_after): with N > p it runs up to N - p + 1 entries ahead.
- combined 1F1B (parallel.moe_ep_overlap, interleaved only): one more warm-up forward, and each steady F/B
  pair is one Combined step (sim/schedule/pipeline_combined.py) whose batches are posted inside it (overlap)
  or form one blocking batch after it.

A transfer's identity is (direction, micro-batch, sender's virtual stage c p + r): the activation of
virtual stage q goes to q + 1 (the last stage's chunk c feeds stage 0's chunk c + 1), its gradient to
q - 1. The first virtual stage receives no activation and the last sends none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["fwd", "bwd"]


@dataclass(frozen=True)
class Compute:
    kind: Literal["F", "B"]
    micro_batch: int
    chunk: int = 0


@dataclass(frozen=True)
class Transfer:
    """One send or receive of stage `stage`: the tensor of (direction, micro_batch, chunk) of this stage."""

    send: bool
    direction: Direction
    micro_batch: int
    chunk: int

    def label(self, v: int) -> str:
        what = f"{'send' if self.send else 'recv'}_{self.direction}"
        return f"{what}({self.micro_batch}{f'.c{self.chunk}' if v > 1 else ''})"


@dataclass(frozen=True)
class Comm:
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class Combined:
    """A steady-phase forward and backward merged into one step (parallel.moe_ep_overlap: Megatron's
    combined_1f1b_schedule_for_interleaved_pipelining, sim/schedule/ep_overlap.chunk_step); with P2P overlap
    the forward's and the backward's batches are posted inside it (`posts`, forward's first), after the
    layers and before the deferred weight gradients and the output layer / embedding backward."""

    f: Compute
    b: Compute
    posts: tuple[Comm, ...] = ()


PipeStep = Compute | Comm | Combined


@dataclass(frozen=True)
class PipelineShape:
    p: int  # stages
    v: int  # model chunks per rank
    m: int  # micro-batches
    n: int  # micro-batch group size (interleaved)
    overlap: bool  # interleaved P2P overlap (plain 1F1B is always blocking)
    combined: bool = False  # parallel.moe_ep_overlap: steady F/B pairs merged (Combined), one more warm-up forward

    @property
    def blocking(self) -> bool:
        return self.v == 1 or not self.overlap


def vstage(shape: PipelineShape, stage: int, chunk: int) -> int:
    """Virtual stage index of (stage, chunk): chunk x p + stage."""
    return chunk * shape.p + stage


def exists(shape: PipelineShape, stage: int, t: Transfer) -> bool:
    """Whether the transfer has a peer: nothing flows into the first virtual stage's forward or out of
    the last one's forward (and the reverse for gradients)."""
    q, last = vstage(shape, stage, t.chunk), shape.p * shape.v - 1
    outward = t.send == (t.direction == "fwd")  # towards the last virtual stage
    return q != last if outward else q != 0


def peer(shape: PipelineShape, stage: int, t: Transfer) -> tuple[int, int]:
    """(peer stage, sender's virtual stage) of a transfer: its rendezvous key with the peer."""
    q = vstage(shape, stage, t.chunk)
    outward = t.send == (t.direction == "fwd")
    other = q + 1 if outward else q - 1
    return other % shape.p, q if t.send else other


def schedule_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward in order: groups of n micro-batches, each group run chunk by
    chunk; the last group takes every remaining micro-batch (Megatron's get_schedule_table)."""
    table: list[tuple[int, int]] = []
    for first in range(0, m, n):
        last = m if first + n >= m else first + n
        table += [(mb, c) for c in range(v) for mb in range(first, last)]
    return table


def _comm(shape: PipelineShape, stage: int, *transfers: Transfer) -> list[PipeStep]:
    kept = tuple(t for t in transfers if exists(shape, stage, t))
    return [Comm(kept)] if kept else []


def one_f_one_b(shape: PipelineShape, r: int) -> list[PipeStep]:
    """Plain 1F1B on stage r (module docstring)."""
    m, out = shape.m, []
    warm = min(shape.p - r - 1, m)
    rest = m - warm

    def c(*ts: Transfer) -> None:
        out.extend(_comm(shape, r, *ts))

    for i in range(warm):
        c(Transfer(False, "fwd", i, 0))
        out.append(Compute("F", i))
        c(Transfer(True, "fwd", i, 0))
    if rest:
        c(Transfer(False, "fwd", warm, 0))
    for i in range(rest):
        out.append(Compute("F", warm + i))
        c(Transfer(True, "fwd", warm + i, 0), Transfer(False, "bwd", i, 0))
        out.append(Compute("B", i))
        if i == rest - 1:
            c(Transfer(True, "bwd", i, 0))
        else:
            c(Transfer(True, "bwd", i, 0), Transfer(False, "fwd", warm + i + 1, 0))
    for i in range(rest, m):
        c(Transfer(False, "bwd", i, 0))
        out.append(Compute("B", i))
        c(Transfer(True, "bwd", i, 0))
    return out


def warmup_forwards(shape: PipelineShape, r: int) -> int:
    """Interleaved warm-up: 2 (p - r - 1) + (v - 1) N forwards, one more with the combined 1F1B (Megatron-LM
    d98e8a64 schedules.py L966-970: so that each merged step's forward and backward are independent), capped
    at v m."""
    return min(2 * (shape.p - r - 1) + (shape.v - 1) * shape.n + shape.combined, shape.v * shape.m)


def received_after(shape: PipelineShape, r: int, direction: Direction, table: list[tuple[int, int]],
                   k: int) -> tuple[int, int] | None:
    """(micro-batch, chunk) of the tensor stage r receives in the batch posted after its k-th compute of
    `direction`, or None (Megatron-LM d98e8a64 schedules.py recv_tensor_from_previous_stage, L1285-1332).

    Most stages receive the input of their own next entry, table[k + 1]. The leading stage (stage 0 for
    activations, stage p - 1 for gradients) instead receives what the ending stage (p - 1, resp. 0) sent
    at its entry k - (p - 1), the one aligned with k: table[k - (p - 1)] = (mb, c) arrives as (mb, c + 1)
    (gradients: c - 1), and nothing when k < p - 1 or c is the last chunk of that direction. With N = p
    both rules name table[k + 1]; with N > p the leading stage receives up to N - p + 1 entries ahead of
    use (Megatron's fwd/bwd_recv_buffer_size, L1554-1567). Nothing is received after the last entry.
    `table`: the direction's order (schedule_table; gradients visit chunk v - 1 - c)."""
    if not 0 <= k < len(table) - 1:
        return None
    leading = r == (0 if direction == "fwd" else shape.p - 1)
    if not leading:
        return table[k + 1]
    if k < shape.p - 1:
        return None
    mb, c = table[k - (shape.p - 1)]
    step = 1 if direction == "fwd" else -1
    return (mb, c + step) if 0 <= c + step < shape.v else None


def interleaved(shape: PipelineShape, r: int) -> list[PipeStep]:
    """Interleaved 1F1B on stage r (module docstring)."""
    fwd = schedule_table(shape.m, shape.v, shape.n)
    bwd = [(mb, shape.v - 1 - c) for mb, c in fwd]
    total, warm = len(fwd), warmup_forwards(shape, r)
    out: list[PipeStep] = []

    def f(k: int) -> Compute:
        return Compute("F", *fwd[k])

    def b(k: int) -> Compute:
        return Compute("B", *bwd[k])

    def t(send: bool, direction: Direction, k: int) -> list[Transfer]:
        """The send of entry k, or (receive) what arrives after entry k - 1 (received_after)."""
        if not send:
            table = fwd if direction == "fwd" else bwd
            got = received_after(shape, r, direction, table, k - 1) if k > 0 else table[0]
            return [Transfer(False, direction, *got)] if got is not None else []
        table = fwd if direction == "fwd" else bwd
        return [Transfer(send, direction, *table[k])] if 0 <= k < total else []

    out += _comm(shape, r, *t(False, "fwd", 0))
    if warm == 0:
        out += _comm(shape, r, *t(False, "bwd", 0))
    for k in range(warm):
        out.append(f(k))
        extra = t(False, "bwd", 0) if k == warm - 1 else []
        out += _comm(shape, r, *t(True, "fwd", k), *t(False, "fwd", k + 1), *extra)
    for i in range(total - warm):
        k = warm + i
        if shape.combined:
            out += _combined(shape, r, f(k), b(i), t(True, "fwd", k) + t(False, "fwd", k + 1),
                             t(True, "bwd", i) + t(False, "bwd", i + 1))
            continue
        out.append(f(k))
        if shape.overlap:
            out += _comm(shape, r, *t(True, "fwd", k), *t(False, "fwd", k + 1))
            out.append(b(i))
            out += _comm(shape, r, *t(True, "bwd", i), *t(False, "bwd", i + 1))
        else:
            out.append(b(i))
            out += _comm(shape, r, *t(True, "fwd", k), *t(True, "bwd", i), *t(False, "fwd", k + 1),
                         *t(False, "bwd", i + 1))
    for i in range(total - warm, total):
        out.append(b(i))
        out += _comm(shape, r, *t(True, "bwd", i), *t(False, "bwd", i + 1))
    return out


def _combined(shape: PipelineShape, r: int, f: Compute, b: Compute, fwd: list[Transfer],
              bwd: list[Transfer]) -> list[PipeStep]:
    """A merged steady step: with P2P overlap its batches are posted inside it (pp_post_forward and
    pp_post_backward, schedules.py L1771-1888, called from model_chunk_schedule_plan.py L596-607); without,
    one blocking batch of all four follows it (schedules.py L1900-1952)."""
    if shape.overlap:
        return [Combined(f, b, tuple(_comm(shape, r, *fwd)) + tuple(_comm(shape, r, *bwd)))]
    return [Combined(f, b), *_comm(shape, r, *fwd[:1], *bwd[:1], *fwd[1:], *bwd[1:])]


def stage_order(shape: PipelineShape, r: int) -> list[PipeStep]:
    """The ordered compute and P2P steps of stage r."""
    return one_f_one_b(shape, r) if shape.v == 1 else interleaved(shape, r)


def describe(steps: list[PipeStep], v: int = 1) -> list[str]:
    """Readable form used by tests and docs: 'F3', 'B0.c1', 'send_fwd(3)+recv_bwd(0)', a merged step
    'F4.c1+B0.c1 [send_fwd(4.c1)+recv_fwd(5.c1)] [send_bwd(0.c1)+recv_bwd(1.c1)]' (its posted batches)."""
    out = []
    for s in steps:
        if isinstance(s, Compute):
            out.append(f"{s.kind}{s.micro_batch}{f'.c{s.chunk}' if v > 1 else ''}")
        elif isinstance(s, Combined):
            out.append("+".join(describe([s.f, s.b], v)) + "".join(f" [{d}]" for d in describe(list(s.posts), v)))
        else:
            out.append("+".join(t.label(v) for t in s.transfers))
    return out
