"""Vocab-parallel cross-entropy (Megatron's): logits stay split by vocabulary over the TP group.

loss_t = log(sum_v exp(z_tv - m_t)) - (z_t,y_t - m_t), with m_t = max_v z_tv. Each rank holds V/t
columns, so it needs three all-reduces of one fp32 value per token over the TP group, as Megatron's
vocab_parallel_cross_entropy does (and sim/schedule/head_ops.py counts): the max (K.XENT_MAX + K.ALL_REDUCE), the target
logit ("xent_pred_ar", held by one rank) and the sum of exponentials (K.XENT_SUM + K.ALL_REDUCE). Backward is local:
dL/dz = softmax(z) - onehot(y), scaled by the incoming gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from meshsim.sim.schedule import op_keys as K
from meshsim.validate.stack.comm import comm_tag


def _all_reduce(x: torch.Tensor, group, op, key: str) -> None:
    if group is not None and dist.get_world_size(group) > 1:
        with comm_tag(K.HEAD_BLOCK, key):
            dist.all_reduce(x, op=op, group=group)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """apply(logits [s, b, V/t], labels [s, b], vocab_start, group) -> per-token loss [s, b]."""

    @staticmethod
    def forward(ctx, logits, labels, vocab_start: int, group):
        local_max = logits.max(dim=-1).values
        _all_reduce(local_max, group, dist.ReduceOp.MAX, K.XENT_MAX + K.ALL_REDUCE)
        shifted = logits - local_max.unsqueeze(-1)
        local_ids = labels - vocab_start
        mine = (local_ids >= 0) & (local_ids < logits.shape[-1])
        local_ids = local_ids.clamp(0, logits.shape[-1] - 1)
        target = shifted.gather(-1, local_ids.unsqueeze(-1)).squeeze(-1) * mine
        _all_reduce(target, group, dist.ReduceOp.SUM, K.XENT_PRED + K.ALL_REDUCE)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        _all_reduce(sum_exp, group, dist.ReduceOp.SUM, K.XENT_SUM + K.ALL_REDUCE)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local_ids, mine)
        return sum_exp.log() - target

    @staticmethod
    def backward(ctx, grad):
        softmax, local_ids, mine = ctx.saved_tensors
        dlogits = softmax.clone()
        dlogits.scatter_add_(-1, local_ids.unsqueeze(-1), -mine.to(softmax.dtype).unsqueeze(-1))
        return dlogits * grad.unsqueeze(-1), None, None, None
