"""Context parallelism: chunk assignment, closed-form ring / all-to-all / all-gather byte counts, the mesh's
cp groups, the ring shift's cost, an exact event log on a tiny cp = 2 case, and one test per CP check."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.engine.events import run, symmetric_groups
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.cp_ops import rank_chunks
from meshsim.sim.schedule.ops import Attention, Collective
from meshsim.sim.schedule.shapes import layer_dims

US = 1e-6
# tiny-2gpu (4 heads of 64, seq 128, micro-batch 2) as tp 1 x cp 2: each rank holds 64 tokens
TINY_CP = {"parallel.tp": 1, "parallel.cp": 2, "parallel.sp": False, "model.layers": 1, "parallel.global_batch": 2}


def tiny(**extra):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, {**TINY_CP, **extra}, source), source)


def ops_named(schedule, part: str):
    return [op for op in schedule.ops if part in op.name]


def test_rank_chunks_cover_the_sequence_once_and_balance_the_causal_work():
    for cp in (1, 2, 3, 4, 8):
        chunks = [c for r in range(cp) for c in rank_chunks(r, cp)]
        assert sorted(chunks) == list(range(2 * cp))
        # causal work of chunk k (c queries, keys 0 .. (k + 1) c): (k + 1/2) c^2; each rank's pair: 2 cp c^2
        work = [sum(k + 0.5 for k in rank_chunks(r, cp)) for r in range(cp)]
        assert work == [2.0 * cp] * cp
    assert rank_chunks(0, 4) == (0, 7) and rank_chunks(3, 4) == (3, 4)


def test_p2p_ring_bytes_and_counts_in_closed_form():
    """Forward: cp - 1 shifts of the local K and V = 2 x (s/cp) b kv_heads d x 2 B; backward: cp shifts, KV
    first, KV + dKV in between, dKV last."""
    cp, s, b, heads, d = 4, 128, 2, 4, 64
    rs = tiny(**{"parallel.cp": cp, "parallel.gpus": 4, "parallel.global_batch": 2})
    kv = 2 * (s // cp) * b * heads * d * 2
    sched = build_schedule(rs)
    fwd = [op.work for op in sched.ops if op.phase == "fwd" and "cp_ring" in op.name]
    bwd = [op.work for op in sched.ops if op.phase == "bwd" and "cp_ring" in op.name]
    assert [(w.op, w.group, w.nbytes) for w in fwd] == [("send_recv", "cp", kv)] * (cp - 1)
    assert [w.nbytes for w in bwd] == [kv, 2 * kv, 2 * kv, kv]
    assert all(op.stream == "cp_comm" for op in ops_named(sched, "cp_ring"))


def test_ring_attention_flops_are_the_causal_total_over_cp():
    """The cp ring steps of one rank do 1/cp of the causal attention of the whole sequence."""
    for cp in (2, 4):
        rs = tiny(**{"parallel.cp": cp, "parallel.gpus": cp})
        steps = [op.work for op in build_schedule(rs).ops if op.phase == "fwd" and isinstance(op.work, Attention)]
        assert len(steps) == cp
        whole = Attention(2, 4, 4, 128, 64, True)
        assert sum(a.flops for a in steps) == pytest.approx(whole.flops / cp)
        assert len({a.flops for a in steps}) == 1  # balanced: every step the same work


def test_a2a_and_allgather_bytes_in_closed_form():
    s, b, d, cp = 128, 2, 64, 2
    q = (s // cp) * b * 4 * d * 2  # this rank's 64 tokens x 4 heads
    a2a = build_schedule(tiny(**{"parallel.cp_comm": "a2a"}))
    fwd = [(op.name.rsplit(".", 1)[1], op.work.nbytes) for op in a2a.ops
           if op.phase == "fwd" and isinstance(op.work, Collective) and op.work.group == "cp_a2a"]
    assert fwd == [("cp_a2a_q", q), ("cp_a2a_k", q), ("cp_a2a_v", q), ("cp_a2a_out", q)]
    core = [op.work for op in a2a.ops if op.phase == "fwd" and isinstance(op.work, Attention)]
    assert [(a.seq, a.heads, a.kv_seq) for a in core] == [(s, 2, None)]  # whole sequence, heads / cp
    ag = build_schedule(tiny(**{"parallel.cp_comm": "allgather"}))
    gathers = [op.work for op in ag.ops if isinstance(op.work, Collective) and op.work.group == "cp"]
    assert [(w.op, w.nbytes) for w in gathers] == [("all_gather", cp * q)] * 4 + [("reduce_scatter", cp * q)] * 2
    chunks = [op.work for op in ag.ops if op.phase == "fwd" and isinstance(op.work, Attention)]
    assert [(a.seq, a.kv_seq) for a in chunks] == [(32, 32), (32, 128)]  # rank 0: chunks 0 and 3


def test_every_other_op_runs_on_s_over_cp_tokens():
    rs = tiny()
    assert layer_dims(rs).tokens == 128 * 2 // 2
    qkv = next(op.work for op in build_schedule(rs).ops if op.name.endswith("fwd.qkv"))
    assert qkv.m == 128


def test_mesh_order_tp_cp_dp_pp():
    """tp 2 x cp 2 x dp 2 x pp 2 = 16 ranks: rank = tp_rank + 2 (cp_rank + 2 (dp_rank + 2 stage))."""
    g = lambda kind, r, **kw: mesh_group(kind, r, 2, 2, pp=2, cp=2, **kw)  # noqa: E731
    assert g("tp", 5) == (4, 5)
    assert g("cp", 5) == (5, 7) and g("cp", 0) == (0, 2)
    assert g("dp", 5) == (1, 3, 5, 7)  # the dp-cp group: gradients over dp x cp
    assert g("pp", 5) == (5, 13)
    four = lambda kind, r: mesh_group(kind, r, 2, 1, cp=4, cp_a2a=2)  # noqa: E731
    assert four("cp", 1) == (1, 3, 5, 7)
    assert four("cp_a2a", 5) == (5, 7) and four("cp_p2p", 5) == (1, 5)
    rs = tiny(**{"parallel.gpus": 8, "parallel.tp": 2, "parallel.cp": 2, "parallel.global_batch": 4})
    assert rs.dp == 2 and rs.grad_dp == 4 and rs.stage_size == 8
    assert rs.all_groups("cp") == ((0, 2), (1, 3), (4, 6), (5, 7))


def test_ring_shift_cost_is_latency_plus_bytes_over_the_link():
    """A ring shift moves S once through each member's port: on NVSwitch a ring of 4 costs what a pair
    costs, the bandwidth part is linear in S, and a pair across nodes runs at the NIC's rate (busbw = algbw)."""
    from meshsim.sim.cost.collectives.cost import collective_cost
    from meshsim.topologies.registry import build_topology

    topo = build_topology("dgx-h100", 2)
    nbytes = 64 << 20
    pair = collective_cost(topo, "send_recv", (0, 1), nbytes, protocol="simple")
    ring = collective_cost(topo, "send_recv", (0, 2, 4, 6), nbytes, protocol="simple")
    double = collective_cost(topo, "send_recv", (0, 1), 2 * nbytes, protocol="simple")
    across = collective_cost(topo, "send_recv", (0, 8), nbytes, protocol="simple")
    assert ring.bandwidth_s == pytest.approx(pair.bandwidth_s)
    assert double.bandwidth_s == pytest.approx(2 * pair.bandwidth_s)
    nic_bytes_s = min(topo.links[i].bw_gbps for i in topo.route(0, 8)) * 1e9
    assert nbytes / nic_bytes_s <= across.bandwidth_s <= 1.25 * nbytes / nic_bytes_s
    assert pair.busbw_gbps == pytest.approx(pair.algbw_gbps)


# ----- exact event log: tiny cp = 2, one layer, compute 10 us per op, every collective 1 + 14 us -----------
COMPUTE_US, LAT_US, BW_US = 10.0, 1.0, 14.0


@pytest.fixture(scope="module")
def cp_log():
    sched = build_schedule(tiny())

    def collective(op, group):
        return LAT_US * US, BW_US * US, {op.id: 1.0}

    log = run(sched, [0, 1], lambda op, rank: COMPUTE_US * US, collective, symmetric_groups(1, 1, cp=2))
    return sched, {(e.rank, sched.ops[e.op_id].name): (e.start_s / US, e.end_s / US) for e in log.events}


def test_event_log_forward_ring(cp_log):
    """qkv ends at T; the shift and the diagonal step start at T; step 1 waits for the KV (T + 15), so 5 us
    of the shift are exposed; the merge follows step 1."""
    _, ev = cp_log
    t = ev[(0, "L0.mb0.fwd.qkv")][1]
    assert ev[(0, "L0.mb0.fwd.cp_ring_c0")] == pytest.approx((t, t + 15))
    assert ev[(0, "L0.mb0.fwd.attn_c0")] == pytest.approx((t, t + 10))
    assert ev[(0, "L0.mb0.fwd.attn_c1")] == pytest.approx((t + 15, t + 25))
    assert ev[(0, "L0.mb0.fwd.cp_out_correction")] == pytest.approx((t + 25, t + 35))
    assert ev[(1, "L0.mb0.fwd.attn_c1")] == ev[(0, "L0.mb0.fwd.attn_c1")]


def test_event_log_backward_ring(cp_log):
    """Backward (TE L2459-2720): the KV shift is issued with proj's dgrad (T); the diagonal step follows
    proj's wgrad on the compute stream (T + 10); each step's dK/dV correction waits for its own shift and
    step, and the next shift carries the corrected dK/dV, so the last shift (T + 30 .. T + 45) is exposed
    for 5 us before the last correction."""
    _, ev = cp_log
    t = ev[(0, "L0.mb0.bwd.proj_dgrad")][1]
    assert ev[(0, "L0.mb0.bwd.cp_ring_c0")] == pytest.approx((t, t + 15))
    assert ev[(0, "L0.mb0.bwd.attn_c0")] == pytest.approx((t + 10, t + 20))
    assert ev[(0, "L0.mb0.bwd.cp_grad_correction_c0")] == pytest.approx((t + 20, t + 30))
    assert ev[(0, "L0.mb0.bwd.attn_c1")] == pytest.approx((t + 30, t + 40))
    assert ev[(0, "L0.mb0.bwd.cp_ring_c1")] == pytest.approx((t + 30, t + 45))
    assert ev[(0, "L0.mb0.bwd.cp_grad_correction_c1")] == pytest.approx((t + 45, t + 55))
    assert ev[(0, "L0.mb0.bwd.qkv_dgrad")][0] == pytest.approx(t + 55)


def test_cp_results_carry_the_category_and_add_up():
    from meshsim.sim.results.simulate import simulate

    res = simulate(tiny())
    out = res.to_dict()
    assert out["cp"] == 2 and out["cp_comm"] == "p2p"
    assert "cp_comm" in out["critical_path_share"] and "exposed_cp_comm" in out["breakdown_s"]
    assert sum(out["critical_path_share"].values()) == pytest.approx(1.0, abs=1e-9)
    assert out["breakdown_s"]["cp_comm_busy"] > 0


# ----- one test per check -----------------------------------------------------------------------------
def refused(**extra) -> UserError:
    with pytest.raises(UserError) as err:
        tiny(**extra)
    return err.value


def test_check_seq_len_divisible_by_2cp():
    assert refused(**{"model.seq_len": 130}).field == "model.seq_len"


def test_check_sp_splits_the_local_tokens():
    # seq 24: a multiple of 2 cp = 4 and of tp = 8, but the 12 tokens per cp rank are not a multiple of 8
    err = refused(**{"parallel.tp": 8, "parallel.sp": True, "parallel.cp": 2, "parallel.gpus": 16,
                     "topology.nodes": 2, "model.seq_len": 24, "model.heads": 8, "model.hidden": 512})
    assert err.field == "model.seq_len"


def test_check_unfused_attention_refused():
    assert refused(**{"model.attention": "unfused"}).field == "model.attention"


def test_check_a2a_heads_divide():
    err = refused(**{"parallel.cp": 8, "parallel.gpus": 8, "parallel.cp_comm": "a2a"})  # 4 heads over 8
    assert err.field == "parallel.cp_comm"


def test_check_hierarchical_sizes():
    four = {"parallel.cp": 4, "parallel.gpus": 4}
    assert refused(**four, **{"parallel.cp_comm": "a2a+p2p"}).field == "parallel.hierarchical_cp"
    assert refused(**four, **{"parallel.cp_comm": "a2a+p2p", "parallel.hierarchical_cp": [2, 3]}).field == \
        "parallel.hierarchical_cp"
    assert refused(**four, **{"parallel.hierarchical_cp": [2, 2]}).field == "parallel.hierarchical_cp"
    ok = build_schedule(tiny(**four, **{"parallel.cp_comm": "a2a+p2p", "parallel.hierarchical_cp": [2, 2]}))
    groups = {op.work.group for op in ok.ops if isinstance(op.work, Collective)}
    assert {"cp_a2a", "cp_p2p"} <= groups


def test_check_cp_times_tp_pp_divides_gpus():
    assert refused(**{"parallel.cp": 3}).field == "parallel.cp"


def test_check_cp_not_modeled_combinations():
    assert refused(**{"model.sliding_window": 32}).field == "parallel.cp_comm"  # p2p: TE refuses windows
