"""Where Megatron-Core's MoE layer makes its host wait for the GPU, and what the host issues right after.

A device-to-host sync (.item(), .tolist(), .cpu(), an event or stream synchronize, a busy-wait on
host-mapped memory) empties the GPU queue: each kernel issued after it waits for its own dispatch until a
long one lets the host run ahead again (sim/engine/host.py). `mark_forward_syncs` marks, on one MoE
forward's template ops, the op the host issues first after each sync (`host_wait`: the op whose end it
waits for) and the PyTorch calls it makes between the sync and that op's kernel (`host_calls`, the sync
itself counted; every other op keeps the default two, sim/cost/host_dispatch.py). Counted from the source
with moe_permute_fusion and moe_router_fusion on, dropless, no CUDA graphs (Megatron-LM d98e8a64
megatron/core/transformer/moe, TransformerEngine d0067d0d, DeepEP dd758caf main and 94a9f8f6 hybrid-ep):

- alltoall: preprocess all-gathers the token counts (token_dispatcher.py L557-576) and copies the splits
  to the host on a side stream after it (L921-953, the dtoh point "before_permutation_1"); permute is
  issued next (L664-682); token_dispatch then waits for that copy (L700-704 -> L956-958, sync point
  "before_ep_alltoall" when ep or tp > 1, L594-596). After it: the wait (1), new_empty and
  all_to_all_single (2) (tensor_parallel/mappings.py L438-466): the token all-to-all waits for the
  counts' all-gather, 3 calls. TEGroupedMLP's tokens_per_expert.tolist() (experts.py L897 / L916) then
  reads the host copy: no sync.
- allgather: dispatch_postprocess's local_map.sum().long().cpu() (L320) waits for the stream, the
  token all-gather last; then .sum().item() on the host copy (L326) and TE's fused permute: make_row_id_map
  (two allocations, three kernels) and permute_with_mask_map (an allocation, a kernel) (transformer_engine/
  pytorch/triton/permutation.py): permute waits for the token gather, 1 + 2 + 5 + 2 = 10 calls. Then
  masked_select (L331-333, its output size is data-dependent) waits for permute: two contiguous copies and
  the select, 3 calls, before the experts' own (below).
- flex, DeepEP: Buffer::intranode_dispatch busy-waits on the host-mapped receive counters that the
  notify kernel writes (DeepEP csrc/legacy/buffer.hpp L549-597), then allocates the receive buffers in C++
  and launches the dispatch kernel (L600-640): the dispatch waits for the router, 2 calls (the default).
  FP8 (align 16, fp8_utils.get_fp8_align_size): permute pads each expert's rows (TE permutation.py
  L1004-1023, via moe_utils.permute L421-428): torch.equal on the GPU counts waits for the dispatch, then
  sub, cumsum, zeros, cat, sum, .item() and the fused permute (5 + 2): permute waits for the dispatch,
  1 + 4 + 2 + 5 + 3 = 15 calls; the padded counts it returns are on the GPU, so TEGroupedMLP's .tolist()
  (experts.py L897) waits for permute, then GroupedLinear issues torch.tensor(m_splits), one split_quantize
  and one weight quantize per local expert (grouped_linear.py L2194, L820, L838-848; Fp8Padding returns at
  once on aligned splits, fp8_padding.py L125-127): the first expert op waits for permute, 3 + E calls.
- flex, HybridEP: dispatch_with_permute without num_permuted_tokens runs blocking (fused_a2a.py
  L415-433): metadata_preprocessing copies the counts to pinned memory and cudaStreamSynchronizes
  (hybrid-ep csrc/hybrid_ep/executor/executor.cu L151-176), then allocates and launches the dispatch
  (hybrid_ep.cu L300-330): the dispatch waits for the router, 2 calls. The counts it returns are that
  pinned host tensor, so tokens_per_expert.sum() and .tolist() (token_dispatcher.py L1173-1178,
  experts.py L916) do not sync.
The backward has none: the all-to-alls reuse the forward's split lists, DeepEP and HybridEP their handles
(cached layout, no notify wait; HybridEP's num_permuted_tokens is the host sum above), GroupedLinear its
saved m_splits.
"""

from __future__ import annotations

from dataclasses import replace

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.moe_shapes import MoeDims
from meshsim.sim.schedule.template import Template

A2A_CALLS = 3  # the wait, new_empty, all_to_all_single
ALLGATHER_PERMUTE_CALLS = 10  # .cpu(), .sum(), .item(), make_row_id_map (5), permute_with_mask_map (2)
MASKED_SELECT_CALLS = 3  # two .contiguous() copies and masked_select
FLEX_DISPATCH_CALLS = 2  # the wait's return and the dispatch launch (C++ allocations between): the default
PAD_PERMUTE_CALLS = 15  # torch.equal, sub, cumsum, zeros, cat, sum, .item(), fused permute (5 + 3)
SPLITS_CALLS = 3  # .tolist(), torch.tensor(m_splits), split_quantize (plus one weight quantize per expert)


def mark_forward_syncs(tpl: Template, first: int, phase: str, m: MoeDims, fp8: bool) -> None:
    """Mark the syncs of the MoE forward whose template ops start at index `first` (module docstring)."""
    at = {t.suffix: i for i, t in enumerate(tpl.ops) if i >= first}

    def op(*keys: str) -> int | None:
        """The first of `keys` the template has (None: none of them)."""
        return next((at[f"{phase}.{k}"] for k in keys if f"{phase}.{k}" in at), None)

    experts = next(i for i, t in enumerate(tpl.ops) if i >= first and t.suffix.startswith(f"{phase}.expert_fc1"))
    if m.dispatcher == "alltoall":  # ep = etp = 1: the sync "before_finish", right before the experts
        awaited, waiting = op(K.MOE_META, "route"), op(K.MOE_DISPATCH, K.EXPERT_GATHER)
        if waiting is None:
            _mark(tpl, experts, awaited, 1 + _expert_calls(fp8, m))
        else:
            _mark(tpl, waiting, awaited, A2A_CALLS)
    elif m.dispatcher == "allgather":
        gather = op(K.MOE_GATHER, "route")
        _mark(tpl, op("permute"), gather, ALLGATHER_PERMUTE_CALLS)
        _mark(tpl, experts, op("permute"), MASKED_SELECT_CALLS + _expert_calls(fp8, m))
    else:
        _mark(tpl, op(K.MOE_DISPATCH), op("route"), FLEX_DISPATCH_CALLS)
        if m.flex_backend == "deepep" and fp8:
            _mark(tpl, op("permute"), op(K.MOE_DISPATCH), PAD_PERMUTE_CALLS)
            _mark(tpl, experts, op("permute"), SPLITS_CALLS + m.local_experts)


def _expert_calls(fp8: bool, m: MoeDims) -> int:
    """What GroupedLinear issues before its first kernel once it has the splits on the host: under FP8
    torch.tensor(m_splits), split_quantize and a weight quantize per expert (the quantize op), in 16 bits
    torch.tensor(m_splits), the split views, the output allocation and the first expert's GEMM."""
    return 2 + m.local_experts if fp8 else 4


def _mark(tpl: Template, waiting: int, awaited: int, calls: int) -> None:
    tpl.ops[waiting] = replace(tpl.ops[waiting], host_wait=awaited, host_calls=calls)
