"""Multi-head latent attention on one TP rank, as Megatron-Core's MLASelfAttention runs it (megatron/core/
transformer/multi_latent_attention.py at Megatron-LM d98e8a64).

Forward (L638-664, L766-880): the down projections are TE "duplicated" linears (L526-533, L573-580): every
TP rank computes them on its own tokens (s b / t under SP), q -> [T, q_lora_rank] and kv ->
[T, kv_lora_rank + qk_pos_emb_head_dim]; RMSNorms on the two latents; the up projections are
column-parallel over the heads, so under SP each latent (and the shared rotary key part, L755-758) is
all-gathered first (the region's entry operator of the duality table, applied per latent): q_up
[T, q_lora] x [q_lora, heads/t (qk_head_dim + rope)], kv_up [T, kv_lora] x [kv_lora, heads/t (qk_head_dim
+ v_head_dim)]; rotary embedding; the attention core with QK^T at qk_head_dim + rope and PV at v_head_dim;
the row-parallel output projection [heads/t v_head_dim] -> h and the exit operator. Without q_lora_rank a
plain column-parallel q projection on the gathered hidden states replaces q_down/q_norm/q_up.

Backward mirrors it; the duplicated down projections and latent norms hold partial gradients on each
TP rank (their inputs are sequence shards), summed over tp once per step like the other SP-replicated
parameters (`sp_params`).

FP8 (run.fp8): all five projections are Transformer Engine linears (q_down and kv_down TELinear, q_up and
kv_up TELayerNormColumnParallelLinear, proj TERowParallelLinear: Megatron-LM gpt_layer_specs.py
get_gpt_layer_with_transformer_engine_submodules L246-275, with qk_layernorm), so each runs its GEMMs in
FP8 with sim/schedule/fp8_ops.py's kernels as a dense layer's linears do: its input quantized (each down
projection quantizes ln1's output for itself), the up projections' latents quantized on the sequence shard
and all-gathered in FP8 under SP (and re-gathered for wgrad), dY quantized before dgrad / wgrad. The rotary
key part stays 16-bit; the attention core is FP8 with run.fp8_attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.sim.schedule import fp8_ops as fp8
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.cp_ops import Widths, core_backward_cp, core_forward_cp
from meshsim.sim.schedule.duality import region_boundaries
from meshsim.sim.schedule.elementwise_ops import (
    dropout_bwd,
    norm_bwd,
    norm_fwd,
    residual_fwd,
    residual_grad_add,
)
from meshsim.sim.schedule.layer_ops import comm_then_gemm, dgrad, gemm_then_comm, wgrad
from meshsim.sim.schedule.ops import Attention, Collective, Elementwise, Gemm
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.sim.schedule.template import Deps, Template

ROPE_KERNEL_PASSES = 2  # read + write of the rotary slices


@dataclass(frozen=True)
class MlaDims:
    """One TP rank's MLA widths (model.mla); `heads` is this rank's share."""

    heads: int
    q_lora: int | None
    kv_lora: int
    qk: int  # qk_head_dim (no position)
    rope: int  # qk_rope_head_dim
    v: int  # v_head_dim

    @property
    def q_width(self) -> int:
        return self.heads * (self.qk + self.rope)

    def down_params(self, h: int) -> int:
        """Duplicated (SP-replicated) parameters: q_down, kv_down and the two latent norms."""
        q = h * self.q_lora + self.q_lora if self.q_lora else 0
        return q + h * (self.kv_lora + self.rope) + self.kv_lora

    def linear_weights(self, h: int) -> int:
        """Weights of the five projections on this rank (no norms): what FP8 quantizes and caches."""
        q = h * self.q_lora + self.q_lora * self.q_width if self.q_lora else h * self.q_width
        return q + h * (self.kv_lora + self.rope) + self.kv_lora * self.heads * (self.qk + self.v) \
            + self.heads * self.v * h

    def layer_params(self, h: int) -> int:
        """All attention parameters of one layer on this rank (norm ln1 not included)."""
        q_up = (self.q_lora or h) * self.q_width
        kv_up = self.kv_lora * self.heads * (self.qk + self.v)
        return self.down_params(h) + q_up + kv_up + self.heads * self.v * h


def _norm(d: LayerDims, width: int, backward: bool) -> Elementwise:
    """RMSNorm over T latent rows of `width`."""
    n = d.tokens_out * width * d.dtype_bytes
    return Elementwise("rmsnorm_bwd", 2 * n, n) if backward else Elementwise("rmsnorm", n, n)


def _entry(d: LayerDims, width: int, phase: str, purpose: str) -> Collective | None:
    """The region's entry operator on a [s, b, width] latent (all-gather under SP; f otherwise)."""
    op = region_boundaries(d.sp)[0].op(phase)
    if op.value == "identity" or d.tp == 1:
        return None
    return Collective(op.value, "tp", d.tokens * width * d.dtype_bytes, purpose)


def _core(d: LayerDims, a: MlaDims, backward: bool) -> Attention:
    return Attention(d.micro_batch, a.heads, a.heads, d.seq, a.qk + a.rope, True, backward,
                     backward and d.deterministic, d.window, a.v, fp8=d.fp8.attention, dropout=d.dropout)


def core_forward(tpl: Template, phase: str, d: LayerDims, a: MlaDims, deps: Deps) -> tuple[int, ...]:
    """The core's forward: one Attention, or context parallelism's (sim/schedule/cp_ops.py) with Q and K
    qk + rope wide and V v wide."""
    if d.cp > 1:
        return core_forward_cp(tpl, phase, d, deps, Widths(a.qk + a.rope, a.v))
    return (tpl.add(phase, "attn", _core(d, a, False), deps),)


def core_backward(tpl: Template, d: LayerDims, a: MlaDims, deps: Deps) -> tuple[int, ...]:
    """The core's backward (as core_forward); returns what the gradients of Q, K and V depend on."""
    if d.cp > 1:
        return core_backward_cp(tpl, d, deps, Widths(a.qk + a.rope, a.v))
    return (tpl.add("bwd", "attn", _core(d, a, True), deps),)


def _rope(d: LayerDims, a: MlaDims) -> Elementwise:
    n = d.tokens * (a.heads + 1) * a.rope * d.dtype_bytes
    return Elementwise("mla_rope", n, n)


def _up_gemms(d: LayerDims, a: MlaDims) -> tuple[Gemm, Gemm]:
    return (Gemm(d.tokens, a.q_width, a.q_lora or d.hidden, fp8=d.fp8.on),
            Gemm(d.tokens, a.heads * (a.qk + a.v), a.kv_lora, fp8=d.fp8.on))


def _down_gemm(d: LayerDims, width: int) -> Gemm:
    return Gemm(d.tokens_out, width, d.hidden, fp8=d.fp8.on)


def _up_projection(tpl: Template, phase: str, d: LayerDims, key: str, width: int, gemm: Gemm, deps: Deps
                   ) -> tuple[int, ...]:
    """One up projection on a [T, width] latent: quantized on its shard (FP8), the entry operator (an FP8
    all-gather under SP), the GEMM; returns the GEMM."""
    x = fp8.quantize(tpl, phase, d, key, d.tokens_out * width, d.sp, deps, d.fp8.wgrad)
    part = "_q" if key in ("q_up", "q_proj") else "_kv"
    return comm_then_gemm(tpl, phase, K.ATTN_IN + part, fp8.fp8_gather(d, _entry(d, width, phase, K.ATTN_IN)), key,
                          gemm, x, 1)[1]


def up_projections(tpl: Template, phase: str, d: LayerDims, a: MlaDims) -> int:
    """The query and key-value up projections (with their entry operators on the latents, and the rotary
    key part's) and RoPE: what selective recompute of mla_up_proj re-runs before the attention backward."""
    q_up, kv_up = _up_gemms(d, a)
    q = _up_projection(tpl, phase, d, "q_up" if a.q_lora else "q_proj", a.q_lora or d.hidden, q_up, ())
    rope_in = _entry(d, a.rope, phase, K.ATTN_IN)
    rope_dep = (tpl.add(phase, K.ATTN_IN + "_rope", rope_in, ()),) if rope_in is not None else ()
    kv = _up_projection(tpl, phase, d, "kv_up", a.kv_lora, kv_up, ())
    return tpl.add(phase, "rope", _rope(d, a), q + kv + rope_dep)


def mla_forward(tpl: Template, phase: str, d: LayerDims, a: MlaDims, inp: Deps) -> int:
    ln = tpl.add(phase, "ln1", norm_fwd(d), inp)
    q_up, kv_up = _up_gemms(d, a)
    if a.q_lora:
        x = fp8.quantize(tpl, phase, d, "q_down", d.tokens_out * d.hidden, False, (ln,), d.fp8.wgrad)
        qd = tpl.add(phase, "q_down", _down_gemm(d, a.q_lora), x)
        qn = tpl.add(phase, "q_norm", _norm(d, a.q_lora, False), (qd,))
        q = _up_projection(tpl, phase, d, "q_up", a.q_lora, q_up, (qn,))
    else:
        q = _up_projection(tpl, phase, d, "q_proj", d.hidden, q_up, (ln,))
    x = fp8.quantize(tpl, phase, d, "kv_down", d.tokens_out * d.hidden, False, (ln,), d.fp8.wgrad)
    kvd = tpl.add(phase, "kv_down", _down_gemm(d, a.kv_lora + a.rope), x)
    kvn = tpl.add(phase, "kv_norm", _norm(d, a.kv_lora, False), (kvd,))
    rope_in = _entry(d, a.rope, phase, K.ATTN_IN)
    rope_dep = (tpl.add(phase, K.ATTN_IN + "_rope", rope_in, (kvd,)),) if rope_in is not None else ()
    kv = _up_projection(tpl, phase, d, "kv_up", a.kv_lora, kv_up, (kvn,))
    r = tpl.add(phase, "rope", _rope(d, a), q + kv + rope_dep)
    core = core_forward(tpl, phase, d, a, (r,))
    exit_ = region_boundaries(d.sp)[1]
    proj = Gemm(d.tokens, d.hidden, a.heads * a.v, fp8=d.fp8.on)
    coll = exit_.op("fwd")
    x = fp8.quantize(tpl, phase, d, "proj", d.tokens * a.heads * a.v, False, core, d.fp8.wgrad)
    out = gemm_then_comm(tpl, phase, "proj", proj, x, K.ATTN_OUT,
                         None if coll.value == "identity" or d.tp == 1 else Collective(coll.value, "tp", d.act_bytes,
                                                                                       exit_.name), 1)
    return tpl.add(phase, "attn_res", residual_fwd(d), out + tuple(inp))


def _wgrad(tpl: Template, d: LayerDims, key: str, g: Gemm, deps: Deps) -> int:
    w = tpl.add("bwd", f"{key}_wgrad", wgrad(g, d.grad_fusion, d.fp8.on and d.fp8.wgrad, d.main_grad_bytes), deps)
    tpl.grads.append((w, g.k * g.n))
    return w


def _up_backward(tpl: Template, d: LayerDims, key: str, g: Gemm, width: int, deps: Deps) -> tuple[int, ...]:
    """dgrad, the entry operator's backward (reduce-scatter under SP) and wgrad (after an SP re-gather of
    the latent, in FP8 when the layer is) of one up projection; returns what the latent's gradient depends on."""
    dy = fp8.quantize(tpl, "bwd", d, key, d.tokens * g.n, False, deps, d.fp8.wgrad)
    fwd_entry = _entry(d, width, "fwd", K.SP_REGATHER)
    regather = (tpl.add("bwd", f"{key}{K.REGATHER}", fp8.fp8_gather(d, fwd_entry), deps),) if d.sp and fwd_entry \
        else ()
    regather = fp8.transpose_after_gather(tpl, d, key, d.tokens * width, regather) if regather else ()
    ready = gemm_then_comm(tpl, "bwd", f"{key}_dgrad", dgrad(g), dy, f"{K.ATTN_IN}_{key}",
                           _entry(d, width, "bwd", K.ATTN_IN), 1)
    _wgrad(tpl, d, key, g, dy + regather)
    return ready


def mla_backward(tpl: Template, d: LayerDims, a: MlaDims, gin: Deps) -> int:
    """Backward of mla_forward. Recompute of `layernorm` re-runs ln1 first (MLA's input norm is its own
    module, its output the down projections' weight gradients read; sim/schedule/shapes.RECOMPUTE_MODULES)."""
    if d.recomputes("layernorm"):
        tpl.add("recompute", "ln1", norm_fwd(d), gin)
    g: Deps = (tpl.add("bwd", "attn_res", dropout_bwd(d), gin),) if d.dropout else gin
    exit_ = region_boundaries(d.sp)[1]
    bop = exit_.op("bwd")
    coll = None if bop.value == "identity" or d.tp == 1 else Collective(bop.value, "tp", d.act_bytes, exit_.name)
    proj = Gemm(d.tokens, d.hidden, a.heads * a.v, fp8=d.fp8.on)
    g = fp8.quantize(tpl, "bwd", d, "proj", d.tokens_out * d.hidden, d.sp, g, d.fp8.wgrad)
    cs, dg = comm_then_gemm(tpl, "bwd", K.ATTN_OUT, fp8.fp8_gather(d, coll, both_copies=True), "proj_dgrad",
                            dgrad(proj), g, 1)
    _wgrad(tpl, d, "proj", proj, fp8.transpose_after_gather(tpl, d, "proj", d.tokens * d.hidden, cs or g))
    if d.recomputes("mla_up_proj"):  # the up projections and RoPE again (sim/schedule/shapes.RECOMPUTE_MODULES)
        up_projections(tpl, "recompute", d, a)
    if d.recomputes("core_attn"):  # the attention core's forward runs again first
        core_forward(tpl, "recompute", d, a, ())
    core = core_backward(tpl, d, a, dg)
    r = tpl.add("bwd", "rope", _rope(d, a), core)
    q_up, kv_up = _up_gemms(d, a)
    q = _up_backward(tpl, d, "q_up" if a.q_lora else "q_proj", q_up, a.q_lora or d.hidden, (r,))
    kv = _up_backward(tpl, d, "kv_up", kv_up, a.kv_lora, (r,))
    rope_b = _entry(d, a.rope, "bwd", K.ATTN_IN)
    rope = (tpl.add("bwd", K.ATTN_IN + "_rope", rope_b, (r,)),) if rope_b is not None else ()
    parts: list[int] = []
    if a.q_lora:
        qn = tpl.add("bwd", "q_norm", _norm(d, a.q_lora, True), q)
        qd = _down_gemm(d, a.q_lora)
        dy = fp8.quantize(tpl, "bwd", d, "q_down", d.tokens_out * a.q_lora, False, (qn,), d.fp8.wgrad)
        parts.append(tpl.add("bwd", "q_down_dgrad", dgrad(qd), dy))
        _wgrad(tpl, d, "q_down", qd, dy)
    else:
        parts += list(q)
    kvn = tpl.add("bwd", "kv_norm", _norm(d, a.kv_lora, True), kv)
    kvd = _down_gemm(d, a.kv_lora + a.rope)
    dy = fp8.quantize(tpl, "bwd", d, "kv_down", d.tokens_out * (a.kv_lora + a.rope), False, (kvn,) + rope,
                      d.fp8.wgrad)
    parts.append(tpl.add("bwd", "kv_down_dgrad", dgrad(kvd), dy))
    _wgrad(tpl, d, "kv_down", kvd, dy)
    n = d.tokens_out * d.hidden * d.dtype_bytes
    total = tpl.add("bwd", "mla_grad_add", Elementwise("mla_grad_add", len(parts) * n, n), tuple(parts))
    ln = tpl.add("bwd", "ln1", norm_bwd(d), (total,))
    return tpl.add("bwd", "ln1_grad_add", residual_grad_add(d), (ln, *gin))


def mla_dims(d: LayerDims, mla) -> MlaDims:
    """MlaDims of model.mla on a rank holding d.heads heads."""
    return MlaDims(d.heads, mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim, mla.qk_rope_head_dim, mla.v_head_dim)

