"""Memory per GPU: model states + activations of one in-flight micro-batch + a fixed workspace (GB = 1e9 B).

Parameters per rank (sim/layer_ops.LayerDims): per layer the TP shards of qkv (GQA: this rank's query
heads plus max(1, kv_heads/t) KV heads, replicated when kv_heads < t), proj, fc1 (swiglu: gate+up),
fc2, their biases (gelu/GPT family; row-parallel biases replicated), and two replicated norms; plus the
vocab-parallel embedding and output layer (vocab padded to 128 t; the output layer shares the
embedding when tied) and the final norm.

Model states (Megatron mixed precision): bf16 weights 2 B/param; fp32 main gradients 4 B/param (bf16
training accumulates and reduces gradients in fp32; wgrad GEMMs accumulate straight into them, so no
bf16 gradient copy exists); Adam 12 B/param (fp32 master weight + two fp32 moments), divided by dp
with the distributed optimizer.

Activations (Korthikanti et al. 2022, 16-bit activations, 1-byte dropout masks), per layer per token:
  outside TP regions (/t under SP): ln1 input 2h, qkv input 2h, attention dropout mask h, ln2 input 2h,
      fc1 input 2h, MLP dropout mask h                                       -> 10h (8h without dropout)
  inside (this rank's shard): Q 2 a_t d, K and V 2 kv_t d each, proj input 2 a_t d,
      gelu: fc1 output 2 f_t + gelu output 2 f_t; swiglu: gate+up 4 f_t + swiglu output 2 f_t
      (MHA, gelu, f = 4h: 24h/t)
  scores (unfused attention, no selective recompute): softmax output 2, dropout mask 1, dropout
      output 2 bytes per score, a_t s scores per token                         -> 5 a s / t
  Summed over s b tokens this is sbh(10 + 24/t + 5as/(ht)) for TP and (sbh/t)(34 + 5as/h) with SP.
  Flash attention never stores the scores (its per-row softmax statistics, 4 a_t bytes per token, are
  neglected). Full recompute keeps each layer's input (2sbh, /t under SP) plus, while one layer is being
  recomputed, that layer's full activations (Korthikanti's 2sbhL omits this one-layer working set).
Gradient accumulation frees a micro-batch's activations after its backward: one micro-batch in flight.
Head: embedding dropout mask sbh, final-norm input 2sbh, logits-GEMM input 2sbh (all /t under SP) and
the fp32 logits/softmax the cross-entropy keeps, 4 s b V_pad / t.

Workspace 1.0 GB: CUDA context (~0.5 GB), NCCL buffers for the tp and dp communicators (4 MiB Simple +
LL128 + LL buffers per channel, ~10 MiB x up to 32 channels each, ~0.3-0.6 GB), cuBLAS workspace.
An estimate; allocator fragmentation is not modeled.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.core.units import BF16_BYTES, FP32_BYTES, GB
from meshsim.sim.schedule.shapes import LayerDims, layer_dims

WEIGHT_BYTES = BF16_BYTES
GRAD_BYTES = FP32_BYTES
ADAM_BYTES = 12
WORKSPACE_GB = 1.0


@dataclass(frozen=True)
class MemoryBreakdown:
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    workspace_gb: float
    total_gb: float
    capacity_gb: float
    fits: bool


def params_per_rank(rs: ResolvedScenario) -> int:
    """Parameters held by one rank (its TP shard, replicated pieces included; before DP sharding)."""
    d = layer_dims(rs)
    table = d.vocab * d.hidden
    head = table if rs.scenario.model.tied_embeddings else 2 * table
    return rs.scenario.model.layers * d.layer_params + head + d.norm_params


def layer_activation_bytes(d: LayerDims, recompute: str | None = None) -> int:
    """Bytes one layer keeps for backward for one micro-batch (recompute 'none' | 'selective')."""
    recompute = d.recompute if recompute is None else recompute
    h, masks = d.hidden, (2 * d.hidden if d.dropout else 0)
    outside = 8 * h + masks  # per token_out (sequence-sharded under SP)
    attn = 2 * (2 * d.heads + 2 * d.kv_heads) * d.head_dim
    mlp = 2 * d.fc1_n + 2 * d.ffn  # fc1 output (gate+up when gated) and the activation output
    scores = 0
    if not d.flash and recompute == "none":
        scores = (5 if d.dropout else 2) * d.heads * d.seq
    return d.tokens_out * outside + d.tokens * (attn + mlp + scores)


def activation_bytes(rs: ResolvedScenario) -> int:
    """All layers plus embedding/head, one micro-batch in flight."""
    d = layer_dims(rs)
    layers = rs.scenario.model.layers
    if d.recompute == "full":
        per_input = d.tokens_out * d.hidden * d.dtype_bytes
        body = layers * per_input + layer_activation_bytes(d, "none")
    else:
        body = layers * layer_activation_bytes(d)
    sharded = d.tokens_out * d.hidden
    head = sharded * (1 if d.dropout else 0) + 2 * sharded * d.dtype_bytes + 4 * d.tokens * d.vocab
    return body + head


def memory_per_gpu(rs: ResolvedScenario) -> MemoryBreakdown:
    params = params_per_rank(rs)
    p = rs.scenario.parallel
    shard = rs.dp if p.distributed_optimizer else 1
    weights = params * WEIGHT_BYTES / GB
    grads = params * GRAD_BYTES / GB
    optimizer = params * ADAM_BYTES / shard / GB
    acts = activation_bytes(rs) / GB
    total = weights + grads + optimizer + acts + WORKSPACE_GB
    return MemoryBreakdown(weights, grads, optimizer, acts, WORKSPACE_GB, total, rs.gpu.mem_gb,
                           total <= rs.gpu.mem_gb)
