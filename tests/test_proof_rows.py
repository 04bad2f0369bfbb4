"""The proof's cheaper reads of a run against the long way, on generated runs (both engines):

- period_state._jobs_at (a span of the compiled core's JobRows built at once) gives the records
  [jobs[i] for i in at] does, dense and sparse index sets, the first and last job included, with their
  load and own objects shared (the arbiter check compares them by identity first);
- period_keys' P2P keys held relative to their micro-batch (_relative): each key reads back (_absolute),
  and one period later (or earlier) is looked up to the id the key -> id map gives, for every P2P batch
  and unit, and for keys no batch has;
- decisions_repeat over PathColumns reads no segment name (PathColumns.names is built once, for the result).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_period_path_settled import short_run_of
from test_schedule_arrays import scenarios

from meshsim.sim.results.path_columns import PathColumns
from meshsim.sim.results.period_keys import _absolute, _relative, key_index, later
from meshsim.sim.results.period_path import extend_path, inside_an_op
from meshsim.sim.results.period_proof import prove, ready_from
from meshsim.sim.results.period_state import _jobs_at
from meshsim.sim.results.run_arrays import StageOps, times_of_rank

_EXAMPLES = settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@_EXAMPLES
@given(case=scenarios(), engine=st.sampled_from(("compiled", "python")), seed=st.integers(0, 2**16))
def test_jobs_at_equals_reading_each(case, engine, seed):
    _, _, run = short_run_of(case, engine)
    jobs = run.log.jobs
    n = len(jobs)
    assume(n > 2)
    rng = np.random.default_rng(seed)
    sets = [np.arange(n), np.arange(n // 3, n // 2 + 1), np.array([0, n - 1]),
            np.flatnonzero(rng.random(n) < 0.8), np.flatnonzero(rng.random(n) < 0.05), np.zeros(0, np.int64)]
    for at in sets:
        got, want = _jobs_at(jobs, at), [jobs[i] for i in at.tolist()]
        assert got == want
        assert all(a.load is b.load and a.own is b.own for a, b in zip(got, want, strict=True))


@_EXAMPLES
@given(case=scenarios(), engine=st.sampled_from(("compiled",)))
def test_relative_p2p_keys_read_back_and_look_up_alike(case, engine):
    rs, _, run = short_run_of(case, engine)
    for s in run.schedules:
        index = key_index(s)
        keys = {i: (op.micro_batch, tuple((t.send, t.direction, t.micro_batch, t.sender_vstage)
                                          for t in op.work.transfers)) for i, op in enumerate(s.ops) if i in index.p2p_rel}
        assert index.p2p_key == keys
        id_of = {}
        for i, key in keys.items():
            id_of[key] = i
            assert _absolute(_relative(key[0], s.ops[i].work.transfers)) == key
        for unit in (1, 2, 3):
            ids = index.later_ids(unit)
            for i, key in keys.items():
                if key[0] is not None:
                    assert ids[i] == id_of.get(later(key, unit), -1)
                    assert index.id_of(later(key, -unit)) == id_of.get(later(key, -unit))
        assert all(index.kid[i] == id_of[key] for i, key in keys.items())
        assert index.id_of((10**6, ((True, "fwd", 10**6, 0),))) is None


@_EXAMPLES
@given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
def test_extending_the_path_builds_no_names(case, engine):
    rs, plan, run = short_run_of(case, engine)
    assume(isinstance(run.path, PathColumns))
    proof = prove(run.schedules, run.log, plan.lead, plan.unit, rs.micro_batches, rs.stage_of, run.issue_s,
                  run.kappa, inside_an_op(run.path))
    assume(not isinstance(proof, str))
    extend_path(run.path, run.schedules, run.log, proof)
    assert "names" not in run.path.__dict__


@_EXAMPLES
@given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
def test_ready_times_off_one_pass_equal_both_defaults(case, engine):
    """The host check's ready times (latest_wait_end with 0.0 for an op without deps), read off the causality
    check's (-inf) by period_proof.ready_from, are bit for bit the direct ones, on every rank, also
    with ends moved below zero (the 0.0 floor then decides)."""
    rs, _, run = short_run_of(case, engine)
    for rank in run.log.ranks:
        s = run.schedules[rs.stage_of(rank)]
        ops, t = StageOps.of(s), times_of_rank(run.log, rank, len(s.ops))
        for end in (t.end, t.end - float(np.median(t.end))):
            got = ready_from(ops, ops.latest_wait_end(end, -np.inf))
            want = ops.latest_wait_end(end, 0.0)
            assert got.tobytes() == want.tobytes()
