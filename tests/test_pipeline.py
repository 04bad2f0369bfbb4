"""Pipeline parallelism: Megatron's schedules op by op, the bubble of a uniform pipeline, memory per stage,
the validity rules, P2P on the topology, and one-rank-per-stage vs explicit ranks."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.units import GB
from meshsim.sim.cost.collectives.p2p import p2p_cost
from meshsim.sim.cost.memory import in_flight_micro_batches, memory_per_gpu
from meshsim.sim.engine import events as engine
from meshsim.sim.results.critical_path import critical_path, shares
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.ops import P2P, Collective
from meshsim.sim.schedule.pipeline import PipelineShape, describe, schedule_table, stage_order
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.topologies.registry import build_topology


def rs_with(**overrides):
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": 8, "parallel.tp": 1, "parallel.sp": False, "parallel.dp": "auto"}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


# ----- schedules, op by op (expected sequences written from Megatron's loops by hand) -----------------
def test_1f1b_order_p3_m4():
    s = PipelineShape(p=3, v=1, m=4, n=3, overlap=False)
    assert describe(stage_order(s, 0)) == [
        "F0", "send_fwd(0)", "F1", "send_fwd(1)",
        "F2", "send_fwd(2)+recv_bwd(0)", "B0",
        "F3", "send_fwd(3)+recv_bwd(1)", "B1",
        "recv_bwd(2)", "B2", "recv_bwd(3)", "B3"]
    assert describe(stage_order(s, 1)) == [
        "recv_fwd(0)", "F0", "send_fwd(0)", "recv_fwd(1)",
        "F1", "send_fwd(1)+recv_bwd(0)", "B0", "send_bwd(0)+recv_fwd(2)",
        "F2", "send_fwd(2)+recv_bwd(1)", "B1", "send_bwd(1)+recv_fwd(3)",
        "F3", "send_fwd(3)+recv_bwd(2)", "B2", "send_bwd(2)",
        "recv_bwd(3)", "B3", "send_bwd(3)"]
    assert describe(stage_order(s, 2)) == [
        "recv_fwd(0)", "F0", "B0", "send_bwd(0)+recv_fwd(1)", "F1", "B1", "send_bwd(1)+recv_fwd(2)",
        "F2", "B2", "send_bwd(2)+recv_fwd(3)", "F3", "B3", "send_bwd(3)"]


def test_1f1b_fewer_micro_batches_than_stages_is_all_warmup():
    s = PipelineShape(p=4, v=1, m=2, n=4, overlap=False)
    assert describe(stage_order(s, 0)) == ["F0", "send_fwd(0)", "F1", "send_fwd(1)",
                                           "recv_bwd(0)", "B0", "recv_bwd(1)", "B1"]


def test_interleaved_order_p3_v2_m3():
    s = PipelineShape(p=3, v=2, m=3, n=3, overlap=True)
    # stage 0: warm-up 2(p-1) + (v-1)N = 7 capped at v m = 6, so every forward first
    assert describe(stage_order(s, 0), 2) == [
        "F0.c0", "send_fwd(0.c0)", "F1.c0", "send_fwd(1.c0)", "F2.c0", "send_fwd(2.c0)+recv_fwd(0.c1)",
        "F0.c1", "send_fwd(0.c1)+recv_fwd(1.c1)", "F1.c1", "send_fwd(1.c1)+recv_fwd(2.c1)",
        "F2.c1", "send_fwd(2.c1)+recv_bwd(0.c1)",
        "B0.c1", "send_bwd(0.c1)+recv_bwd(1.c1)", "B1.c1", "send_bwd(1.c1)+recv_bwd(2.c1)",
        "B2.c1", "send_bwd(2.c1)+recv_bwd(0.c0)", "B0.c0", "recv_bwd(1.c0)", "B1.c0", "recv_bwd(2.c0)", "B2.c0"]
    # last stage: warm-up (v-1)N = 3; chunk 1 there is the last virtual stage (no send_fwd / recv_bwd)
    assert describe(stage_order(s, 2), 2) == [
        "recv_fwd(0.c0)", "F0.c0", "send_fwd(0.c0)+recv_fwd(1.c0)", "F1.c0", "send_fwd(1.c0)+recv_fwd(2.c0)",
        "F2.c0", "send_fwd(2.c0)+recv_fwd(0.c1)",
        "F0.c1", "recv_fwd(1.c1)", "B0.c1", "send_bwd(0.c1)",
        "F1.c1", "recv_fwd(2.c1)", "B1.c1", "send_bwd(1.c1)",
        "F2.c1", "B2.c1", "send_bwd(2.c1)+recv_bwd(0.c0)",
        "B0.c0", "send_bwd(0.c0)+recv_bwd(1.c0)", "B1.c0", "send_bwd(1.c0)+recv_bwd(2.c0)", "B2.c0", "send_bwd(2.c0)"]


def test_interleaved_without_overlap_batches_the_steady_round():
    s = PipelineShape(p=2, v=2, m=2, n=2, overlap=False)
    # stage 1: warm-up (v-1)N = 2; steady F then B then one batch of both sends and both receives
    assert describe(stage_order(s, 1), 2) == [
        "recv_fwd(0.c0)", "F0.c0", "send_fwd(0.c0)+recv_fwd(1.c0)", "F1.c0", "send_fwd(1.c0)+recv_fwd(0.c1)",
        "F0.c1", "B0.c1", "send_bwd(0.c1)+recv_fwd(1.c1)", "F1.c1", "B1.c1", "send_bwd(1.c1)+recv_bwd(0.c0)",
        "B0.c0", "send_bwd(0.c0)+recv_bwd(1.c0)", "B1.c0", "send_bwd(1.c0)"]


def test_schedule_table_groups_and_partial_last_group():
    assert schedule_table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert schedule_table(5, 2, 3) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1),
                                       (3, 0), (4, 0), (3, 1), (4, 1)]


def test_every_send_has_exactly_one_matching_receive():
    rs = rs_with(**{"model.layers": 8, "parallel.pp": 4, "parallel.vp": 2, "parallel.global_batch": 32})
    posts: dict[tuple, list[bool]] = {}
    for sched in build_stage_schedules(rs):
        for op in sched.ops:
            if isinstance(op.work, P2P):
                for t in op.work.transfers:
                    src, dst = (sched.stage, t.peer_stage) if t.send else (t.peer_stage, sched.stage)
                    posts.setdefault((src, dst, t.direction, t.micro_batch, t.sender_vstage), []).append(t.send)
    assert posts and all(sorted(v) == [False, True] for v in posts.values())
    assert len(posts) == 2 * (4 * 2 - 1) * rs.micro_batches  # every virtual-stage boundary, both directions


# ----- the bubble of a uniform pipeline with free communication ------------------------------------
def _uniform_bubble(p: int, v: int, m: int, layers: int) -> tuple[float, float]:
    overrides = {"model.layers": layers, "parallel.pp": p, "parallel.vp": v, "parallel.gpus": p,
                 "parallel.global_batch": m * 2}
    rs = rs_with(**overrides)
    schedules = build_stage_schedules(rs)

    def compute_s(op, rank):  # every layer's fwd op 1 ms, bwd op 2 ms; embedding, head, optimizer free
        return 0.0 if op.layer is None else (1e-3 if op.phase == "fwd" else 2e-3)

    def free(*_):
        return 0.0, 0.0, {}

    ranks = tuple(range(p))
    log = engine.run(schedules, ranks, compute_s, free, rs.group, stage_of=rs.stage_of, p2p=free)
    ideal_s = sum(compute_s(op, 0) for op in schedules[0].ops)
    path = critical_path(schedules, log)
    bubble_s = shares(path, log.step_time_s, pipeline=True)["pipeline_bubble"] * log.step_time_s
    return bubble_s / ideal_s, (log.step_time_s - ideal_s) / ideal_s


@pytest.mark.parametrize(("p", "v", "m", "layers"), [(4, 1, 8, 8), (2, 1, 5, 4), (4, 2, 8, 16), (4, 3, 8, 12)])
def test_uniform_pipeline_bubble_is_p_minus_1_over_v_m(p, v, m, layers):
    on_path, step_excess = _uniform_bubble(p, v, m, layers)
    expected = (p - 1) / (v * m)
    assert on_path == pytest.approx(expected, rel=0.01)
    assert step_excess == pytest.approx(expected, rel=0.01)


# ----- memory per stage (hand-computed) ------------------------------------------------------------
def test_memory_per_stage_1f1b_by_hand():
    rs = rs_with(**{"model.layers": 4, "parallel.pp": 2, "parallel.gpus": 2, "parallel.global_batch": 8})
    mem = memory_per_gpu(rs)
    s, b, h, vocab = 128, 2, 256, 1024
    per_layer = s * b * 32 * h  # no dropout, flash, tp 1: 8h outside + 8h attention + 16h gelu MLP per token
    layer_params = 12 * h * h + 13 * h  # qkv, proj, fc1, fc2 with biases, two LayerNorms
    stage0_acts = 2 * per_layer * 2  # 2 layers x p - 0 = 2 micro-batches in flight
    stage1_acts = 2 * per_layer * 1 + 2 * s * b * h * 2 + 4 * s * b * vocab  # + norm/logits inputs, fp32 logits
    assert mem.stages[0].activations_gb == pytest.approx(stage0_acts / GB)
    assert mem.stages[1].activations_gb == pytest.approx(stage1_acts / GB)
    assert mem.stages[0].weights_gb == pytest.approx((2 * layer_params + vocab * h) * 2 / GB)
    assert mem.stages[1].weights_gb == pytest.approx((2 * layer_params + vocab * h + 2 * h) * 2 / GB)
    assert mem.total_gb == max(st.total_gb for st in mem.stages)
    assert mem.fits == all(st.fits for st in mem.stages)


def test_interleaved_first_stage_holds_korthikanti_factor():
    rs = rs_with(**{"model.layers": 8, "parallel.pp": 4, "parallel.vp": 2, "parallel.global_batch": 32})
    p, v = 4, 2
    assert in_flight_micro_batches(rs, 0) == pytest.approx(p * (1 + (p - 1) / (v * p)))
    plain = rs_with(**{"model.layers": 8, "parallel.pp": 4, "parallel.global_batch": 32})
    assert [in_flight_micro_batches(plain, r) for r in range(4)] == [4, 3, 2, 1]


# ----- P2P on the topology -------------------------------------------------------------------------
def test_p2p_uses_nvlink_inside_a_node_and_the_rail_across_nodes():
    topo = build_topology("dgx-h100", 2)
    nbytes = 64 * 2**20
    inside, across = p2p_cost(topo, 0, 1, nbytes), p2p_cost(topo, 0, 8, nbytes)
    assert {topo.links[i].kind for i in topo.route(0, 8)} >= {"ib"}
    assert across.bandwidth_s > 5 * inside.bandwidth_s  # 50 GB/s NIC vs 450 GB/s NVLink
    copies = [(i, 8 + i) for i in range(8)]  # every GPU sends to its peer on the other node, one rail each
    assert p2p_cost(topo, 0, 8, nbytes, concurrent=copies).bandwidth_s == pytest.approx(across.bandwidth_s)


# ----- whole steps --------------------------------------------------------------------------------
def test_one_rank_per_stage_agrees_with_explicit_ranks():
    rs = rs_with(**{"model.layers": 4, "parallel.pp": 2, "parallel.tp": 2, "parallel.global_batch": 8,
                    "parallel.distributed_optimizer": True, "model.tied_embeddings": True})
    assert (rs.tp, rs.dp, rs.pp) == (2, 2, 2)
    one, every = simulate(rs), simulate(rs, explicit_ranks=True)
    assert (one.simulated_ranks, every.simulated_ranks) == (2, 8)
    assert every.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)


def test_pipeline_result_names_bubble_and_p2p():
    rs = rs_with(**{"model.layers": 8, "parallel.pp": 4, "parallel.vp": 2, "parallel.global_batch": 16})
    r = simulate(rs)
    assert r.pipeline.bubble_fraction > 0 and r.pipeline.p2p_share > 0
    assert set(r.critical_path_share) >= {"pipeline_bubble", "pp_comm"}
    assert sum(r.critical_path_share.values()) == pytest.approx(1.0)
    assert r.breakdown_s["pipeline_bubble"] > 0
    assert r.to_dict()["pp"] == 4 and r.memory_gb.stages[0].stage == 0


def test_tied_embedding_gradient_all_reduce_on_first_and_last_stage_only():
    rs = rs_with(**{"model.layers": 4, "parallel.pp": 4, "parallel.gpus": 4, "parallel.global_batch": 8,
                    "model.tied_embeddings": True})
    has = [any(isinstance(op.work, Collective) and op.work.group == "embed" for op in s.ops)
           for s in build_stage_schedules(rs)]
    assert has == [True, False, False, True]
    assert simulate(rs).step_time_s > 0


# ----- the validity rules ------------------------------------------------------------------------------
INVALID = {
    "layers": ({"model.layers": 6, "parallel.pp": 4}, "parallel.pp", "must divide model.layers"),
    "vp-needs-pp": ({"parallel.vp": 2}, "parallel.vp", "pp > 1"),
    "interleave-pp2": ({"model.layers": 4, "parallel.pp": 2, "parallel.vp": 2, "parallel.global_batch": 8},
                       "parallel.vp", "p2p_overlap: false"),
    "group-size": ({"model.layers": 8, "parallel.pp": 4, "parallel.vp": 2, "parallel.global_batch": 4},
                   "parallel.global_batch", "pp <= microbatch_group_size <= micro-batches"),
    "dependency-bubble": ({"model.layers": 8, "parallel.pp": 4, "parallel.vp": 2, "parallel.gpus": 4,
                           "parallel.global_batch": 12}, "parallel.global_batch", "dependency-bubble"),
    "tp-pp-dp": ({"parallel.pp": 2, "parallel.tp": 2, "parallel.dp": 4}, "parallel.dp", "tp x pp x dp"),
    "pp-divides-gpus": ({"parallel.pp": 3, "model.layers": 3}, "parallel.pp", "tp x pp x dp = GPUs"),
    "uneven-with-vp": ({"model.layers": 8, "parallel.pp": 4, "parallel.vp": 2, "parallel.first_stage_layers": 1},
                       "parallel.first_stage_layers", "vp = 1"),
    "uneven-rest": ({"model.layers": 8, "parallel.pp": 4, "parallel.first_stage_layers": 1},
                    "parallel.first_stage_layers", "evenly"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_pipeline_configs_are_refused_with_their_rule(case):
    overrides, field, fragment = INVALID[case]
    with pytest.raises(Exception) as info:
        rs_with(**overrides)
    message = str(info.value)
    assert message.startswith("builtin:tiny-2gpu: " + field), message
    assert fragment in message and "Fix: " in message


def test_an_indivisible_split_names_the_option_that_keeps_pp_and_vp():
    """94 layers on pp 8 x vp 4 (Qwen3-235B's H100 recipe): no pp divides 94 at vp 4, but counting the
    embedding and the loss as layers does (96 = 32 x 3), so the fix names those options, and applying it
    loads; 93 layers have no such option and the fix points to a written-out layout (vp = 1: the uneven
    first/last stages too)."""
    base = {"model.layers": 94, "parallel.pp": 8, "parallel.vp": 4, "parallel.gpus": 8,
            "parallel.global_batch": 16}
    with pytest.raises(Exception) as info:
        rs_with(**base)
    fix = str(info.value).split("Fix: ")[1]
    assert "parallel.account_for_embedding_in_split: true and parallel.account_for_loss_in_split: true" in fix
    assert "96 / 32 = 3 per virtual stage" in fix
    rs = rs_with(**base, **{"parallel.account_for_embedding_in_split": True,
                            "parallel.account_for_loss_in_split": True})
    assert rs.pp == 8 and rs.vp == 4
    with pytest.raises(Exception) as info:  # one option set already: only the other one is offered
        rs_with(**base, **{"parallel.account_for_embedding_in_split": True})
    fix = str(info.value).split("Fix: ")[1]
    assert "or set parallel.account_for_loss_in_split: true (96 / 32 = 3 per virtual stage)" in fix
    with pytest.raises(Exception) as info:
        rs_with(**{**base, "model.layers": 93})
    assert "account_for" not in str(info.value) and "parallel.pipeline_layout (32 '|'-separated segments)" \
        in str(info.value)
    with pytest.raises(Exception) as info:
        rs_with(**{**base, "model.layers": 91, "parallel.vp": 1})
    assert "parallel.first_stage_layers / last_stage_layers" in str(info.value)


def test_uneven_and_embedding_accounting_splits():
    from meshsim.sim.schedule.pipeline_layout import pipeline_layout

    rs = rs_with(**{"model.layers": 8, "parallel.pp": 4, "parallel.first_stage_layers": 2,
                    "parallel.last_stage_layers": 2})
    layout = pipeline_layout(rs.scenario.parallel, 8)
    assert [list(st[0].layers) for st in layout] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    rs = rs_with(**{"model.layers": 6, "parallel.pp": 4, "parallel.account_for_embedding_in_split": True,
                    "parallel.account_for_loss_in_split": True})
    layout = pipeline_layout(rs.scenario.parallel, 6)
    assert [len(st[0].layers) for st in layout] == [1, 2, 2, 1]
    assert layout[0][0].embedding and layout[3][0].head
    assert simulate(rs).step_time_s > 0


# ----- sweeps over tp x pp ----------------------------------------------------------------------------
def test_sweep_over_pp_skips_invalid_combinations_and_explains_the_bubble():
    from meshsim.sim.sweep.axes import configurations, sweep_axes
    from meshsim.sim.sweep.explain import explain
    from meshsim.sim.sweep.runner import run_sweep

    scenario, source = load_scenario("tiny-2gpu")
    scenario = with_overrides(scenario, {"parallel.gpus": 8, "model.layers": 4, "parallel.global_batch": 16,
                                         "hardware.mem_gb": 1.03}, source)
    points = configurations(sweep_axes(scenario, {"tp": "2", "pp": "1,2,3,4", "sp": "off"}))
    assert [p.pp for p in points] == [1, 2, 3, 4] and points[0].key == "tp=2,sp=off,mb=2,overlap=off,recompute=none"
    records = run_sweep(scenario, source, points, progress=False)
    status = {r.point.pp: r.status for r in records}
    assert status == {1: "ok", 2: "ok", 3: "skipped", 4: "ok"}
    skipped = next(r for r in records if not r.ok)
    assert "must divide model.layers" in skipped.reason
    text = " ".join(explain(records))
    assert "pipeline bubble" in text and "P2P" in text and "pp=2 is what makes it fit" in text


def test_the_work_limit_counts_every_stage_of_every_run():
    """A pipeline simulates every stage, so a run's work is model.layers x its micro-batches whatever pp
    is, checked before each run (as a bound on its ops, scenarios/limits.py): GPT-3 175B (96 layers, pp 8)
    with 144 micro-batches loads, but its whole step (an op bound of 1,248,160) is refused before any work; a 100-stage pipeline of 1,000 micro-batches is
    refused at its steady-state runs (the first, 100 x 201, fits the op limit; the retry with later cuts,
    100 x 303, does not). The rule of main before issue 21 counted one stage's
    layers and let both through (the second ran 62 s and 850 MB)."""
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.core.errors import UserError
    from meshsim.sim.results.simulate import simulate

    scenario, source = load_scenario("gpt3-175b-a100-pp8")
    big = {"topology.nodes": 128, "parallel.vp": 12, "parallel.global_batch": 16 * 144}
    rs = resolve(with_overrides(scenario, big, source), source)
    assert (rs.dp, rs.micro_batches, rs.pp, rs.vp) == (16, 144, 8, 12)
    with pytest.raises(UserError, match=r"by the whole step .*96 layers x 144 micro-batches x <= 80 ops per layer "
                                        r"pass, is 1,248,160 .* at most 138 micro-batches"):
        simulate(rs, full=True)
    tiny, tiny_source = load_scenario("tiny-2gpu")
    deep = {"model.layers": 100, "parallel.pp": 100, "parallel.tp": 1, "parallel.sp": False, "parallel.gpus": 100,
            "topology.nodes": 13, "parallel.global_batch": 1000, "parallel.micro_batch": 1, "parallel.dp": "auto"}
    rs = resolve(with_overrides(tiny, deep, tiny_source), tiny_source)
    with pytest.raises(UserError, match=r"steady state's run, bounded by 100 layers x 303 micro-batches .* use fewer "
                                        r"pipeline stages"):
        simulate(rs)


def test_each_stage_gathers_its_parameters_after_the_optimizer_without_overlap_param_gather():
    """parallel.overlap_param_gather false on a pipeline: every stage's distributed-optimizer all-gathers
    follow its optimizer step instead of opening the step."""
    base = {"model.layers": 8, "parallel.pp": 4, "parallel.global_batch": 32, "parallel.gpus": 8,
            "parallel.dp": "auto", "parallel.distributed_optimizer": True}

    def gathers_after_step(overrides):
        out = []
        for sched in build_stage_schedules(rs_with(**base, **overrides)):
            step = next(op.id for op in sched.ops if op.name == "opt.step")
            out += [op.id > step for op in sched.ops if op.name.startswith("dp.") and op.name.endswith("all_gather")]
        return out

    overlapped, trailing = gathers_after_step({}), gathers_after_step({"parallel.overlap_param_gather": False})
    assert overlapped and not any(overlapped)
    assert trailing and all(trailing)
