"""The routed experts' fc2 bias, as Megatron-Core adds it: eagerly, one expert at a time.

TEGroupedMLP builds fc2 with skip_bias_add=True and adds the returned per-expert biases itself, scaled by
each row's routing probability (megatron/core/transformer/moe/experts.py `_apply_bias`, L345-380 at
Megatron-LM d98e8a64; since a329dd6d, 2025-09-22, "Enable bias in expert mlp [gpt-oss 5/5]"):

    cat([t + b * p for t, b, p in zip(split(out, tokens_per_expert), biases, split(probs, ...))]).to(dtype)

fc1's bias is different: fc1 keeps skip_bias_add=False, so Transformer Engine adds it in the grouped GEMM's
epilogue and computes its gradient with the weight gradient (no kernel of its own). The packed path
(`_apply_packed_bias`, one repeat_interleave) needs --moe-use-grouped-tensor (default off) and the TE op
fuser path needs --use-transformer-engine-op-fuser (default off); neither is modeled.

Bytes, per element of the [rows, h] fc2 output (n = rows x h elements), a = model dtype bytes, q = 4: the
probabilities are fp32, so b * p and everything after it is fp32 until the final cast.
  forward   b * p: write q (E kernels); t + b p: read a + q, write q (E); cat: q + q; .to(dtype): q + a
  backward  .to's gradient: a + q; cat's: views; per expert, the input's gradient cast back to the
            model dtype: q + a (E); d b = sum_rows(g p): g p read q, write q, then the sum reads q (E each);
            d p = sum_h(g b): the same (E each); split's gradient concatenates the input's: a + a
Total 6q + 2a forward and 8q + 4a backward per element (28 and 40 bytes in bf16). E = local experts: the
per-expert kernels launch E times, which `host_calls` counts (sim/cost/host_dispatch.py).
"""

from __future__ import annotations

from meshsim.sim.schedule.moe_shapes import PROB_BYTES, MoeDims
from meshsim.sim.schedule.ops import Elementwise
from meshsim.sim.schedule.template import Deps, Template


def _forward_kernels(m: MoeDims) -> tuple[tuple[str, Elementwise, int], ...]:
    """(key, kernel, host calls) of the forward, in issue order (module docstring)."""
    n, a, q, e = m.expert_rows * m.hidden, m.dtype_bytes, PROB_BYTES, m.local_experts
    rows_p, biases = m.expert_rows * q, e * m.hidden * a
    return (("expert_fc2_bias_scale", Elementwise("moe_bias_scale", biases + rows_p, n * q), 2 + e),
            ("expert_fc2_bias_add", Elementwise("moe_bias_add", n * (a + q), n * q), e),
            ("expert_fc2_bias_cat", Elementwise("cat", n * q, n * q), 2),
            ("expert_fc2_bias_cast", Elementwise("cast", n * q, n * a), 2))


def _backward_kernels(m: MoeDims) -> tuple[tuple[str, Elementwise, int], ...]:
    """(key, kernel, host calls) of the backward, in the order autograd reaches them (module docstring)."""
    n, a, q, e = m.expert_rows * m.hidden, m.dtype_bytes, PROB_BYTES, m.local_experts
    rows_p, biases = m.expert_rows * q, e * m.hidden * q
    return (("expert_fc2_bias_cast_bwd", Elementwise("cast", n * a, n * q), 2),
            ("expert_fc2_bias_dbias", Elementwise("moe_bias_bwd", 2 * n * q + rows_p, n * q + biases), 3 * e),
            ("expert_fc2_bias_dprobs", Elementwise("moe_bias_bwd", 2 * n * q + e * m.hidden * a, n * q + rows_p),
             2 * e),
            ("expert_fc2_bias_dx", Elementwise("cast", n * q, n * a), e),
            ("expert_fc2_bias_split_bwd", Elementwise("cat", n * a, n * a), 2))


def _chain(tpl: Template, phase: str, kernels: tuple[tuple[str, Elementwise, int], ...], deps: Deps) -> Deps:
    """Add `kernels` in order, each after the previous one; returns the last one's deps."""
    for key, work, calls in kernels:
        deps = (tpl.add(phase, key, work, deps, host_calls=calls),)
    return deps


def fc2_bias_forward(tpl: Template, phase: str, m: MoeDims, deps: Deps) -> Deps:
    """The eager bias after fc2 when the experts have biases (else nothing); returns the new deps."""
    return _chain(tpl, phase, _forward_kernels(m), deps) if m.bias else deps


def fc2_bias_backward(tpl: Template, m: MoeDims, deps: Deps) -> Deps:
    """Its backward, before fc2's (else nothing); returns the new deps."""
    return _chain(tpl, "bwd", _backward_kernels(m), deps) if m.bias else deps


def _moved(kernels: tuple[tuple[str, Elementwise, int], ...]) -> int:
    return sum(work.bytes_read + work.bytes_written for _, work, _ in kernels)


def fc2_bias_bytes(m: MoeDims) -> tuple[int, int]:
    """(forward, backward) bytes the eager bias moves, 0 without biases: (6q + 2a) n and (8q + 4a) n plus
    the biases and probabilities (for tests and docs)."""
    if not m.bias:
        return 0, 0
    return _moved(_forward_kernels(m)), _moved(_backward_kernels(m))
