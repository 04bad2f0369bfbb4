"""cuDNN's deterministic attention backward: dS through an HBM workspace, dQ as a matmul of its own.

Which path runs (NVIDIA/cudnn-frontend @3929da2, include/cudnn_frontend/node/
scaled_dot_product_flash_attention.h, the SDPA backward node): "Force dP workspace implementation if ...
the user force requests deterministic algorithm" - `is_deterministic_algorithm` sets `use_dp_workspace`
whatever the sequence length (the 256 MB CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT applies only to the
non-deterministic choice). Transformer Engine asks for it under NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
(Megatron's --deterministic-mode): TE @d0067d0 common/fused_attn/fused_attn_f16_arbitrary_seqlen.cu,
`sdpa_backward_options.set_deterministic_algorithm(deterministic)`. With the dP workspace the graph does
not accumulate dQ in an fp32 buffer with atomics: the scaled dS of the fused kernel is kept and dQ is the
plain matmul `matmul_dS_K` (dS over all s_kv keys, no mask attribute) writing dQ directly. The FE sizes
the workspace dense:

    W = batch x heads_q x ceil64(s_q) x ceil64(s_kv) x 2 bytes          (dp_workspace_bytes)

What that costs against the non-deterministic kernel of time T (the attention rate model):

    T_det = T x (1 - 1/5)                      the fused kernel without the dQ product (1 of the 5 products
                                               of a flash backward: S, dP, dV, dK, dQ)
          + W / bw                             the fused kernel writes dS, the whole workspace (a plain
                                               matmul over all keys reads the masked tiles too, so they
                                               hold zeros)
          + max(2 b h s_q s_kv d / (peak x gemm ceiling), (W + K + dQ bytes) / bw)
                                               the dQ matmul; at d = 128 it is memory-bound on every GPU
          + W / bw when run.deterministic fills fresh memory (TE allocates the cuDNN workspace with
                                               at::empty, pytorch/csrc/common.cpp allocateSpace, and
                                               PyTorch's deterministic mode NaN-fills it:
                                               sim/cost/deterministic_fill.py)
          + the launches of the matmul and the fill

bw = HBM bandwidth x mem_bw_efficiency (the streaming rate of GEMM operands and of the fill). Fitted on
nothing. It replaces the assumed 1.25x (hardware.compute.deterministic_attention_slowdown) for 16-bit
cuDNN backwards; the FP8 backward (a different cuDNN node, sdpa_fp8_bwd.h) keeps that knob.
"""

from __future__ import annotations

from meshsim.sim.core.units import BF16_BYTES

DQ_PRODUCT_SHARE = 1.0 / 5.0  # dQ = dS K: one of a flash backward's five products (ops.Attention: 2.5x forward)
WORKSPACE_ROUND = 64  # the FE rounds s_q and s_kv up to 64 when it sizes the dP workspace


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def dp_workspace_bytes(batch: int, heads: int, seq_q: int, seq_kv: int) -> int:
    """W: the dense 16-bit dS workspace of the deterministic backward (module docstring)."""
    return batch * heads * _round_up(seq_q, WORKSPACE_ROUND) * _round_up(seq_kv, WORKSPACE_ROUND) * BF16_BYTES


def dq_matmul_flops(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int) -> float:
    """FLOPs of the dense dQ = dS K matmul over every key (2 b h s_q s_kv d)."""
    return 2.0 * batch * heads * seq_q * seq_kv * head_dim


def dq_matmul_bytes(batch: int, heads: int, kv_heads: int, seq_q: int, seq_kv: int, head_dim: int) -> int:
    """Bytes the dQ matmul moves: the workspace, K (its KV heads) and the 16-bit dQ."""
    k_bytes = batch * kv_heads * seq_kv * head_dim * BF16_BYTES
    dq_bytes = batch * heads * seq_q * head_dim * BF16_BYTES
    return dp_workspace_bytes(batch, heads, seq_q, seq_kv) + k_bytes + dq_bytes


def deterministic_backward_s(nondeterministic_s: float, batch: int, heads: int, kv_heads: int, seq_q: int,
                             seq_kv: int, head_dim: int, *, bw_bytes_s: float, gemm_flops_s: float,
                             fill: bool, launch_s: float) -> float:
    """T_det of the module docstring from the non-deterministic kernel's time T (launch included)."""
    workspace = dp_workspace_bytes(batch, heads, seq_q, seq_kv)
    fused = nondeterministic_s * (1.0 - DQ_PRODUCT_SHARE) + workspace / bw_bytes_s
    matmul = max(dq_matmul_flops(batch, heads, seq_q, seq_kv, head_dim) / gemm_flops_s,
                 dq_matmul_bytes(batch, heads, kv_heads, seq_q, seq_kv, head_dim) / bw_bytes_s) + launch_s
    filled = workspace / bw_bytes_s + launch_s if fill else 0.0
    return fused + matmul + filled
