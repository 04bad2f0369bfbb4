"""Deterministic mode's fill of freshly allocated tensors: what it adds to a compute op.

Megatron-LM's --deterministic-mode calls ``torch.use_deterministic_algorithms(True)``
(megatron/training/determinism.py, ``apply_determinism_to_args``, NVIDIA/Megatron-LM d98e8a64, the commit
of the CI golden values). With deterministic algorithms on, PyTorch fills the memory of every tensor
created by ``torch.empty`` / ``empty_like`` / ``empty_strided`` (and grown by ``resize_``) on the device
with NaN (integers: their maximum) before returning it, as long as
``torch.utils.deterministic.fill_uninitialized_memory`` is True, which is its default (PyTorch >= 2.1:
torch/utils/deterministic.py; the fill is in the CUDA ``empty`` factories, aten/src/ATen/native/cuda/
TensorFactories.cu, so it also reaches the outputs Transformer Engine's C++ extensions allocate with
``at::empty``). The PyTorch documentation of ``torch.use_deterministic_algorithms`` says this costs
performance. (PyTorch's repository is above the snapshot limit of this project's source fetcher; cited
from its documentation and layout, not read at a commit here.)

So in deterministic mode every kernel that writes a new output first has that output written by a
fill kernel: one more pass of pure writes over the output bytes at HBM write bandwidth, plus one more
kernel launch:

    fill_s(work) = fill_bytes(work) / (bw x mem_bw_eff) + launch        (0 when fill_bytes = 0)

fill_bytes(work), the bytes of the fresh outputs of one op:
- Gemm: m n batch x 2 (a new 16-bit C); 0 when the GEMM accumulates into the fp32
  or a bf16 one (out_bytes > 2: C += X^T dY, no allocation);
- Attention: forward O (batch heads seq v_dim x 2) and the fp32 softmax statistics (batch heads seq x 4);
  backward dQ (batch heads seq d x 2), dK and dV (batch kv_heads seq (d + v_dim) x 2);
- Elementwise: bytes_written, except the in-place kernels of IN_PLACE_KERNELS;
- OptimizerStep: 0 (updates its states in place).
"""

from __future__ import annotations

from meshsim.sim.core.units import BF16_BYTES, FP32_BYTES
from meshsim.sim.schedule.ops import Attention, Elementwise, Gemm, Work

# Elementwise kernels that write into tensors that already exist: the fp32 main-grad accumulation
# (main_grad.add_ in Megatron's DDP hooks) and the cross-entropy's exp and softmax, which Megatron's
# VocabParallelCrossEntropy computes in place on its fp32 logits (logits -= max; torch.exp(logits,
# out=logits); exp_logits.div_(sum), megatron/core/tensor_parallel/cross_entropy.py @d98e8a64; the
# fp32 copy itself, xent_max's .float(), and the backward's cast to bf16 are fresh tensors).
IN_PLACE_KERNELS = frozenset({"main_grad_add", "xent_exp", "xent_loss"})


def fill_bytes(work: Work) -> int:
    """Bytes of the fresh outputs `work` allocates (module docstring); 0 for other works."""
    if isinstance(work, Gemm):
        return 0 if work.out_bytes > BF16_BYTES else work.m * work.n * work.batch * BF16_BYTES  # > 2: C += ...
    if isinstance(work, Attention):
        v_dim = work.v_head_dim or work.head_dim
        rows_q = work.batch * work.heads * work.seq
        if work.backward:
            rows_kv = work.batch * work.kv_heads * work.seq
            return rows_q * work.head_dim * BF16_BYTES + rows_kv * (work.head_dim + v_dim) * BF16_BYTES
        return rows_q * (v_dim * BF16_BYTES + FP32_BYTES)
    if isinstance(work, Elementwise):
        return 0 if work.kernel in IN_PLACE_KERNELS else work.bytes_written
    return 0
