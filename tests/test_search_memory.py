"""Differential test of the closed-form memory computed once per layer kind and per stage
(sim/cost/memory.py: layers_memory sums each kind's terms computed once; pipeline_memory computes the
pipeline layout, a stage's layers and their layers_memory once and hands them to the stage terms): equal,
to the bit, to the long way (every layer's terms on their own, every stage term recomputing its layout and
layers) over generated dense, MoE, MLA, MTP and FP8 (16-bit first and last layers) scenarios, with and
without pipelining and recompute. The edge: layers of several kinds in one stage (dense layers first, MTP
depths on the last stage, 16-bit ends), interleaved stages."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import meshsim.sim.cost.memory as memory
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError

MLA = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 24}


def layers_memory_long_way(rs, layers):
    """Every layer's terms on their own (a one-layer list: no kind met twice), summed in order."""
    dense = expert = acts = biggest = 0
    for layer in layers:
        kind = memory.layer_kind(rs.scenario.model, layer, rs.scenario.run)
        p_dense, p_expert, act = memory._kind_terms(memory.layer_plan(rs, memory.layer_dims(rs)), kind)
        dense, expert, acts, biggest = dense + p_dense, expert + p_expert, acts + act, max(biggest, act)
    return dense, expert, acts, biggest


def pipeline_memory_long_way(rs):
    """Each stage term on its own (its own layout, layers and layers_memory), as memory.py did before."""
    stages = tuple(memory._breakdown(rs, memory.stage_param_split(rs, r)[0], memory.stage_activation_bytes(rs, r),
                                     memory.stage_param_split(rs, r)[1], memory.stage_layers(rs, r), r == rs.pp - 1)
                   for r in range(rs.pp))
    worst = max(range(rs.pp), key=lambda r: stages[r].total_gb)
    w = stages[worst]
    return memory.MemoryBreakdown(w.weights_gb, w.grads_gb, w.optimizer_gb, w.activations_gb, w.workspace_gb,
                                  w.total_gb, w.capacity_gb, w.fits, stages, worst, w.host_gb)


cases = st.fixed_dictionaries({
    "moe": st.booleans(), "dense_layers": st.sampled_from([0, 1, 2]), "mla": st.booleans(),
    "mtp": st.sampled_from([0, 0, 1]), "fp8": st.sampled_from(["off", "delayed", "tensorwise"]),
    "bf16_ends": st.booleans(), "pp": st.sampled_from([1, 2, 4]), "vp": st.sampled_from([1, 2]),
    "layers_per_chunk": st.sampled_from([1, 2, 3]), "tp": st.sampled_from([1, 2]),
    "recompute": st.sampled_from(["none", "selective", "full"]), "micro_batches": st.integers(1, 9),
    "distributed_optimizer": st.booleans(),
})


def resolved(c: dict):
    pp, tp = c["pp"], c["tp"]
    vp = c["vp"] if pp > 1 else 1
    layers = pp * vp * c["layers_per_chunk"]
    ep = 2 if c["moe"] else 1
    gpus = tp * pp * ep
    o = {"model.layers": layers, "model.hidden": 512, "model.seq_len": 256, "parallel.pp": pp, "parallel.vp": vp,
         "parallel.tp": tp, "parallel.sp": tp > 1, "parallel.gpus": gpus, "topology.nodes": max(1, gpus // 8),
         "parallel.dp": "auto", "parallel.micro_batch": 1, "parallel.recompute": c["recompute"],
         "parallel.distributed_optimizer": c["distributed_optimizer"], "run.fp8": c["fp8"],
         "run.fp8_first_last_layers_bf16": c["bf16_ends"] and c["fp8"] != "off",
         "parallel.global_batch": gpus // (tp * pp) * c["micro_batches"], "model.mtp_layers": c["mtp"]}
    if c["moe"]:
        o.update({"model.moe": {"experts": 4, "top_k": 2, "ffn_hidden": 256, "dense_layers": c["dense_layers"]},
                  "model.bias": False, "model.mlp": "swiglu", "parallel.ep": ep})
    if c["mla"]:
        o.update({"model.mla": MLA, "model.bias": False})
    scenario, source = load_scenario("tiny-2gpu")
    try:
        return resolve(with_overrides(scenario, o, source), source)
    except UserError:
        return None


kinds_met: list[bool] = []


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(c=cases)
def test_memory_once_per_kind_and_stage_equals_the_long_way(c):
    rs = resolved(c)
    assume(rs is not None)
    once = memory.memory_per_gpu(rs)
    layers = memory.model_layers(rs)
    assert memory.layers_memory(rs, layers) == layers_memory_long_way(rs, layers)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(memory, "layers_memory", layers_memory_long_way)
        m.setattr(memory, "pipeline_memory", pipeline_memory_long_way)
        long_way = memory.memory_per_gpu(rs)
    assert once == long_way
    kinds_met.append(memory.kinded(rs) and rs.pp > 1 and
                     len({memory.layer_kind(rs.scenario.model, n, rs.scenario.run) for n in layers}) > 1)


def test_several_kinds_were_met_in_pipelined_layouts():
    """Negative control (after the test above): the generator reached pipelined layouts of several kinds."""
    assert sum(kinds_met) >= 10, (sum(kinds_met), len(kinds_met))
