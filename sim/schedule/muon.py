"""Muon (optimizer.name: muon): which parameters it updates, their state bytes, and its Newton-Schulz work.

Megatron-LM @d98e8a64: `--optimizer muon` (megatron/core/optimizer/emerging_optimizers.py, TensorParallelMuon
over the emerging_optimizers package; layer_wise_optimizer.py):
- Parameters: every 2-D weight that is not the embedding or the output layer (`_is_muon_excluded`): a
  layer's attention projections (q, k and v orthogonalized apart, `--muon-no-split-qkv` unset; MLA's five),
  its MLP, routed-expert and shared-expert linears and the MoE router, the MTP depths' layers alike. The
  rest (embedding, output layer, norms, biases) take the scalar optimizer, Adam (`--muon-scalar-optimizer`).
- States: the fp32 master and one fp32 momentum, 8 B per Muon parameter against Adam's 12
  (sim/schedule/optimizer_states.py MUON_STATE_BYTES, MUON_STEP_BYTES).
- Step: the momentum of each matrix X (m x n with m <= n, else its transpose) is orthogonalized by
  `steps` (--muon-num-ns-steps, 5) Newton-Schulz iterations X <- a X + (b A + c A^2) X, A = X X^T:
  2 m^2 n (A) + 2 m^3 (A^2) + 2 m^2 n (the product with X) FLOPs each, run as GEMMs at the 16-bit rate
  (--muon-fp32-matmul-prec medium: fp32 matmuls on bf16 tensor cores). Then the elementwise update.
- Tensor parallelism (--muon-tp-mode duplicated, the default; `newton_schulz_tp`): a TP-sharded matrix's
  momentum is all-gathered over tp (fp32) and every TP rank orthogonalizes the whole matrix; the routed
  experts' over etp likewise. (`blockwise` runs as duplicated for TP shards; `distributed` is not modeled.)
- Distribution: with parallel.distributed_optimizer Megatron runs the layer-wise distributed optimizer,
  which bin-packs whole parameters over the dp ranks by their Newton-Schulz cost (`_ns_compute_cost`), so
  each rank orthogonalizes about 1 / dp of the matrices (routed experts: 1 / edp) and the DP traffic is the
  distributed optimizer's (gradients reduced in buckets, updated parameters all-gathered); without it
  every rank orthogonalizes every matrix it holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.core.units import FP32_BYTES
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.layer_kinds import layer_kind, layer_plan
from meshsim.sim.schedule.ops import Collective, Gemm, Work
from meshsim.sim.schedule.shapes import LayerDims


@dataclass(frozen=True)
class Matrix:
    """One 2-D weight as Muon sees it: its whole shape, and the ranks it is sharded over ("tp", "etp" or
    "" when every rank holds it whole); `expert`: a routed expert's (distributed over edp)."""

    rows: int
    cols: int
    shard: str = ""
    expert: bool = False


def _attention(d: LayerDims, plan, kv_heads: int) -> list[Matrix]:
    h, t, a = d.hidden, d.tp, d.heads * d.tp
    if plan.mla is not None:
        m = plan.mla
        heads = m.heads * t
        q = ([Matrix(m.q_lora, h), Matrix(heads * (m.qk + m.rope), m.q_lora, "tp")] if m.q_lora
             else [Matrix(heads * (m.qk + m.rope), h, "tp")])
        return q + [Matrix(m.kv_lora + m.rope, h), Matrix(heads * (m.qk + m.v), m.kv_lora, "tp"),
                    Matrix(h, heads * m.v, "tp")]
    qkv_shard = "tp" if t > 1 else ""
    return [Matrix(a * d.head_dim, h, qkv_shard), Matrix(kv_heads * d.head_dim, h, qkv_shard),
            Matrix(kv_heads * d.head_dim, h, qkv_shard), Matrix(h, a * d.head_dim, qkv_shard)]


def _feed_forward(d: LayerDims, plan, moe: bool) -> list[Matrix]:
    h, t = d.hidden, d.tp
    if not moe:
        return [Matrix(d.fc1_n * t, h, "tp"), Matrix(h, d.ffn * t, "tp")]
    m = plan.moe
    experts = [Matrix(m.fc1_n * m.etp, h, "etp", True), Matrix(h, m.ffn * m.etp, "etp", True)] * m.local_experts
    shared = [Matrix(m.shared_fc1_n * t, h, "tp"), Matrix(h, m.shared_ffn * t, "tp")] if m.shared_ffn else []
    return [Matrix(m.experts, h)] + experts + shared


def layer_matrices(rs: ResolvedScenario, d: LayerDims, layers: Sequence[int]) -> list[Matrix]:
    """Every Muon matrix of `layers` (decoder and MTP layer numbers) on one rank, whole shapes."""
    plan, model = layer_plan(rs, d), rs.scenario.model
    out: list[Matrix] = []
    for layer in layers:
        out += _attention(d, plan, model.num_kv_heads) + _feed_forward(d, plan, layer_kind(model, layer).moe)
    return out


def shard_size(m: Matrix, rs: ResolvedScenario) -> int:
    """The ranks `m` is sharded over: tp, etp, or 1 when every rank holds it whole."""
    return {"tp": rs.tp, "etp": rs.etp}.get(m.shard, 1)


def local_params(m: Matrix, rs: ResolvedScenario) -> float:
    """The parameters of `m` this rank holds: its TP / ETP shard."""
    return m.rows * m.cols / shard_size(m, rs)


def owned_muon_params(rs: ResolvedScenario, d: LayerDims, layers: Sequence[int]) -> float:
    """Muon parameters this rank's optimizer owns: its shards of `layers`' matrices, / dp (experts / edp) under
    the layer-wise distributed optimizer."""
    if rs.scenario.optimizer.name != "muon":
        return 0.0
    dp, edp = (rs.grad_dp, rs.edp) if rs.scenario.parallel.distributed_optimizer else (1, 1)
    return sum(local_params(m, rs) / (edp if m.expert else dp) for m in layer_matrices(rs, d, layers))


def newton_schulz_works(rs: ResolvedScenario, d: LayerDims, layers: Sequence[int]) -> list[Work]:
    """The step's Muon work on one rank (module docstring): the momentum all-gathers over tp / etp (fp32, one
    coalesced call each), then per distinct shape the three GEMMs of every Newton-Schulz iteration of the
    matrices this rank orthogonalizes (batch = matrices x steps, the rank's 1 / dp share rounded up)."""
    if rs.scenario.optimizer.name != "muon":
        return []
    steps = rs.scenario.optimizer.muon_ns_steps
    dp, edp = (rs.grad_dp, rs.edp) if rs.scenario.parallel.distributed_optimizer else (1, 1)
    shapes: Counter = Counter()
    gathered = {"tp": 0.0, "etp": 0.0}
    for m in layer_matrices(rs, d, layers):
        share = 1 / (edp if m.expert else dp)
        shapes[(min(m.rows, m.cols), max(m.rows, m.cols), m.expert)] += share
        if shard_size(m, rs) > 1:
            gathered[m.shard] += m.rows * m.cols * share
    works: list[Work] = [Collective("all_gather", group, ceil(n) * FP32_BYTES, K.MUON_GATHER)
                         for group, n in gathered.items() if n > 0]
    for (m, n, _), count in sorted(shapes.items()):
        batch = ceil(count * steps)
        works += [Gemm(m, m, n, batch), Gemm(m, m, m, batch), Gemm(m, n, m, batch)]
    return works
