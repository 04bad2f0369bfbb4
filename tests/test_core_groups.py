"""The compiled core's per-(rank, group kind) tables (sim/engine/_core.pyx Core.coded_group): groups numbered
by value, rendezvous keyed by (op id, that number), the by_value coster's timing kept per (work object,
group number), the communication load per group number, op ids read off the position where ids are
positions. Each is a shortcut over the reference's per-op lookups; here they meet their edges, on every
engine, event for event: ops that share one work object across groups of several ranks, a group_of that
returns a new (equal) tuple on every call, op ids that are not positions, collectives spanning stages
("embed"), kappa > 0."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_compiled import DURATIONS, LOADS, _same_on_every_engine

from meshsim.sim.engine import compiled
from meshsim.sim.engine.events import symmetric_groups
from meshsim.sim.schedule.ops import Collective, Elementwise, Op, Schedule

built = pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled core is not built")


def _by_value_coster(comm: dict, calls: list):
    """A pure coster that returns the same timing object for equal (work, group) values (the by_value
    contract, as sim/results/costers.py's memo keeps it); `calls` records each (work object id, group)."""
    memo: dict = {}

    def collective(op, group):
        calls.append((id(op.work), tuple(group)))
        key = (op.work, tuple(group))
        if key not in memo:
            latency_s, bandwidth_s, load = comm[(op.work.nbytes + sum(group)) % len(comm)]
            memo[key] = (latency_s, bandwidth_s, LOADS[load])
        return memo[key]

    collective.by_value = True
    return collective


@st.composite
def shared_work_runs(draw):
    """One stage on tp x dp ranks: ops drawn from a pool of a few work objects (collectives on tp / dp, and
    compute), ids that are positions or not, a group_of that caches its tuples or builds new ones."""
    tp, dp = draw(st.sampled_from([(2, 1), (1, 2), (2, 2), (4, 1)]))
    pool = [Collective("all_reduce", "tp", 1000), Collective("all_gather", "dp", 3000),
            Collective("all_reduce", "tp", 1000), Elementwise("k", 8, 8)]  # [0] and [2]: equal, not identical
    n = draw(st.integers(1, 12))
    stride, first = draw(st.sampled_from([(1, 0), (1, 0), (3, 5), (2, 1)]))  # ids = first + stride * position
    ops = []
    for i in range(n):
        deps = tuple(first + stride * d for d in sorted(set(draw(st.lists(st.integers(0, max(i - 1, 0)),
                                                                           max_size=2))))) if i else ()
        work = pool[draw(st.integers(0, len(pool) - 1))]
        stream = "compute" if isinstance(work, Elementwise) else "tp_comm" if work.group == "tp" else "dp_comm"
        ops.append(Op(first + stride * i, f"op{i}", stream, stream, "fwd", work, deps, 0, 0))
    sched = Schedule(tuple(ops), tp=tp, dp=dp, micro_batches=1)
    comm = {k: draw(st.tuples(st.sampled_from([0.0, 0.125, 1.0]), st.sampled_from(DURATIONS),
                              st.sampled_from(range(len(LOADS))))) for k in range(4)}
    cached = symmetric_groups(tp, dp)
    fresh = draw(st.booleans())
    group_of = (lambda kind, rank: tuple(cached(kind, rank))[:]) if not fresh else \
        (lambda kind, rank: tuple(list(cached(kind, rank))))  # a new tuple on every call
    calls: list = []
    collective = _by_value_coster(comm, calls) if draw(st.booleans()) else \
        (lambda op, group: (comm[op.work.nbytes % 4][0], comm[op.work.nbytes % 4][1], LOADS[len(group) % 6]))
    skew = draw(st.sampled_from([0.0, 0.5]))
    return dict(schedule=sched, ranks=list(range(tp * dp)),
                compute_s=lambda op, rank: DURATIONS[(op.id + rank) % len(DURATIONS)] + skew * rank,
                collective=collective, group_of=group_of,
                comm_interference=draw(st.sampled_from([0.0, 0.5, 1.0])))


@built
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_work_runs())
def test_shared_works_fresh_groups_and_sparse_ids_are_bit_identical_on_every_engine(kwargs):
    _same_on_every_engine(**kwargs)


@built
def test_the_by_value_coster_is_asked_once_per_work_and_group():
    """Four ranks in two tp pairs run eight ops of one shared collective work: the compiled core asks the
    by_value coster once per (work, group), the reference once per (op, group): its rendezvous prices each
    copy once (negative control)."""
    from meshsim.sim.engine.events import run

    work = Collective("all_reduce", "tp", 4096)
    ops = tuple(Op(i, f"ar{i}", "tp_comm", "tp_comm", "fwd", work, (i - 1,) if i else (), 0, 0) for i in range(8))
    sched = Schedule(ops, tp=2, dp=2, micro_batches=1)
    counts = {}
    for engine in ("compiled", "python"):
        calls: list = []
        run(schedule=sched, ranks=[0, 1, 2, 3], compute_s=lambda op, rank: 1.0,
            collective=_by_value_coster({0: (0.0, 1.0, 0)}, calls), group_of=symmetric_groups(2, 2),
            comm_interference=0.0, engine=engine)
        counts[engine] = len(calls), len(set(calls))
    assert counts["compiled"] == (2, 2)  # one work, two tp groups
    assert counts["python"] == (16, 2)


@built
def test_an_embed_collective_spanning_stages_meets_on_every_engine():
    """Two stages, one rank each, whose "embed" all-reduce has different op ids on each stage: they meet by
    name (the rendezvous key and the arbiter key), on every engine alike."""
    def stage(k: int, pad: int) -> Schedule:
        ops = [Op(i, f"pad{i}", "compute", "compute", "fwd", Elementwise(f"p{k}{i}", 1, 1), (), 0, 0)
               for i in range(pad)]
        ops.append(Op(pad, "embed_grad_ar", "dp_comm", "dp_comm", "bwd", Collective("all_reduce", "embed", 2048),
                      tuple(range(pad)), 0, 0))
        return Schedule(tuple(ops), tp=1, dp=1, micro_batches=1, pp=2, stage=k)

    out = _same_on_every_engine(schedule=[stage(0, 1), stage(1, 3)], ranks=[0, 1],
                                compute_s=lambda op, rank: 1.0 + rank,
                                collective=lambda op, group: (0.25, 1.0, {("link", 0): 1.0}),
                                group_of=lambda kind, rank: (0, 1), stage_of=lambda rank: rank,
                                p2p=lambda src, dst, nbytes: (0.0, 0.0, {}), comm_interference=0.5)
    assert "embed_grad_ar" in out
