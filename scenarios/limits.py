"""A scenario's size limits (sim/core/limits.py holds the numbers), checked before anything is built.

The model's layers and dimensions are bounded so that every later step (divisor searches in the
messages of scenarios/checks.py, the schedule, the memory model) stays small; GPU counts are checked
where topologies are built (topologies/registry.py) and micro-batches / layer passes once dp is known
(scenarios/load.py resolve()).
"""

from __future__ import annotations

from meshsim.scenarios.cp_checks import a2a_size
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.limits import (
    MAX_ALL_TO_ALL_RANKS,
    MAX_GPUS,
    MAX_LAYERS,
    MAX_MODEL_DIM,
    MAX_SIMULATED_OPS,
    check_at_most,
    check_simulated_ops,
)

MODEL_DIMS = ("hidden", "ffn_hidden", "heads", "kv_heads", "seq_len", "vocab")


def check_model_size(scenario: Scenario, source: str) -> None:
    """UserError when model.layers, a model dimension or parallel.gpus / tp / micro_batch exceeds its limit."""
    m, p = scenario.model, scenario.parallel
    check_at_most("model.layers", m.layers, MAX_LAYERS, f"use at most {MAX_LAYERS} layers", source=source)
    for name in MODEL_DIMS:
        value = getattr(m, name)
        if value is not None:
            check_at_most(f"model.{name}", value, MAX_MODEL_DIM, f"use model.{name} <= {MAX_MODEL_DIM:,}",
                          source=source)
    for name in ("gpus", "tp", "micro_batch"):
        value = getattr(p, name)
        if value is not None:
            check_at_most(f"parallel.{name}", value, MAX_GPUS if name != "micro_batch" else MAX_MODEL_DIM,
                          f"use parallel.{name} <= {MAX_GPUS if name != 'micro_batch' else MAX_MODEL_DIM:,}",
                          source=source)
    check_at_most("parallel.ep", p.ep, MAX_ALL_TO_ALL_RANKS, f"use parallel.ep <= {MAX_ALL_TO_ALL_RANKS} (the "
                  "all-to-all's ranks^2 flows are costed one by one)", source=source, what="ranks of one all-to-all (ep)")
    if isinstance(p.dp, int):
        check_at_most("parallel.dp", p.dp, MAX_GPUS, f"use parallel.dp <= {MAX_GPUS:,}", source=source)


# ----- the ops one simulation run builds: a closed-form upper bound ------------------------------
# Ops of one layer's forward + backward, before the two terms that grow with the layout (below); each
# feature adds the ops its template inserts (counted on generated scenarios, tests/test_op_bound.py).
CORE_OPS = 40  # a dense layer: norms, QKV / proj / fc1 / fc2 and their grads, attention, TP collectives
FEATURE_OPS = {"tp": 8, "moe": 56, "mla": 16, "fp8": 16, "qk_norm": 8, "cp": 16, "fsdp": 8, "moe_ep_overlap": 24}
GATHER_CHUNK_OPS = 4  # tp_comm_overlap, per chunk and side: 2 gathered GEMMs x (one shift + one GEMM chunk)
RING_FWD_OPS, RING_BWD_OPS = 2, 3  # CP p2p, per ring step: shift + attention (+ merge) / shift + attention + fix
# recompute "selective": the ops each recomputed module re-runs in backward (upper bounds; measured: all five
# on an MoE + MLA layer at tp 2 add 12); unset modules (Megatron's default list): all counted
RECOMPUTE_MODULE_OPS = {"core_attn": 8, "mla_up_proj": 8, "mlp": 8, "moe_act": 4, "layernorm": 4}
PIPE_CHUNK_OPS = 8  # per model chunk (pp x vp) and micro-batch: its P2P sends and receives, both directions


def ops_per_layer_pass_bound(scenario: Scenario) -> int:
    """Upper bound on the ops one layer adds per micro-batch (forward, backward, what backward recomputes):

        ops <= F + B + R,   F = core / 2 + g c + ring_f n,   B = core / 2 + g c + ring_b n,

    R = F under recompute "full" (the forward re-run), under "selective" the sum of RECOMPUTE_MODULE_OPS
    over its modules plus ring_f n when core_attn is one (the ring's forward again) plus g c when a module
    around a gathered GEMM is (mla_up_proj, mlp, layernorm), else 0; c = tp chunks of each TP gather under
    tp_comm_overlap (Transformer Engine's ring exchange), g = GATHER_CHUNK_OPS, n = steps of the CP p2p
    ring (cp / a2a size, when > 1: attention + KV shift per step, plus a merge forward and a gradient fix
    backward), core = CORE_OPS + the FEATURE_OPS present. Independent of the model's sizes: the op count
    is a property of the layout, not of hidden or seq_len."""
    m, p = scenario.model, scenario.parallel
    present = {"tp": p.tp > 1, "moe": m.moe is not None, "mla": m.mla is not None, "fp8": scenario.run.fp8 != "off",
               "qk_norm": m.qk_norm, "cp": p.cp > 1, "fsdp": p.fsdp, "moe_ep_overlap": p.moe_ep_overlap}
    core = CORE_OPS + sum(FEATURE_OPS[name] for name, on in present.items() if on)
    chunks = p.tp if p.tp_comm_overlap else 0
    ring = p.cp // a2a_size(scenario) if p.cp > 1 and p.cp_comm != "allgather" else 0
    ring = ring if ring > 1 else 0
    side = core // 2 + GATHER_CHUNK_OPS * chunks
    forward = side + RING_FWD_OPS * ring
    backward = side + RING_BWD_OPS * ring
    return forward + backward + _recomputed_ops(p, forward, ring, chunks)


def _recomputed_ops(p, forward: int, ring: int, chunks: int) -> int:
    """R of ops_per_layer_pass_bound."""
    if p.recompute == "full":
        return forward
    if p.recompute != "selective":
        return 0
    modules = set(p.recompute_modules) if p.recompute_modules is not None else set(RECOMPUTE_MODULE_OPS)
    gathered = bool(modules & {"mla_up_proj", "mlp", "layernorm"})
    return (sum(RECOMPUTE_MODULE_OPS[name] for name in modules) + RING_FWD_OPS * ring * ("core_attn" in modules)
            + GATHER_CHUNK_OPS * chunks * gathered)


def simulated_ops_bound(scenario: Scenario, micro_batches: int, ranks_per_stage: int = 1) -> int:
    """Upper bound on the ops the engine runs for `micro_batches` micro-batches on `ranks_per_stage`
    simulated ranks of each stage:

        ranks x (micro_batches + 1) x ((layers + mtp_layers + 2) x ops_per_layer_pass_bound + pp vp x PIPE_CHUNK_OPS)

    Every stage's layers add up to model.layers; the embedding and the head (with the loss) count as one
    layer each; each of the pp vp model chunks adds its pipeline sends and receives; the extra micro-batch
    covers the step end (DP buckets, optimizer, parameter gathers: at most one layer pass's ops per
    layer). tests/test_op_bound.py checks bound >= the built schedules' ops on generated scenarios."""
    m, p = scenario.model, scenario.parallel
    per_micro_batch = (m.layers + m.mtp_layers + 2) * ops_per_layer_pass_bound(scenario) + p.pp * p.vp * PIPE_CHUNK_OPS
    return ranks_per_stage * (micro_batches + 1) * per_micro_batch


def check_run_ops(scenario: Scenario, micro_batches: int, *, source: str | None = None, ranks_per_stage: int = 1,
                  why: str = "") -> None:
    """UserError, before any work, when a run of `micro_batches` micro-batches could build more than
    MAX_SIMULATED_OPS ops (simulated_ops_bound)."""
    bound = simulated_ops_bound(scenario, micro_batches, ranks_per_stage)
    most = max(0, MAX_SIMULATED_OPS // simulated_ops_bound(scenario, 0, ranks_per_stage) - 1)
    check_simulated_ops(bound, scenario.model.layers, micro_batches, most=most, source=source,
                        pp=scenario.parallel.pp, why=why, ops_per_pass=ops_per_layer_pass_bound(scenario))
