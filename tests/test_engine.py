"""Engine, arbiter, critical path and breakdown on hand-built schedules with fixed durations.

Every expected time is derived in the test from the stated durations (arithmetic in the comments)."""

from __future__ import annotations

import pytest

from meshsim.sim.engine.events import run, symmetric_groups
from meshsim.sim.results.breakdown import breakdown, union_s
from meshsim.sim.results.critical_path import critical_path, shares
from meshsim.sim.schedule.ops import Collective, Elementwise, Op, Schedule


def comp(i, name, deps=(), layer=None, mb=None, phase="fwd"):
    return Op(i, name, "compute", "compute", phase, Elementwise(name, 0, 0), tuple(deps), layer, mb)


def coll(i, name, group="tp", deps=(), nbytes=1000, layer=None, mb=None, phase="fwd"):
    stream = "tp_comm" if group == "tp" else "dp_comm"
    return Op(i, name, stream, stream, phase, Collective("all_reduce", group, nbytes), tuple(deps), layer, mb)


# ----- exact event log, with a rendezvous wait ---------------------------------------------------------
def two_rank_schedule() -> Schedule:
    return Schedule((comp(0, "a"), coll(1, "ar", deps=(0,)), comp(2, "c"), comp(3, "d", deps=(1,))),
                    tp=2, dp=1, micro_batches=1)


DUR = {(0, "a"): 1.0, (1, "a"): 3.0, "c": 2.0, "d": 1.0}
LAT_S, BW_S = 0.5, 2.0


def two_rank_log():
    def compute_s(op, rank):
        return DUR.get((rank, op.name), DUR.get(op.name))

    return run(two_rank_schedule(), [0, 1], compute_s, lambda op, g: (LAT_S, BW_S, {0: 1.0}))


def test_exact_event_log_with_rendezvous_wait():
    log = two_rank_log()
    got = {(e.rank, e.name): (e.start_s, e.end_s, e.wait_s) for e in log.events}
    # rank 1 issues the all-reduce last, at a = 3; it runs 3 + 0.5 + 2 = 5.5. d waits for it: 5.5 .. 6.5
    ar_end = 3.0 + LAT_S + BW_S
    assert got == {
        (0, "a"): (0.0, 1.0, 0.0), (1, "a"): (0.0, 3.0, 0.0),
        (0, "ar"): (1.0, ar_end, 2.0), (1, "ar"): (3.0, ar_end, 0.0),  # rank 0 waits 3 - 1 = 2
        (0, "c"): (1.0, 3.0, 0.0), (1, "c"): (3.0, 5.0, 0.0),
        (0, "d"): (ar_end, ar_end + 1.0, 0.0), (1, "d"): (ar_end, ar_end + 1.0, 0.0),
    }
    assert log.step_time_s == ar_end + 1.0
    assert log.get(0, 1).peer == 1


def test_critical_path_goes_through_the_last_arriving_peer():
    log = two_rank_log()
    path = critical_path(two_rank_schedule(), log)
    assert [(s.name, s.rank, s.category) for s in path] == [("a", 1, "compute"), ("ar", 1, "tp_comm"),
                                                            ("d", 0, "compute")]
    assert [s.dur_us for s in path] == pytest.approx([3e6, 2.5e6, 1e6])
    share = shares(path, log.step_time_s)
    assert share["compute"] == pytest.approx(4.0 / 6.5) and share["tp_comm"] == pytest.approx(2.5 / 6.5)


def test_breakdown_of_rank0():
    log = two_rank_log()
    b = breakdown(log.of_rank(0), log.step_time_s)
    # compute a 0-1, c 1-3, d 5.5-6.5 = 4; tp_comm 1-5.5 (wait included) = 4.5; busy union 0-6.5
    # compute waits 6.5 - 4 = 2.5 s (3-5.5), all of it while TP comm runs; its first op starts at 0
    assert b == pytest.approx({"compute_busy": 4.0, "tp_comm_busy": 4.5, "dp_comm_busy": 0.0, "compute_waiting": 2.5,
                               "compute_waiting_at_start": 0.0, "exposed_comm": 2.5, "exposed_tp_comm": 2.5,
                               "exposed_dp_comm_only": 0.0, "nothing_running": 0.0})


def test_union():
    assert union_s([(0, 1), (0.5, 2), (3, 4), (4, 4.5)]) == pytest.approx(3.5)


# ----- a layered synthetic step ------------------------------------------------------------------------
def layered_schedule(layers=4, mbs=2, tp=2, dp=2) -> Schedule:
    """fwd: gemm -> tp all-reduce -> gemm per layer; bwd mirrored; a DP all-reduce per layer of the last
    micro-batch overlapping the remaining backward."""
    ops: list[Op] = []

    def add(make, *args, **kw):
        op = make(len(ops), *args, **kw)
        ops.append(op)
        return op.id

    for mb in range(mbs):
        prev = ()
        for layer in range(layers):
            g1 = add(comp, f"L{layer}.mb{mb}.fwd.g1", prev, layer, mb)
            ar = add(coll, f"L{layer}.mb{mb}.fwd.ar", "tp", (g1,), 1000, layer, mb)
            prev = (add(comp, f"L{layer}.mb{mb}.fwd.g2", (ar,), layer, mb),)
        for layer in reversed(range(layers)):
            g1 = add(comp, f"L{layer}.mb{mb}.bwd.g1", prev, layer, mb, "bwd")
            ar = add(coll, f"L{layer}.mb{mb}.bwd.ar", "tp", (g1,), 1000, layer, mb, "bwd")
            prev = (add(comp, f"L{layer}.mb{mb}.bwd.g2", (ar,), layer, mb, "bwd"),)
            if mb == mbs - 1:
                add(coll, f"L{layer}.dp_grad", "dp", prev, 5000, layer, None, "bwd")
    return Schedule(tuple(ops), tp=tp, dp=dp, micro_batches=mbs)


def layered_costs(comm=True):
    def compute_s(op, rank):
        return 1e-3 if op.name.endswith("g1") else 2e-3

    def collective(op, group):
        if not comm:
            return 0.0, 0.0, {}
        links = {7: 1.0} if op.work.group == "dp" else {group[0]: 1.0}  # TP and DP on disjoint links
        return 10e-6, op.work.nbytes * 1e-7, links

    return compute_s, collective


def test_infinitely_fast_network_step_is_compute_on_critical_path():
    sched = layered_schedule()
    compute_s, collective = layered_costs(comm=False)
    log = run(sched, [0], compute_s, collective)
    path = critical_path(sched, log)
    total_compute_s = sum(compute_s(op, 0) for op in sched.by_stream("compute"))
    assert log.step_time_s == pytest.approx(total_compute_s, rel=1e-12)  # compute stream never starved
    assert sum(s.dur_us for s in path if s.category == "compute") * 1e-6 == pytest.approx(log.step_time_s)


def test_critical_path_is_contiguous_and_sums_to_step_time():
    sched = layered_schedule()
    log = run(sched, [0, 1, 2, 3], *layered_costs())
    path = critical_path(sched, log)
    assert path[0].start_us == pytest.approx(0.0, abs=1e-6)
    for a, b in zip(path, path[1:], strict=False):
        assert b.start_us == pytest.approx(a.start_us + a.dur_us, abs=1e-6)
    assert sum(s.dur_us for s in path) == pytest.approx(log.step_time_s * 1e6, rel=1e-9)
    # closed form: fwd+bwd per micro-batch = 2 x layers x (g1 + ar + g2), the last DP all-reduce exposed
    per_mb_s = 2 * 4 * (1e-3 + 10e-6 + 1000 * 1e-7 + 2e-3)
    assert log.step_time_s == pytest.approx(2 * per_mb_s + 10e-6 + 5000 * 1e-7, rel=1e-9)


def test_collapsed_and_explicit_ranks_agree():
    sched = layered_schedule(tp=2, dp=2)
    collapsed = run(sched, [0], *layered_costs())
    explicit = run(sched, range(4), *layered_costs(), group_of=symmetric_groups(2, 2))
    assert explicit.step_time_s == pytest.approx(collapsed.step_time_s, rel=1e-12)
    assert all(e.wait_s == 0.0 for e in explicit.events)


# ----- arbiter ------------------------------------------------------------------------------------------
def two_collectives(load_a, load_b, delay_b_s=0.0):
    ops = [coll(0, "tp_ar", "tp"), comp(1, "delay"), coll(2, "dp_ar", "dp", deps=(1,))]
    sched = Schedule(tuple(ops), tp=1, dp=1, micro_batches=1)
    loads = {"tp_ar": load_a, "dp_ar": load_b}
    log = run(sched, [0], lambda op, r: delay_b_s, lambda op, g: (0.0, 1.0, loads[op.name]))
    return {e.name: (e.start_s, e.end_s) for e in log.events}


def test_same_link_twice_as_long():
    got = two_collectives({3: 1.0}, {3: 1.0})
    assert got["tp_ar"] == pytest.approx((0.0, 2.0)) and got["dp_ar"] == pytest.approx((0.0, 2.0))


def test_disjoint_links_do_not_interact():
    got = two_collectives({3: 1.0}, {4: 1.0})
    assert got["tp_ar"] == pytest.approx((0.0, 1.0)) and got["dp_ar"] == pytest.approx((0.0, 1.0))


def test_rates_recomputed_when_a_collective_starts_and_finishes():
    # A alone for 0.5 s (0.5 done), then both at half speed: A's last 0.5 takes 1 s -> ends 1.5;
    # B has done 0.5 by then and finishes its last 0.5 alone -> 2.0
    got = two_collectives({3: 1.0}, {3: 1.0}, delay_b_s=0.5)
    assert got["tp_ar"] == pytest.approx((0.0, 1.5)) and got["dp_ar"] == pytest.approx((0.5, 2.0))


def test_deadlock_is_reported():
    ops = (comp(0, "a", deps=(1,)), comp(1, "b"))  # a waits for b, which is after a on the same stream
    with pytest.raises(ValueError, match="deadlock"):
        run(Schedule(ops, tp=1, dp=1, micro_batches=1), [0], lambda op, r: 1.0, lambda op, g: (0, 0, {}))


# ----- symmetric-copy keys are per stage ---------------------------------------------------------------
def test_collectives_of_two_stages_with_one_op_id_are_not_one_arbiter_job():
    """Stage 0 runs collective op 0 on link 0; stage 1 runs its own op 0 and op 1, both on link 1. Stages
    number their ops apart, so the two ops 0 are unrelated: stage 1's pair shares link 1 (rate 1/2 each,
    2 x 1 s of work -> both end at 2 s) while stage 0's runs alone (ends at 1 s). Keyed by op id alone (the
    bug behind issue 17's GPT-3 repro), stage 1's op 0 drained as a copy of stage 0's, at full speed."""
    stage0 = Schedule((coll(0, "a"),), tp=1, dp=1, micro_batches=1, pp=2, stage=0)
    stage1 = Schedule((coll(0, "b"), coll(1, "c", group="dp")), tp=1, dp=1, micro_batches=1, pp=2, stage=1)

    def collective(op, group):
        return 0.0, 1.0, {group[0]: 1.0}  # link = the rank

    log = run([stage0, stage1], [0, 1], lambda op, r: 0.0, collective, lambda kind, rank: (rank,),
              stage_of=lambda rank: rank, p2p=lambda *_: (0.0, 0.0, {}))
    ends = {(e.rank, e.op_id): e.end_s for e in log.events}
    assert ends == {(0, 0): pytest.approx(1.0), (1, 0): pytest.approx(2.0), (1, 1): pytest.approx(2.0)}
