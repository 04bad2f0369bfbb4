"""The names of a step's blocks and collectives, defined once for the schedule (sim) and the real run
(validate), which tags every torch.distributed call with them so the two can be compared op by op.

An op's name is "<block>.mb<m>.<phase>.<key>" inside a micro-batch ("L0.mb0.fwd.attn_in") and
"<block>.<key>" after the backward ("opt.ln_grad"). Keys of collectives:
- region boundaries (the duality table's f/g or all-gather/reduce-scatter): ATTN_IN, ATTN_OUT, MLP_IN,
  MLP_OUT in a layer, EMBED_OUT and HEAD_IN around the embedding and the output layer;
- SP's weight-gradient re-gather of an entry boundary's input: "<entry key>" + REGATHER;
- the vocab-parallel cross-entropy's all-reduces: XENT_MAX / XENT_PRED / XENT_SUM + ALL_REDUCE;
- after the backward: LN_GRAD (SP-replicated gradients over TP), KV_GRAD (GQA KV replicas), DP_GRAD and
  DP_PARAM (data-parallel gradient reduction and the distributed optimizer's parameter gather), EMBED_GRAD
  (pipeline: the tied word-embedding gradient over the first and last stage); with distributed-optimizer
instances, DP_GRAD / EXPERT_GRAD + ACROSS_INSTANCES sums a bucket's shard over "dp_out" (FSDP_GRAD +
ACROSS_INSTANCES a block's, in FSDP's last micro-batch).
MoE layers (sim/schedule/moe_ops.py) replace MLP_IN / MLP_OUT with the token dispatcher's collectives:
MOE_DISPATCH / MOE_DISPATCH_PROBS / MOE_COMBINE (all-to-all over "ep", or the flex dispatcher's fused
kernels), MOE_META (the token counts' all-gather), EXPERT_GATHER / EXPERT_GATHER_PROBS / EXPERT_SCATTER
(over "etp", the alltoall dispatcher's post/pre-processing: rows and probabilities gathered apart),
MOE_GATHER / MOE_SCATTER (the allgather dispatcher, over "etp_ep"), and SHARED_IN / SHARED_OUT around the
shared expert; after the backward EXPERT_GRAD reduces the experts' gradients over "edp".
FP8 (sim/schedule/fp8_ops.py): "<gemm>_" + FP8_QUANT (a quantize / cast-transpose kernel before an FP8
GEMM), FP8_AMAX (tensorwise's amax pass; + ALL_REDUCE its TP reduction under SP), FP8_TRANSPOSE (the
transpose of a gathered FP8 tensor); per micro-batch FP8_AMAX_REDUCE (delayed scaling's amax all-reduce,
"<FP8_BLOCK>.mb<m>.fwd.fp8_amax_reduce") and FP8_AMAX_UPDATE; per step FP8_WEIGHT_CAST ("opt.fp8_weight_cast").
Context parallelism (sim/schedule/cp_ops.py) adds, inside the attention core: CP_RING + "_c<step>" (the
KV ring's send/recv shifts, over "cp" or, for a2a+p2p, "cp_p2p"), CP_A2A + "_q"/"_k"/"_v"/"_out" and, in
backward, "_dout"/"_dq"/"_dk"/"_dv" (the all-to-alls over "cp_a2a"), CP_GATHER + "_k"/"_v" and CP_SCATTER
+ "_dk"/"_dv" (allgather's KV all-gathers and dK/dV reduce-scatters over "cp"); the core's attention
kernels are "attn_c<step>" (a ring step or an all-gathered chunk).
Multi-token prediction (sim/schedule/mtp_ops.py) runs inside the head block, its ops prefixed MTP_BLOCK + depth
("head.mb0.mtp0.fwd.qkv"): MTP_EH_IN (eh_proj's entry over the concatenated [s, b, 2h] input), MTP_EH_OUT
(its output's all-gather along the hidden dimension) and, under SP, MTP_SP_SPLIT (the sequence split's
backward all-gather).
Megatron-FSDP (sim/schedule/fsdp_ops.py), per micro-batch and block: FSDP_GATHER (the block's weights
all-gathered over "dp", "<block>.mb<m>.<fwd|bwd>.fsdp_gather"; FSDP_GATHER + EXPERT_SUFFIX the routed experts'
over "edp"), FSDP_GRAD after a block's backward (its gradients reduce-scattered; + EXPERT_SUFFIX over "edp"),
and, for FP8 without FP8 primary weights, FP8_WEIGHT_CAST before each forward (the gathered weights' cast).
Muon (sim/schedule/muon.py), before the optimizer step: "opt.muon_gather_<tp|etp>" (the momentum all-gathered over
the TP / ETP group) and "opt.muon_ns<i>" (the Newton-Schulz GEMMs).
Pipeline P2P batches are named "<PP_BLOCK>.<send_fwd+recv_bwd...>_c<chunk>.mb<m>" (sim/schedule/pipeline_builder.py).
With parallel.p2p_scatter_gather each received 1/tp chunk is all-gathered over "tp" by
"<PP_BLOCK>.<PP_GATHER>_<fwd|bwd>_c<chunk>.mb<m>" (purpose PP_GATHER).
"""

from __future__ import annotations

ATTN_IN, ATTN_OUT = "attn_in", "attn_out"
MLP_IN, MLP_OUT = "mlp_in", "mlp_out"
EMBED_OUT, HEAD_IN = "embed_out", "head_in"
REGATHER = "_regather"
SP_REGATHER = "sp_regather"  # the purpose a re-gather collective records
XENT_MAX, XENT_PRED, XENT_SUM = "xent_max", "xent_pred", "xent_sum"
ALL_REDUCE = "_ar"
LN_GRAD, KV_GRAD, DP_GRAD, DP_PARAM = "ln_grad", "kv_grad", "dp_grad", "dp_param"
EMBED_GRAD = "embed_grad"
EMBED_BLOCK, HEAD_BLOCK, OPT_BLOCK = "embed", "head", "opt"
PP_BLOCK = "pp"
PP_GATHER = "pp_gather"
MOE_DISPATCH, MOE_DISPATCH_PROBS, MOE_COMBINE, MOE_META = "dispatch", "dispatch_probs", "combine", "dispatch_meta"
EXPERT_GATHER, EXPERT_GATHER_PROBS, EXPERT_SCATTER = "expert_gather", "expert_gather_probs", "expert_scatter"
MOE_GATHER, MOE_SCATTER = "moe_gather", "moe_scatter"
SHARED_IN, SHARED_OUT = "shared_in", "shared_out"
EXPERT_GRAD = "expert_grad"
ACROSS_INSTANCES = "_across"  # + DP_GRAD / EXPERT_GRAD: a bucket's shard all-reduced across optimizer instances
FP8_QUANT, FP8_AMAX, FP8_TRANSPOSE = "fp8_quant", "fp8_amax", "fp8_transpose"
FP8_AMAX_REDUCE, FP8_AMAX_UPDATE, FP8_WEIGHT_CAST = "fp8_amax_reduce", "fp8_amax_update", "fp8_weight_cast"
FP8_BLOCK = "fp8"
CP_RING, CP_A2A, CP_GATHER, CP_SCATTER = "cp_ring", "cp_a2a", "cp_gather", "cp_scatter"
FSDP_GATHER, FSDP_GRAD, EXPERT_SUFFIX = "fsdp_gather", "fsdp_grad", "_experts"
MUON_GATHER, MUON_NS = "muon_gather", "muon_ns"
MTP_BLOCK, MTP_EH_IN, MTP_EH_OUT, MTP_SP_SPLIT = "mtp", "mtp_eh_in", "mtp_eh_gather", "mtp_sp_split"


def layer_block(layer: int) -> str:
    """The block name of transformer layer `layer`: "L3"."""
    return f"L{layer}"
