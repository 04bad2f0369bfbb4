"""Memory per GPU: model states + activations of one in-flight micro-batch + a fixed workspace (GB = 1e9 B).

Parameters per rank (sim/layer_ops.LayerDims): per layer the TP shards of qkv (GQA: this rank's query
heads plus max(1, kv_heads/t) KV heads, replicated when kv_heads < t), proj, fc1 (swiglu: gate+up),
fc2, their biases (gelu/GPT family; row-parallel biases replicated), and two replicated norms; plus the
vocab-parallel embedding and output layer (vocab padded to 128 t; the output layer shares the
embedding when tied) and the final norm.

Model states (Megatron mixed precision): bf16 weights 2 B/param; fp32 main gradients 4 B/param (bf16
training accumulates and reduces gradients in fp32; wgrad GEMMs accumulate straight into them, so no
bf16 gradient copy exists); Adam 12 B/param (fp32 master weight + two fp32 moments), divided by dp
with the distributed optimizer (weights and gradients too under FSDP: sim/cost/fsdp_memory.py). The
`optimizer` section (precision-aware states, bf16 main gradients, CPU offload) changes these per
sim/schedule/optimizer_states.py; offloaded states are reported as host_gb, outside the GPU total.

Activations (Korthikanti et al. 2022, 16-bit activations, 1-byte dropout masks), per layer per token:
  outside TP regions (/t under SP): ln1 input 2h, qkv input 2h, attention dropout mask h, ln2 input 2h,
      fc1 input 2h, MLP dropout mask h                                       -> 10h (8h without dropout)
  inside (this rank's shard): Q 2 a_t d, K and V 2 kv_t d each, proj input 2 a_t d (model.qk_norm:
      + the q and k norms' inputs 2 (a_t + kv_t) d),
      gelu: fc1 output 2 f_t + gelu output 2 f_t; swiglu: gate+up 4 f_t + swiglu output 2 f_t
      (MHA, gelu, f = 4h: 24h/t)
  scores (unfused attention, no selective recompute): softmax output 2, dropout mask 1, dropout
      output 2 bytes per score, a_t s scores per token                         -> 5 a s / t
  Summed over s b tokens this is sbh(10 + 24/t + 5as/(ht)) for TP and (sbh/t)(34 + 5as/h) with SP.
  Flash attention never stores the scores (its per-row softmax statistics, 4 a_t bytes per token, are
  neglected). Full recompute keeps each layer's input (2sbh, /t under SP) plus, while one layer is being
  recomputed, that layer's full activations (Korthikanti's 2sbhL omits this one-layer working set).
  Where Transformer Engine runs FlashAttention 2 (sm_8x; sm_100+ in a deterministic run with attention
  dropout) and a micro-batch holds > 1 sequence, each layer keeps its attention output twice (FA2's bshd
  output and the sbhd copy TE returns): + 2 a_t d per token (sim/cost/fa2_memory.py).
Selective recompute (parallel.recompute_modules, sim/schedule/shapes.RECOMPUTE_MODULES): core_attn drops
the scores (the default above), mlp a dense MLP's fc1 and activation outputs, mla_up_proj and moe_act as
sim/cost/layer_memory.py says. The one layer being recomputed holds its dropped tensors again for a
moment; that working set (at most one layer's Q, K, V or MLP outputs) is neglected.
Gradient accumulation frees a micro-batch's activations after its backward: one micro-batch in flight.
With parallel.moe_ep_overlap (pp = 1) a micro-batch's forward runs beside the previous one's backward,
layer l beside layer L-1-l: one micro-batch plus one layer at the peak (combined_1f1b_activations).
Head: embedding dropout mask sbh, final-norm input 2sbh, logits-GEMM input 2sbh (all /t under SP) and
the fp32 logits/softmax the cross-entropy keeps, 4 s b V_pad / t.

Pipeline parallelism (pp > 1), per stage r (Korthikanti et al. 2022, Sec. 4.2.3; Narayanan et al. 2021):
the stage holds its own layers' model states, the embedding on stage 0, the final norm and the output
layer (a copy of the embedding when tied) on the last stage. Activations are those of its layers times
the micro-batches in flight: min(p - r, m) for plain 1F1B (stage 0 holds p); interleaved, stage r holds
min(w_r + 1, v m) chunk-micro-batches of its v chunks (w_r the warm-up forwards, sim/schedule/pipeline.py), so
stage 0 holds (v p + p - 1) / v = p (1 + (p - 1)/(v p)) micro-batches' worth of its layers. The embedding's
dropout mask follows the same count; the output layer's activations and logits belong to one
micro-batch in flight (its backward follows its forward on the last stage). "fits" uses the worst stage.

FP8 (run.fp8; sim/cost/fp8_memory.py): +2 bytes per linear weight for the FP8 rowwise and transposed copies
(weights; with run.fp8_param_gather the bf16 copy of those weights goes, -2), and the four linears' saved
inputs at 1 byte (activations).

Workspace 1.0 GB: CUDA context (~0.5 GB), NCCL buffers for the tp and dp communicators (4 MiB Simple +
LL128 + LL buffers per channel, ~10 MiB x up to 32 channels each, ~0.3-0.6 GB), cuBLAS workspace.
An estimate; allocator fragmentation is not modeled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.core.units import GB
from meshsim.sim.cost.fa2_memory import fa2_output_copy_bytes
from meshsim.sim.cost.fp8_memory import fp8_activation_savings, moe_fp8_savings
from meshsim.sim.cost.layer_memory import layer_params, mla_activation_bytes, moe_activation_bytes
from meshsim.sim.cost.mtp_memory import mtp_extra_params, mtp_head_activation_bytes
from meshsim.sim.cost.state_memory import model_states_gb
from meshsim.sim.schedule.layer_kinds import layer_kind, layer_plan, sixteen_bit
from meshsim.sim.schedule.mtp_ops import model_layer_ids, mtp_layer_ids
from meshsim.sim.schedule.pipeline import PipelineShape, warmup_forwards
from meshsim.sim.schedule.pipeline_layout import pipeline_layout
from meshsim.sim.schedule.shapes import LayerDims, layer_dims

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
    stages: tuple[MemoryBreakdown, ...] = ()  # pp > 1: every stage; the fields above are the worst one's
    worst_stage: int = 0
    host_gb: float = 0.0  # optimizer.cpu_offload: the offloaded optimizer states in host memory (not in total)


def kinded(rs: ResolvedScenario) -> bool:
    """Whether memory is summed per layer kind: the layers differ (MoE, MLA, 16-bit first / last layers under
    FP8) or MTP adds some (of the last's)."""
    m, run = rs.scenario.model, rs.scenario.run
    return m.moe is not None or m.mla is not None or m.mtp_layers > 0 or run.fp8_first_last_layers_bf16 and run.fp8_on


def model_layers(rs: ResolvedScenario) -> list[int]:
    """Every transformer layer a step runs (sim/schedule/mtp_ops.model_layer_ids)."""
    return model_layer_ids(rs.scenario.model)


def layers_memory(rs: ResolvedScenario, layers: list[int]) -> tuple[int, int, int, int]:
    """(dense params, routed-expert params, activation bytes of one micro-batch, the largest layer's
    activation bytes) of `layers` on one rank, per layer kind (sim/cost/layer_memory.py): each kind's terms
    are computed once (a pure function of the plan and the kind) and summed over the layers in order."""
    plan, model = layer_plan(rs, layer_dims(rs)), rs.scenario.model
    dense = expert = acts = biggest = 0
    by_kind: dict = {}
    for layer in layers:
        kind = layer_kind(model, layer, rs.scenario.run)
        terms = by_kind.get(kind)
        if terms is None:
            terms = by_kind[kind] = _kind_terms(plan, kind)
        p_dense, p_expert, act = terms
        dense, expert, acts, biggest = dense + p_dense, expert + p_expert, acts + act, max(biggest, act)
    return dense, expert, acts, biggest


def _kind_terms(plan, kind) -> tuple[int, int, int]:
    """(dense params, routed-expert params, activation bytes of one micro-batch) of one layer of `kind`."""
    plan_k = sixteen_bit(plan) if kind.bf16 else plan  # a 16-bit first / last layer keeps no FP8 savings
    d = plan_k.d
    p_dense, p_expert = layer_params(plan_k, kind)
    attn = mla_activation_bytes(plan_k) if plan.mla is not None else (  # its own FP8 savings only
        layer_activation_bytes(d) - dense_mlp_activation_bytes(d) + fp8_activation_savings(d)
        - fp8_activation_savings(d, mlp=False))
    mlp_fp8 = fp8_activation_savings(d) - fp8_activation_savings(d, mlp=False)
    act = attn + (moe_activation_bytes(plan_k) - moe_fp8_savings(plan_k) if kind.moe
                  else dense_mlp_activation_bytes(d) - mlp_fp8)
    return p_dense, p_expert, act


def params_per_rank(rs: ResolvedScenario) -> int:
    """Parameters held by one rank (its TP shard, replicated pieces included; before DP sharding)."""
    d = layer_dims(rs)
    table = d.vocab * d.hidden
    head = table if rs.scenario.model.tied_embeddings else 2 * table
    if kinded(rs):
        dense, expert, _, _ = layers_memory(rs, model_layers(rs))
        return dense + expert + head + d.norm_params + mtp_extra_params(rs)
    return rs.scenario.model.layers * d.layer_params + head + d.norm_params


def dense_mlp_activation_bytes(d: LayerDims) -> int:
    """A dense MLP block's share of layer_activation_bytes: ln2 and fc1 inputs (+ dropout mask) outside TP
    regions, fc1 and activation outputs inside."""
    inside = 0 if d.recomputes("mlp") else d.tokens * (2 * d.fc1_n + 2 * d.ffn)
    return d.tokens_out * (4 * d.hidden + (d.hidden if d.dropout else 0)) + inside


def layer_activation_bytes(d: LayerDims, recompute: str | None = None) -> int:
    """Bytes one layer keeps for backward for one micro-batch (recompute 'none' | 'selective')."""
    recompute = d.recompute if recompute is None else recompute
    h, masks = d.hidden, (2 * d.hidden if d.dropout else 0)
    outside = 8 * h + masks  # per token_out (sequence-sharded under SP)
    attn = 2 * (2 * d.heads + 2 * d.kv_heads + ((d.heads + d.kv_heads) if d.qk_norm else 0)) * d.head_dim
    # fc1 output (gate+up when gated) and the activation output; recompute of mlp keeps only its input
    mlp = 0 if recompute == "selective" and d.recomputes("mlp") else 2 * d.fc1_n + 2 * d.ffn
    scores = 0
    if not d.flash and (recompute == "none" or (recompute == "selective" and not d.recomputes("core_attn"))):
        scores = (5 if d.dropout else 2) * d.heads * d.seq
    fp8 = fp8_activation_savings(d) if recompute != "full" else 0  # FP8-saved linear inputs (fp8_memory.py)
    return d.tokens_out * outside + d.tokens * (attn + mlp + scores) - fp8


def activation_bytes(rs: ResolvedScenario) -> int:
    """All layers plus embedding/head, micro_batches_in_flight(rs) micro-batches."""
    d = layer_dims(rs)
    layers = len(model_layers(rs))
    per_input = d.tokens_out * d.hidden * d.dtype_bytes
    combined = combined_1f1b_activations(rs)
    if kinded(rs):
        _, _, acts, biggest = layers_memory(rs, model_layers(rs))
        body = layers * per_input + biggest if d.recompute == "full" else acts
        body = combined or body
    elif d.recompute == "full":
        body = layers * per_input + layer_activation_bytes(d, "none")
    else:
        body = layers * layer_activation_bytes(d)
    body += (layers + (1 if combined else 0)) * fa2_output_copy_bytes(rs, d)  # TE's FA2 output copy (fa2_memory.py)
    sharded = d.tokens_out * d.hidden
    head = sharded * (1 if d.dropout else 0) + 2 * sharded * d.dtype_bytes + 4 * d.tokens * d.vocab
    return body + head + mtp_head_activation_bytes(d, rs.scenario.model.mtp_layers)


def in_flight_micro_batches(rs: ResolvedScenario, stage: int) -> float:
    """Micro-batches' worth of a stage's layer activations held at the peak (module docstring)."""
    p, v, m = rs.pp, rs.vp, rs.micro_batches
    if v == 1:
        return min(p - stage, m)
    n = rs.scenario.parallel.microbatch_group_size or p
    shape = PipelineShape(p, v, m, n, True, rs.scenario.parallel.moe_ep_overlap)  # one more warm-up forward
    return min(warmup_forwards(shape, stage) + 1, v * m) / v


def combined_1f1b_activations(rs: ResolvedScenario) -> int | None:
    """Layer activations at the peak of Megatron's combined 1F1B without pipelining (parallel.moe_ep_overlap,
    sim/schedule/ep_overlap.py), None when it does not run: forward layer l of micro-batch i is paired with
    backward layer L-1-l of micro-batch i - 1, whose activations are freed as its backward ends, so at the
    pair both hold theirs: i's layers 0..l and i - 1's layers 0..L-1-l, L + 1 layers' worth when the layers
    are alike (one micro-batch plus one layer), the largest such sum over l otherwise."""
    if not (rs.scenario.parallel.moe_ep_overlap and rs.pp == 1 and rs.micro_batches > 1):
        return None
    model, by_kind, per_layer = rs.scenario.model, {}, []
    for layer in range(model.layers):
        kind = layer_kind(model, layer, rs.scenario.run)
        if kind not in by_kind:
            by_kind[kind] = layers_memory(rs, [layer])[2]
        per_layer.append(by_kind[kind])
    prefix, n = list(accumulate(per_layer, initial=0)), model.layers
    return max(prefix[layer + 1] + prefix[n - layer] for layer in range(n))


def stage_layers(rs: ResolvedScenario, stage: int, layout: list | None = None) -> list[int]:
    """The transformer layers `stage` runs: its chunks', and on the last stage the MTP depths' (model_layers);
    `layout` the scenario's pipeline_layout when the caller has it."""
    m = rs.scenario.model
    mtp = mtp_layer_ids(m) if stage == rs.pp - 1 else []
    layout = layout or pipeline_layout(rs.scenario.parallel, m.layers)
    return [layer for ch in layout[stage] for layer in ch.layers] + mtp


def stage_param_split(rs: ResolvedScenario, stage: int, layers: list[int] | None = None,
                      terms: tuple[int, int, int, int] | None = None) -> tuple[int, int]:
    """(dense, routed-expert) parameters one rank of `stage` holds: its layers, the embedding (first stage),
    the final norm and the output layer or its tied copy of the embedding (last stage). `layers` (its
    stage_layers) and `terms` (their layers_memory, kinded scenarios) when the caller has them."""
    d = layer_dims(rs)
    layers = stage_layers(rs, stage) if layers is None else layers
    table = d.vocab * d.hidden
    output = 0 if stage == 0 and rs.scenario.model.tied_embeddings else table  # pp = 1: tied shares the embedding
    ends = (table if stage == 0 else 0) + (output + d.norm_params + mtp_extra_params(rs) if stage == rs.pp - 1 else 0)
    if kinded(rs):
        dense, expert, _, _ = terms or layers_memory(rs, layers)
        return dense + ends, expert
    return len(layers) * d.layer_params + ends, 0


def stage_params(rs: ResolvedScenario, stage: int) -> int:
    return sum(stage_param_split(rs, stage))


def stage_activation_bytes(rs: ResolvedScenario, stage: int, layer_ids: list[int] | None = None,
                           terms: tuple[int, int, int, int] | None = None) -> int:
    """A stage's activation bytes at its peak (`layer_ids`, `terms`: as stage_param_split's)."""
    d = layer_dims(rs)
    layer_ids = stage_layers(rs, stage) if layer_ids is None else layer_ids
    layers = len(layer_ids)
    flight = in_flight_micro_batches(rs, stage)
    if kinded(rs):
        _, _, acts, biggest = terms or layers_memory(rs, layer_ids)
        if d.recompute == "full":
            body = layers * d.tokens_out * d.hidden * d.dtype_bytes * flight + biggest
        else:
            body = acts * flight
    elif d.recompute == "full":
        body = layers * d.tokens_out * d.hidden * d.dtype_bytes * flight + layer_activation_bytes(d, "none")
    else:
        body = layers * layer_activation_bytes(d) * flight
    body += layers * fa2_output_copy_bytes(rs, d) * flight  # TE's FlashAttention 2 output copy (fa2_memory.py)
    sharded = d.tokens_out * d.hidden
    embed = sharded * (1 if d.dropout else 0) * flight if stage == 0 else 0
    head = 2 * sharded * d.dtype_bytes + 4 * d.tokens * d.vocab if stage == rs.pp - 1 else 0
    head += mtp_head_activation_bytes(d, rs.scenario.model.mtp_layers) if stage == rs.pp - 1 else 0
    return int(body + embed + head)


def _breakdown(rs: ResolvedScenario, params: int, activation_b: int, expert_params: int = 0,
               layers: Sequence[int] = (), head: bool = False) -> MemoryBreakdown:
    """`params` dense (optimizer sharded over dp), `expert_params` routed experts (over edp); `layers`
    transformer layers and `head` the LM head (their FP8 weight copies)."""
    weights, grads, optimizer, host = model_states_gb(rs, params, expert_params, layers, head)
    acts = activation_b / GB
    total = weights + grads + optimizer + acts + WORKSPACE_GB
    return MemoryBreakdown(weights, grads, optimizer, acts, WORKSPACE_GB, total, rs.gpu.mem_gb,
                           total <= rs.gpu.mem_gb, host_gb=host)


def pipeline_memory(rs: ResolvedScenario) -> MemoryBreakdown:
    """Every stage's memory; the worst stage's figures on top ("fits" is the worst stage's). The pipeline
    layout, each stage's layers and their layers_memory are computed once and handed to the stage terms."""
    layout = pipeline_layout(rs.scenario.parallel, rs.scenario.model.layers)
    stages = tuple(_stage_breakdown(rs, r, stage_layers(rs, r, layout)) for r in range(rs.pp))
    worst = max(range(rs.pp), key=lambda r: stages[r].total_gb)
    w = stages[worst]
    return MemoryBreakdown(w.weights_gb, w.grads_gb, w.optimizer_gb, w.activations_gb, w.workspace_gb,
                           w.total_gb, w.capacity_gb, w.fits, stages, worst, w.host_gb)


def _stage_breakdown(rs: ResolvedScenario, stage: int, layers: list[int]) -> MemoryBreakdown:
    terms = layers_memory(rs, layers) if kinded(rs) else None
    dense, expert = stage_param_split(rs, stage, layers, terms)
    return _breakdown(rs, dense, stage_activation_bytes(rs, stage, layers, terms), expert, layers,
                      stage == rs.pp - 1)


def memory_per_gpu(rs: ResolvedScenario) -> MemoryBreakdown:
    if rs.pp > 1:
        return pipeline_memory(rs)
    if kinded(rs):
        dense, expert = stage_param_split(rs, 0)
        return _breakdown(rs, dense, activation_bytes(rs), expert, model_layers(rs), head=True)
    return _breakdown(rs, params_per_rank(rs), activation_bytes(rs), layers=range(rs.scenario.model.layers),
                      head=True)
