"""parallel.moe_ep_overlap (Megatron's combined 1F1B, sim/schedule/ep_overlap.py) and delay_wgrad_compute:
an exact hand-built layer pair with closed-form times, the node split of a real MoE layer, the schedule of a
small MoE scenario (overlap on vs off), and the load rules. Steady-state extrapolation of the combined
schedule is tested in tests/test_steady_state.py."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.memory import activation_bytes, combined_1f1b_activations, layers_memory
from meshsim.sim.engine.events import run
from meshsim.sim.results.simulate import simulate_with_events
from meshsim.sim.schedule.ep_nodes import layer_nodes
from meshsim.sim.schedule.ep_overlap import Chain, Emitter, layer_pair
from meshsim.sim.schedule.layer_kinds import LayerKind, kind_templates, layer_plan
from meshsim.sim.schedule.ops import Collective, Elementwise, Op, Schedule
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.sim.schedule.template import Template

# ----- an exact layer pair: forward of micro-batch 1 with backward of micro-batch 0 -------------------------
# durations in seconds: forward attention A, experts E; backward experts' dgrad G and wgrad W, the norm's
# gradient L, attention Ab; every all-to-all C (a latency: one rank, so no peer to wait for)
A, G, W, L, AB, C = 4.0, 2.0, 2.0, 1.0, 4.0, 3.0


def _k(name: str) -> Elementwise:
    return Elementwise(name, 0, 0)


def _a2a(key: str) -> Collective:
    return Collective("all_to_all", "ep", 1, key)


def pair_templates() -> tuple[Template, Template]:
    """A MoE layer reduced to one op per Megatron node (the keys ep_nodes.py splits on)."""
    f = Template()
    a = f.add("fwd", "attn", _k("attn"), ("in",))
    d = f.add("fwd", "dispatch", _a2a("dispatch"), (a,))
    e = f.add("fwd", "expert_fc1", _k("expert_fc1"), (d,))
    f.marks["out"] = f.add("fwd", "combine", _a2a("combine"), (e,))
    b = Template()
    c = b.add("bwd", "combine", _a2a("combine"), ("gin",))
    g = b.add("bwd", "expert_fc1_dgrad", _k("expert_fc1_dgrad"), (c,))
    b.add("bwd", "expert_fc1_wgrad", _k("expert_fc1_wgrad"), (c,))
    d = b.add("bwd", "dispatch", _a2a("dispatch"), (g,))
    ln = b.add("bwd", "ln2_grad_add", _k("ln2_grad_add"), (d,))
    b.marks["out"] = b.add("bwd", "attn", _k("attn_bwd"), (ln,))
    return f, b


def pair_log(expert_s: float, overlap: bool, delay: bool):
    """Run the pair (overlap) or the forward then the backward (serial) on one rank; events by name."""
    f_tpl, b_tpl = pair_templates()
    ops = [Op(0, "x.y.start", "compute", "compute", "fwd", _k("start"))]
    em = Emitter(ops, delay)
    fwd, bwd = Chain(1, out=0), Chain(0, out=0)
    f = em.stamp(f_tpl, fwd, "L0.mb1.", "in", 0, False)
    b = em.stamp(b_tpl, bwd, "L0.mb0.", "gin", 0, True)
    if overlap:
        layer_pair(em, f, b, b_ends=False)
    else:
        layer_pair(em, f, None, b_ends=False)
        layer_pair(em, None, b, b_ends=False)
    dur = {"start": 0.0, "attn": A, "expert_fc1": expert_s, "expert_fc1_dgrad": G, "expert_fc1_wgrad": W,
           "ln2_grad_add": L, "attn_bwd": AB}
    log = run(Schedule(tuple(ops), 1, 1, 2), [0], lambda op, rank: dur[op.work.kernel],
              lambda op, group: (C, 0.0, {}), lambda kind, rank: (rank,))
    return {e.name.split(".", 2)[2]: (e.start_s, e.end_s) for e in log.events}, log.step_time_s


def test_the_dispatch_and_combine_run_under_the_other_micro_batchs_compute():
    """E = 5: the compute stream never idles, so the step is the compute alone, A + G + W + E + L + Ab = 18,
    against 2 (A + E) + G + W + L + Ab + 4 C = 30 serially. Event by event (comm | comp):
    b.combine 0-3 | f.attn 0-4; f.dispatch 4-7 under b.dgrad 4-6 and b.wgrad 6-8; b.dispatch waits for the
    mlp node's end (its wgrad, 8): 8-11 under f.expert 8-13; f.combine 13-16 under b.ln2 13-14, b.attn 14-18."""
    e = 5.0
    ev, step_s = pair_log(e, overlap=True, delay=False)
    assert ev == {"start": (0.0, 0.0), "bwd.combine": (0.0, C), "fwd.attn": (0.0, A),
                  "bwd.expert_fc1_dgrad": (A, A + G), "fwd.dispatch": (A, A + C),
                  "bwd.expert_fc1_wgrad": (A + G, A + G + W), "bwd.dispatch": (A + G + W, A + G + W + C),
                  "fwd.expert_fc1": (A + G + W, A + G + W + e), "fwd.combine": (8 + e, 8 + e + C),
                  "bwd.ln2_grad_add": (8 + e, 8 + e + L), "bwd.attn": (8 + e + L, 8 + e + L + AB)}
    assert step_s == A + G + W + e + L + AB == 18.0
    serial = pair_log(e, overlap=False, delay=False)[1]  # negative control: the serial time
    assert serial == (A + C + e + C) + (C + G + W + C + L + AB) == 30.0


def test_delayed_wgrad_lets_the_dispatch_backward_overlap_the_experts_weight_gradient():
    """E = 1: the backward dispatch is exposed. Without delay it starts when the mlp node ends with its
    wgrad, A + G + W = 8, and the step is 8 + C + L + Ab = 16; with delay_wgrad_compute the wgrad leaves the
    node, the dispatch waits only for the dgrad (6) and the stream (f.dispatch ends A + C = 7): 7 + C + L +
    Ab = 15."""
    ev, step_s = pair_log(1.0, overlap=True, delay=False)
    assert ev["bwd.dispatch"] == (A + G + W, A + G + W + C) and step_s == A + G + W + C + L + AB == 16.0
    ev, step_s = pair_log(1.0, overlap=True, delay=True)
    assert ev["bwd.dispatch"] == (A + C, A + 2 * C) and ev["bwd.expert_fc1_wgrad"] == (A + G, A + G + W)
    assert step_s == A + 2 * C + L + AB == 15.0


# ----- a real MoE layer ----------------------------------------------------------------------------------------
MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def tiny(overrides: dict, micro_batches: int = 4, gpus: int = 16):
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": gpus, "parallel.tp": 1, "parallel.global_batch": micro_batches * gpus,
            "parallel.micro_batch": 1, "topology.nodes": 2, "parallel.ep": 8, "hardware.compute.host_dispatch_us": 0,
            **copy.deepcopy(MOE)}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def node_keys(tpl, backward: bool, delay: bool) -> dict[str, list[str]]:
    nodes = layer_nodes(tpl, backward, delay).nodes
    return {n: [tpl.ops[i].suffix.split(".", 1)[1] for i in idxs] for n, idxs in nodes.items()}


def test_megatrons_nodes_of_an_alltoall_moe_layer():
    rs = tiny({"parallel.ep": 4, "parallel.moe_ep_overlap": True}, gpus=8)
    fwd, bwd = kind_templates(layer_plan(rs, layer_dims(rs)), LayerKind(moe=True))
    f = node_keys(fwd, False, False)
    assert f["pre_dispatch"][0] == "ln1" and f["pre_dispatch"][-3:] == ["route", "dispatch_meta", "permute"]
    assert (f["dispatch"], f["mlp"], f["combine"]) == (
        ["dispatch", "dispatch_probs"], ["sort_chunks", "expert_fc1", "expert_act", "expert_fc2", "unsort_chunks"],
        ["combine", "unpermute", "mlp_res"])
    b = node_keys(bwd, True, True)
    assert (b["combine"], b["dispatch"]) == (["unpermute", "combine"], ["dispatch_probs", "dispatch"])
    assert b["mlp"] == ["unsort_chunks", "expert_fc2_dgrad", "expert_act", "expert_fc1_dgrad", "sort_chunks"]
    assert b["mlp_dw"] == ["expert_fc2_wgrad", "expert_fc1_wgrad"]
    assert b["pre_dispatch_dw"] == ["proj_wgrad", "qkv_wgrad"]  # the router's weight gradient stays
    assert "router_wgrad" in b["pre_dispatch"] and b["pre_dispatch"][-1] == "ln1_grad_add"
    assert node_keys(bwd, True, False)["mlp_dw"] == []  # without delay the wgrads stay in their node


def overlapping(log, a, b, rank: int = 0) -> bool:
    ea, eb = log.get(rank, a.id), log.get(rank, b.id)
    return ea.start_s < eb.end_s and eb.start_s < ea.end_s


def test_the_schedule_pairs_micro_batch_i_forward_with_i_minus_1_backward():
    """Overlap on: the dispatch all-to-alls of micro-batch 2's forward run while the compute stream runs
    micro-batch 1's backward, and the step is shorter; off (negative control): none overlaps another
    micro-batch's compute, the serial order of gradient accumulation."""
    steps = {}
    for on in (True, False):
        result, log, sched = simulate_with_events(tiny({"parallel.moe_ep_overlap": on}))
        steps[on] = result.step_time_s
        a2a = [op for op in sched.ops if op.phase == "fwd" and op.name.endswith(".dispatch") and op.micro_batch == 2]
        other = [op for op in sched.ops if op.stream == "compute" and op.micro_batch == 1 and op.phase == "bwd"]
        hidden = [x for x in a2a if any(overlapping(log, x, y) for y in other)]
        assert len(a2a) == 2 and len(hidden) == (2 if on else 0)
    assert steps[True] < steps[False]


@pytest.mark.parametrize("overrides,words", [
    ({"parallel.moe_ep_overlap": True, "parallel.pp": 2, "model.layers": 4}, "needs virtual stages"),
    ({"parallel.moe_ep_overlap": True, "parallel.recompute": "full"}, "full recompute"),
])
def test_combinations_megatron_or_meshsim_refuse(overrides, words):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert err.value.field == "parallel.moe_ep_overlap" and words in str(err.value) and "\n" not in str(err.value)


def test_combined_1f1b_holds_one_micro_batch_and_one_layer_of_activations():
    """Forward layer l of micro-batch i beside backward layer L-1-l of i - 1: l + 1 and L - l layers, L + 1 in
    all for alike layers (tiny: 2 MoE layers, so 3 layers' worth against 2 without the overlap)."""
    off, on = tiny({}), tiny({"parallel.moe_ep_overlap": True})
    one_layer = layers_memory(off, [0])[2]
    assert layers_memory(off, [0, 1])[2] == 2 * one_layer
    assert combined_1f1b_activations(off) is None and combined_1f1b_activations(on) == 3 * one_layer
    assert activation_bytes(on) - activation_bytes(off) == one_layer
    assert combined_1f1b_activations(tiny({"parallel.moe_ep_overlap": True}, micro_batches=1)) is None


def test_the_combined_schedule_keeps_the_forwards_host_syncs():
    """The MoE forward's host syncs (sim/schedule/moe_sync.py) survive the combined 1F1B's re-ordering:
    every micro-batch's forward dispatch waits for the same op as without overlap, an op emitted before it."""
    waits = {}
    for on in (True, False):
        sched = simulate_with_events(tiny({"parallel.moe_ep_overlap": on}))[2]
        by_id = {op.id: op for op in sched.ops}
        pairs = {(op.name, by_id[op.host_wait].name) for op in sched.ops if op.host_wait is not None}
        assert all(op.host_wait < op.id for op in sched.ops if op.host_wait is not None)
        waits[on] = pairs
    assert waits[True] and waits[True] == waits[False]
