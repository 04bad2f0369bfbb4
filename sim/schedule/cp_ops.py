"""Context parallelism's attention core on one rank: Transformer Engine's three algorithms as ops.

Sources: NVIDIA/TransformerEngine transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py at d0067d0 (AttnFuncWithCPAndKVP2P L1356, AttnFuncWithCPAndKVAllGather L3014,
AttnFuncWithCPAndQKVOA2A L4170); Megatron's --cp-comm-type picks one (megatron/training/arguments.py L3221).

Causal load balancing (TE get_batch_on_this_cp_rank L5257, DualChunkSwap L4989): each sequence is cut into
2 cp chunks of c = s / (2 cp) tokens and rank i holds chunks i and 2 cp - 1 - i (`rank_chunks`), so every
rank holds L = 2c = s / cp tokens and, under the causal mask, the same work.

p2p (cp_comm p2p; the ring level of a2a+p2p): a ring of n ranks, rank i sends to i + 1 (L1418).
- Forward, n steps: at step j the rank attends its queries to the KV block of rank i - j, while the block
  for step j + 1 travels one hop (issued at the top of step j, L1698-1716): j = 0 is the diagonal, causal
  over the 2c local tokens (2c^2 pairs); a later step is a full block of 2c^2 pairs (all queries x the first
  half of the KV when i - j < i, the second half of the queries x all the KV otherwise; this module takes
  rank 0's shapes, c queries x 2c keys, since every rank runs the same schedule here). n - 1 ring shifts of
  the local K and V (`kv_bytes`); then the per-step outputs are merged (softmax-lse correction).
- Backward, n steps (L2459-2497), the ring reversed (rank i sends to i - 1, L2229-2230) and starting from
  the block the forward received last (rank i + 1's, saved at L2087), so step j holds rank i + 1 + j's
  block and the diagonal is the last step: step 0 sends KV, steps 1 .. n-2 send KV with the dK/dV
  accumulated so far (two buffers' worth), the last step sends only dK/dV, so each block's gradient
  arrives at its owner with the last shift; each shift carries the dK/dV corrected after the previous step
  (L2716-2727: a step's correction waits for its own shift), so the last shift is overlapped by one
  attention step only.
a2a (Ulysses; L4170): all-to-alls over the a2a group turn [s/cp tokens, h heads] into [s tokens, h/cp
heads] for Q, K and V before the core and back for the output (one all_to_all_single per tensor,
flash_attn_a2a_communicate L387-480), and the reverse in backward (dO before, dQ dK dV after); the core
is ordinary causal attention over the whole sequence on h/cp heads (a sliding window applies there as
without CP: the only algorithm meshsim runs windows with, scenarios/cp_checks.py). a2a+p2p: that
all-to-all over the first hierarchical size a, then the p2p ring over the cp / a ranks of the second
(L1418: ring neighbours at stride a) on the gathered a L tokens and h / a heads.
allgather (L3014): K and V all-gathered over cp (one all-gather each, L3215-3216), then one causal
attention per local chunk against the keys up to its end (chunk k: c queries, (k + 1) c keys); backward
gathers K and V again (L3788-3789), runs the two chunk backwards and reduce-scatters dK and dV (L4107-4108).
Every KV size is the rank's KV heads (GQA: kv_heads / tp, at least 1) x the head width: Q and K have
`Widths.qk`, V and the output `Widths.v` (both head_dim, or MLA's qk_head_dim + qk_pos_emb_head_dim and
v_head_dim: TE's ring sends cat(K, V) flattened, L1690, so K and V may differ; DeepSeek-V3: 192 and 128).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.ops import Attention, Collective, Elementwise
from meshsim.sim.schedule.shapes import LayerDims

Deps = tuple[int | str, ...]
LSE_BYTES = 4  # one fp32 log-sum-exp per query and head (softmax_lse, flash / cuDNN attention)


def rank_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two of 2 cp sequence chunks that rank `rank` holds: i and 2 cp - 1 - i (module docstring)."""
    return rank, 2 * cp - 1 - rank


@dataclass(frozen=True)
class Widths:
    """Head widths of the core: Q and K (`qk`), V and the output (`v`)."""

    qk: int
    v: int


def widths_of(d: LayerDims) -> Widths:
    """Standard attention: every head is head_dim wide."""
    return Widths(d.head_dim, d.head_dim)


@dataclass(frozen=True)
class CoreShape:
    """What one rank's attention core works on: `tokens` queries of `heads` (and `kv_heads`) heads."""

    tokens: int
    heads: int
    kv_heads: int


def _shape(d: LayerDims, a2a: int) -> CoreShape:
    return CoreShape(d.seq * a2a, d.heads // a2a, max(1, d.kv_heads // a2a))


def q_bytes(d: LayerDims, sh: CoreShape, w: Widths) -> int:
    """Q (or dQ) of the core: tokens x b x heads x the Q width, 16-bit."""
    return sh.tokens * d.micro_batch * sh.heads * w.qk * d.dtype_bytes


def o_bytes(d: LayerDims, sh: CoreShape, w: Widths) -> int:
    """The output (or dO): tokens x b x heads x the V width, 16-bit."""
    return sh.tokens * d.micro_batch * sh.heads * w.v * d.dtype_bytes


def k_bytes(d: LayerDims, sh: CoreShape, w: Widths) -> int:
    """K (or dK): tokens x b x KV heads x the K width, 16-bit."""
    return sh.tokens * d.micro_batch * sh.kv_heads * w.qk * d.dtype_bytes


def v_bytes(d: LayerDims, sh: CoreShape, w: Widths) -> int:
    """V (or dV): tokens x b x KV heads x the V width, 16-bit."""
    return sh.tokens * d.micro_batch * sh.kv_heads * w.v * d.dtype_bytes


def kv_bytes(d: LayerDims, sh: CoreShape, w: Widths) -> int:
    """What one ring shift moves forward: the rank's K and V."""
    return k_bytes(d, sh, w) + v_bytes(d, sh, w)


def _attn(d: LayerDims, sh: CoreShape, w: Widths, q: int, kv: int | None, causal: bool, backward: bool,
          window: int | None = None) -> Attention:
    return Attention(d.micro_batch, sh.heads, sh.kv_heads, q, w.qk, causal, backward, backward and d.deterministic,
                     window, v_head_dim=w.v if w.v != w.qk else None, fp8=d.fp8.attention, kv_seq=kv,
                     dropout=d.dropout)


def ring_forward(tpl, phase: str, d: LayerDims, sh: CoreShape, w: Widths, n: int, group: str, deps: Deps
                 ) -> tuple[int, ...]:
    """The p2p ring's forward (module docstring); returns the merged output's op."""
    shift = Collective("send_recv", group, kv_bytes(d, sh, w), K.CP_RING)
    comm = None
    attns = []
    for j in range(n):
        recv = deps if comm is None else (comm,)
        if j < n - 1:
            comm = tpl.add(phase, f"{K.CP_RING}_c{j}", shift, recv)
        work = _attn(d, sh, w, sh.tokens, None, True, False) if j == 0 else \
            _attn(d, sh, w, sh.tokens // 2, sh.tokens, False, False)
        attns.append(tpl.add(phase, f"attn_c{j}", work, recv))
    out = o_bytes(d, sh, w)  # the merge reads n partial outputs and their fp32 log-sum-exps, writes the output
    merge = Elementwise("cp_out_correction", n * out + LSE_BYTES * n * sh.tokens * d.micro_batch * sh.heads, out)
    return (tpl.add(phase, "cp_out_correction", merge, tuple(attns)),)


def ring_backward(tpl, d: LayerDims, sh: CoreShape, w: Widths, n: int, group: str, deps: Deps) -> tuple[int, ...]:
    """The p2p ring's backward (module docstring); returns (last attention, the gradient's last correction)."""
    kv = kv_bytes(d, sh, w)
    grad = q_bytes(d, sh, w) + kv
    add = Elementwise("cp_grad_correction", 2 * grad, grad)
    comm, fixed, attn = None, None, None
    for j in range(n):
        size = kv if j in (0, n - 1) else 2 * kv
        after = deps if comm is None else (comm,) + ((fixed,) if fixed is not None else ())
        shift = tpl.add("bwd", f"{K.CP_RING}_c{j}", Collective("send_recv", group, size, K.CP_RING), after)
        work = _attn(d, sh, w, sh.tokens, None, True, True) if j == n - 1 else \
            _attn(d, sh, w, sh.tokens // 2, sh.tokens, False, True)
        attn = tpl.add("bwd", f"attn_c{j}", work, deps if comm is None else (comm,))
        fixed = tpl.add("bwd", f"cp_grad_correction_c{j}", add, (attn, shift))
        comm = shift
    return (attn, fixed)


def _a2a(tpl, phase: str, key: str, nbytes: int, deps: Deps) -> int:
    return tpl.add(phase, key, Collective("all_to_all", "cp_a2a", nbytes, K.CP_A2A), deps)


def a2a_in(tpl, phase: str, names: tuple[str, ...], sizes: tuple[int, ...], deps: Deps) -> tuple[int, ...]:
    """One all-to-all per tensor, then the chunk reorder (a copy of what arrived)."""
    ops = tuple(_a2a(tpl, phase, f"{K.CP_A2A}_{n}", b, deps) for n, b in zip(names, sizes, strict=True))
    total = sum(sizes)
    return (tpl.add(phase, "cp_a2a_reorder", Elementwise("cp_a2a_reorder", total, total), ops),)


def core_forward_cp(tpl, phase: str, d: LayerDims, deps: Deps, w: Widths | None = None) -> tuple[int, ...]:
    """The attention core's forward under context parallelism (module docstring); `w`: the head widths
    (default head_dim for all: widths_of)."""
    w = w or widths_of(d)
    if d.cp_comm == "allgather":
        return _allgather_forward(tpl, phase, d, w, deps)
    a2a = d.cp_a2a
    sh = _shape(d, a2a)
    local = _shape(d, 1)
    if a2a > 1:
        deps = a2a_in(tpl, phase, ("q", "k", "v"), (q_bytes(d, local, w), k_bytes(d, local, w),
                                                    v_bytes(d, local, w)), deps)
    n = d.cp // a2a
    if n > 1:
        out = ring_forward(tpl, phase, d, sh, w, n, "cp" if a2a == 1 else "cp_p2p", deps)
    else:
        out = (tpl.add(phase, "attn", _attn(d, sh, w, sh.tokens, None, True, False, d.window), deps),)
    if a2a > 1:
        out = a2a_in(tpl, phase, ("out",), (o_bytes(d, local, w),), out)
    return out


def core_backward_cp(tpl, d: LayerDims, deps: Deps, w: Widths | None = None) -> tuple[int, ...]:
    """The attention core's backward under context parallelism (module docstring)."""
    w = w or widths_of(d)
    if d.cp_comm == "allgather":
        return _allgather_backward(tpl, d, w, deps)
    a2a = d.cp_a2a
    sh, local = _shape(d, a2a), _shape(d, 1)
    if a2a > 1:
        deps = a2a_in(tpl, "bwd", ("dout",), (o_bytes(d, local, w),), deps)
    n = d.cp // a2a
    if n > 1:
        out = ring_backward(tpl, d, sh, w, n, "cp" if a2a == 1 else "cp_p2p", deps)
    else:
        out = (tpl.add("bwd", "attn", _attn(d, sh, w, sh.tokens, None, True, True, d.window), deps),)
    if a2a > 1:
        out = a2a_in(tpl, "bwd", ("dq", "dk", "dv"), (q_bytes(d, local, w), k_bytes(d, local, w),
                                                     v_bytes(d, local, w)), out)
    return out


def _gather_kv(tpl, phase: str, d: LayerDims, sh: CoreShape, w: Widths, deps: Deps) -> tuple[int, ...]:
    return tuple(tpl.add(phase, f"{K.CP_GATHER}_{t}", Collective("all_gather", "cp", d.cp * size, K.CP_GATHER), deps)
                 for t, size in (("k", k_bytes(d, sh, w)), ("v", v_bytes(d, sh, w))))


def _chunk_attn(d: LayerDims, sh: CoreShape, w: Widths, backward: bool) -> tuple[Attention, Attention]:
    """Rank 0's two chunks (0 and 2 cp - 1) against the gathered keys up to each chunk's end."""
    c = sh.tokens // 2
    return tuple(_attn(d, sh, w, c, (k + 1) * c, True, backward) for k in rank_chunks(0, d.cp))


def _allgather_forward(tpl, phase: str, d: LayerDims, w: Widths, deps: Deps) -> tuple[int, ...]:
    sh = _shape(d, 1)
    kv = _gather_kv(tpl, phase, d, sh, w, deps)
    return tuple(tpl.add(phase, f"attn_c{i}", a, kv + deps) for i, a in enumerate(_chunk_attn(d, sh, w, False)))


def _allgather_backward(tpl, d: LayerDims, w: Widths, deps: Deps) -> tuple[int, ...]:
    sh = _shape(d, 1)
    kv = _gather_kv(tpl, "bwd", d, sh, w, deps)
    attns = tuple(tpl.add("bwd", f"attn_c{i}", a, kv + deps) for i, a in enumerate(_chunk_attn(d, sh, w, True)))
    scatter = tuple(tpl.add("bwd", f"{K.CP_SCATTER}_{t}", Collective("reduce_scatter", "cp", d.cp * size,
                                                                     K.CP_SCATTER), attns)
                    for t, size in (("dk", k_bytes(d, sh, w)), ("dv", v_bytes(d, sh, w))))
    return attns + scatter
