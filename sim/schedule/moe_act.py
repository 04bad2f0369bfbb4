"""The routed experts' activation x routing probability (Megatron-Core TEGroupedMLP, megatron/core/transformer/
moe/experts.py at Megatron-LM d98e8a64, bias_act_func L945-1017): which kernels it runs and what each moves.

Gated experts (SwiGLU, quick-GEGLU) run one fused kernel that applies the probability too
(weighted_bias_swiglu_impl / weighted_bias_quick_geglu_impl; Megatron's training arguments enable
bias_swiglu_fusion by default). A non-gated activation (GELU; squared ReLU unless
use_fused_weighted_squared_relu, default False) has no fused kernel (with bias_activation_fusion set it
raises "Only support fusion of swiglu and quick_gelu"), so eager PyTorch runs act(x), x * probs and
.to(dtype) as three kernels, and autograd runs their conjugates: `_act_unfused` counts their bytes.

The clamp of --activation-func-clamp-value is fused into SwiGLU's kernel (WeightedSwiGLUFunction takes
clamp_value) but not into quick-GEGLU's: weighted_bias_quick_geglu_impl (megatron/core/fusions/
fused_bias_geglu.py L410-431 at d98e8a64) first runs, eagerly, gate.clamp(max=c), up.clamp(-c, c) and
torch.cat of the two, then the fused kernel on the copy (`_clamp_kernels`). It runs inside the checkpointed
activation, so recompute of moe_act runs it again; without that recompute the fused function keeps the
clamped copy for backward (sim/cost/layer_memory.py).
"""

from __future__ import annotations

from meshsim.sim.schedule.model_family import is_gated
from meshsim.sim.schedule.moe_shapes import PROB_BYTES, MoeDims
from meshsim.sim.schedule.ops import Elementwise
from meshsim.sim.schedule.template import Deps, Template


def act_kernel(m: MoeDims, rows: int, fc1_n: int, ffn: int, backward: bool, probs: bool) -> Elementwise:
    """Expert activation (x its routing probability for routed experts) as one fused kernel (Megatron's
    weighted_bias_swiglu_impl / weighted_bias_quick_geglu_impl, experts.py TEGroupedMLP bias_act_func):
    read fc1 output, write ffn."""
    inp, out = rows * fc1_n * m.dtype_bytes, rows * ffn * m.dtype_bytes
    p = rows * PROB_BYTES if probs else 0
    if backward:
        return Elementwise(f"{m.mlp}_bwd", inp + out + p, inp + p)
    return Elementwise(m.mlp, inp + p, out)


def _act_unfused(m: MoeDims, rows: int, backward: bool) -> tuple[tuple[str, Elementwise], ...]:
    """A non-gated expert activation x probability in eager PyTorch, as TEGroupedMLP runs it when no fused
    kernel exists (experts.py bias_act_func at Megatron-LM d98e8a64 L1012-1016: only SwiGLU / quick-GEGLU
    fuse the probability; GELU experts raise if bias_activation_fusion is set): act(x), then x * probs with
    the fp32 probabilities (type promotion: an fp32 product), then .to(model dtype). Per element of the
    [rows, ffn] tensor, with a = dtype bytes, q = 4 (fp32):
      forward   act: a + a; multiply: a + q (+ probs); cast: q + a
      backward  cast: a + q; d input = g p: q + q (+ probs), cast to a: q + a; d probs = sum(g x): q + a + q,
                reduce: q (+ probs); act: a + a + a
    (the current model's fused kernel: forward a + a, backward 3 a)."""
    n, a, q = rows * m.ffn, m.dtype_bytes, PROB_BYTES
    p = rows * PROB_BYTES
    if not backward:
        return (("expert_act", Elementwise(m.mlp, n * a, n * a)),
                ("expert_act_probs", Elementwise("moe_probs_mul", n * a + p, n * q)),
                ("expert_act_cast", Elementwise("cast", n * q, n * a)))
    return (("expert_act_cast", Elementwise("cast", n * a, n * q)),
            ("expert_act_probs", Elementwise("moe_probs_mul_bwd", n * q + p, n * q)),
            ("expert_act_probs_cast", Elementwise("cast", n * q, n * a)),
            ("expert_act_probs_grad", Elementwise("moe_probs_mul_bwd", n * (q + a), n * q)),
            ("expert_act_probs_sum", Elementwise("reduce_sum", n * q, p)),
            ("expert_act", Elementwise(f"{m.mlp}_bwd", 2 * n * a, n * a)))


def _clamp_kernels(m: MoeDims, backward: bool) -> tuple[tuple[str, Elementwise], ...]:
    """quick-GEGLU's eager clamp (module docstring) over the [rows, 2 f] fc1 output, n = rows f a bytes per
    half. Forward: the two clamps read and write each half (2n + 2n), torch.cat copies both (2n + 2n).
    Backward (autograd): each clamp's gradient reads its gradient and its saved input and writes a gradient
    (4n read, 2n written), and chunk's backward concatenates the two halves (2n + 2n)."""
    n = m.expert_rows * m.ffn * m.dtype_bytes
    if backward:
        return (("expert_act_clamp", Elementwise("clamp_bwd", 4 * n, 2 * n)),
                ("expert_act_clamp_cat", Elementwise("cat", 2 * n, 2 * n)))
    return (("expert_act_clamp", Elementwise("clamp", 2 * n, 2 * n)),
            ("expert_act_clamp_cat", Elementwise("cat", 2 * n, 2 * n)))


def expert_act(tpl: Template, phase: str, m: MoeDims, deps: Deps, backward: bool) -> int:
    """The routed experts' activation x probability: one fused kernel for gated MLPs (after quick-GEGLU's
    eager clamp in forward, before its backward), else the eager chain (_act_unfused), each kernel after
    the previous one; returns the last op."""
    if is_gated(m.mlp):
        clamp = _clamp_kernels(m, backward) if m.eager_clamp else ()
        if not backward:
            for suffix, work in clamp:
                deps = (tpl.add(phase, suffix, work, deps),)
        last = tpl.add(phase, "expert_act", act_kernel(m, m.expert_rows, m.fc1_n, m.ffn, backward, True), deps)
        if backward:
            for suffix, work in clamp:
                last = tpl.add(phase, suffix, work, (last,))
        return last
    for suffix, work in _act_unfused(m, m.expert_rows, backward):
        deps = (tpl.add(phase, suffix, work, deps),)
    return deps[0]
