"""Context-parallel scenario rules, each the one Megatron-Core or Transformer Engine enforces (file and line
at NVIDIA/Megatron-LM d98e8a64 and NVIDIA/TransformerEngine d0067d0):

- seq_len a multiple of 2 x cp: causal load balancing cuts each sequence into 2 cp chunks
  (megatron/training/arguments.py L1336-1338; TE dot_product_attention/utils.py L1168); with sequence
  parallelism tp divides each rank's s / cp tokens (the SP split of its activations);
- no context parallelism with unfused attention: TE's UnfusedDotProductAttention has none
  (utils.py L1169-1171), so Megatron runs CP only through TE's fused (cuDNN) or flash backends;
- a2a (and the a2a level of a2a+p2p) moves heads: this rank's query heads and KV heads must each divide
  by the a2a size (TE context_parallel.py L4246-4248, AttnFuncWithCPAndQKVOA2A);
- a2a+p2p needs hierarchical sizes (arguments.py L583-585) whose product is cp (L580-582;
  core/parallel_state.py L1127-1128), and they mean nothing with another cp_comm;
- MoE layers compose with CP as Megatron folds them (parallel_state.py L859-895: attention on the
  tp-cp-dp-pp RankGenerator, experts on etp-ep-edp-pp over the same ranks, cp = 1 there): each rank routes
  its s / cp tokens (sim/schedule/moe_shapes.py), and dense gradients reduce over dp x cp, expert ones over
  edp = tp cp dp / (etp ep);
- MLA composes with CP as Transformer Engine runs it: its fused attention takes Q and K qk + rope wide and V
  v wide, and the p2p ring sends cat(K, V) flattened (context_parallel.py L1690), so each exchange moves
  both widths (sim/schedule/cp_ops.py Widths);
- sliding windows only with cp_comm a2a, where the core is the whole sequence's windowed attention on
  heads / cp: TE's fused attention refuses windows with p2p and a2a+p2p (utils.py "Filter: Context
  parallelism", d0067d0), and the allgather chunks' windowed masks are not modeled here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from meshsim.scenarios.check_base import CheckContext, rule_error
from meshsim.scenarios.schema import Scenario


def a2a_size(s: Scenario) -> int:
    """Ranks of the all-to-all level: cp for a2a, the first hierarchical size for a2a+p2p, else 1."""
    p = s.parallel
    if p.cp_comm == "a2a":
        return p.cp
    if p.cp_comm == "a2a+p2p" and p.hierarchical_cp:
        return p.hierarchical_cp[0]
    return 1


def check_cp_sequence(s: Scenario, ctx: CheckContext) -> None:
    p, seq = s.parallel, s.model.seq_len
    if p.cp > 1 and seq % (2 * p.cp):
        step = 2 * p.cp
        raise rule_error(ctx, "model.seq_len", seq, f"Context parallelism with causal load balancing cuts the "
                         f"sequence into 2 x cp = {step} chunks", f"use seq_len a multiple of {step} "
                         f"(e.g. {max(step, seq // step * step)}), or another parallel.cp")


def check_cp_sequence_parallel(s: Scenario, ctx: CheckContext) -> None:
    """Sequence parallelism splits each rank's s / cp tokens over tp."""
    p, seq = s.parallel, s.model.seq_len
    if p.cp > 1 and p.sp and seq % (2 * p.cp) == 0 and (seq // p.cp) % p.tp:
        step = 2 * p.cp * p.tp // math.gcd(2, p.tp)
        raise rule_error(ctx, "model.seq_len", seq, f"With cp = {p.cp} each rank holds {seq // p.cp} tokens, and "
                         f"sequence parallelism splits them over tp = {p.tp}", f"use seq_len a multiple of {step}, "
                         "or another parallel.cp / parallel.tp")


def check_cp_attention(s: Scenario, ctx: CheckContext) -> None:
    if s.parallel.cp > 1 and s.model.attention == "unfused":
        raise rule_error(ctx, "model.attention", "unfused", "Transformer Engine runs context parallelism only "
                         "in its fused (cuDNN) or flash attention, not in unfused attention",
                         "set model.attention: flash, or parallel.cp: 1")


def check_cp_modeled(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    if p.cp > 1 and s.model.sliding_window and p.cp_comm != "a2a":
        why = "Transformer Engine's fused attention refuses sliding windows with context parallelism over " \
              f"cp_comm {p.cp_comm}" if p.cp_comm in ("p2p", "a2a+p2p") else \
              "meshsim does not model the allgather chunks' windowed masks"
        raise rule_error(ctx, "parallel.cp_comm", p.cp_comm, f"Sliding-window attention with cp = {p.cp}: {why}",
                         "set parallel.cp_comm: a2a (its core is the whole sequence's windowed attention), or "
                         "parallel.cp: 1")


def check_cp_hierarchy(s: Scenario, ctx: CheckContext) -> None:
    p = s.parallel
    sizes = p.hierarchical_cp
    if p.cp_comm == "a2a+p2p" and p.cp > 1 and sizes is None:
        raise rule_error(ctx, "parallel.hierarchical_cp", None, "cp_comm a2a+p2p needs the a2a and p2p sizes",
                         f"set parallel.hierarchical_cp: [a2a, p2p] with a2a x p2p = cp = {p.cp}, e.g. [2, {p.cp // 2 or 1}]")
    if sizes is not None and p.cp_comm != "a2a+p2p":
        raise rule_error(ctx, "parallel.hierarchical_cp", sizes, f"Hierarchical sizes apply only to cp_comm "
                         f"a2a+p2p, and cp_comm is {p.cp_comm}", "remove parallel.hierarchical_cp, or set "
                         "parallel.cp_comm: a2a+p2p")
    if sizes is not None and math.prod(sizes) != p.cp:
        raise rule_error(ctx, "parallel.hierarchical_cp", sizes, f"Their product {math.prod(sizes)} must be "
                         f"cp = {p.cp}", f"use two sizes whose product is {p.cp}")


def check_cp_heads(s: Scenario, ctx: CheckContext) -> None:
    m, p, n = s.model, s.parallel, a2a_size(s)
    heads, kv = m.heads // p.tp, max(1, m.num_kv_heads // p.tp)
    if n > 1 and (heads % n or kv % n):
        which, value = ("query heads", heads) if heads % n else ("KV heads", kv)
        raise rule_error(ctx, "parallel.cp_comm", p.cp_comm, f"The all-to-all of {p.cp_comm} splits each tp "
                         f"rank's {which} ({value}) over {n} ranks, and {n} does not divide them",
                         "use cp_comm p2p or allgather, or an a2a size that divides both head counts")


Rule = Callable[[Scenario, CheckContext], None]
CP_RULES: tuple[Rule, ...] = (check_cp_sequence, check_cp_sequence_parallel, check_cp_attention, check_cp_modeled, check_cp_hierarchy,
                              check_cp_heads)
