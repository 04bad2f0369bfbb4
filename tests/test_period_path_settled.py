"""period_path.settled_steps lets decisions_repeat pass, unread, the walk steps whose op is no P2P batch,
starts at or after c2 and has every candidate (deps, stream predecessor) ending at or after c1: a
differential test against the loop that reads every step (skip_settled=False), on the steady state's runs of
generated scenarios (test_schedule_arrays.scenarios) on both the compiled core's rows and the Python engine's
Event tuples, with the proof's cut and with cuts moved onto events' ends and starts (a candidate ending
exactly at c1, an op starting at c2 or a hair either side), from several first steps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_schedule_arrays import scenarios
from test_steady_state import resolved

from meshsim.sim.core.errors import UserError
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.period_path import decisions_repeat, inside_an_op, settled_steps, steps
from meshsim.sim.results.period_proof import prove
from meshsim.sim.results.simulate import _short_run, plan_and_run
from meshsim.sim.schedule.ops import P2P


def short_run_of(case, engine):
    """A generated case's short run as the steady state plans it: (rs, plan, run), or the example dropped."""
    name, over, _ = case
    try:
        rs = resolved(name, over)
    except UserError:
        assume(False)
    chosen = plan_and_run(rs, force=True)
    assume(chosen is not None)
    plan, n_b = chosen
    return rs, plan, _short_run(rs, n_b, False, CollectiveCoster(rs), engine)


def step_facts(path, spans, schedules, log, proof) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step, read the long way (each step's op record, its deps and stream predecessor, their events):
    whether its op is a P2P batch, when it starts, and the earliest end among its candidates (deps, stream
    predecessor; inf where none). They do not depend on the cut, so a run reads them once."""
    by, p2p, start, first_end = log.by_rank(), [], [], []
    for _, last in spans:
        seg = path[last]
        events, stage = by[seg.rank], proof.stage_of(seg.rank)
        op, prev = schedules[stage].ops[seg.op_id], proof.prevs[stage]
        cands = [events[d] for d in op.deps] + ([events[prev[op.id]]] if prev[op.id] is not None else [])
        p2p.append(isinstance(op.work, P2P))
        start.append(events[seg.op_id].start_s)
        first_end.append(min((e.end_s for e in cands), default=np.inf))
    return np.array(p2p, dtype=bool), np.array(start), np.array(first_end)


def settled_long(facts, cut) -> list[bool]:
    """The loop's own test, per step: an op that is no P2P batch, starting at or after c2, each candidate
    ending at or after c1 (all of them: the earliest does)."""
    p2p, start, first_end = facts
    return (~p2p & (start >= cut.c2) & (first_end >= cut.c1)).tolist()


def _cuts(proof, log) -> list:
    """The proof's cut, then c1 on an event's end (candidates end exactly at c1) and on an event's start less
    one period (ops start at c2), each also a hair either side."""
    cut, cols = proof.cut, log.columns()
    out = [cut]
    for q in (0.3, 0.5, 0.7):
        end = float(np.quantile(cols.end_s, q, method="lower"))
        start = float(np.quantile(cols.start_s, q, method="lower"))
        for c1 in (end, start - cut.period_s):
            out += [replace(cut, c1=c1 + d) for d in (0.0, -1e-15, 1e-15)]
    return out


def test_settled_steps_change_no_decision():
    """Both ways give the same answer on every run and cut, and the steps passed are those the loop's own
    test passes (settled_long); not vacuous: the runs had settled and unsettled
    steps, and cuts the loop refuses."""
    seen = {"settled": 0, "looked": 0, "refused": 0}

    @settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
    def check(case, engine):
        rs, plan, run = short_run_of(case, engine)
        proof = prove(run.schedules, run.log, plan.lead, plan.unit, rs.micro_batches, rs.stage_of, run.issue_s,
                      run.kappa, inside_an_op(run.path))
        assume(not isinstance(proof, str))
        spans = steps(run.path)
        facts = step_facts(run.path, spans, run.schedules, run.log, proof)
        for cut in _cuts(proof, run.log):
            moved = replace(proof, cut=cut)
            for z in sorted({0, len(spans) // 3, len(spans) // 2, max(len(spans) - 2, 0)}):
                fast = decisions_repeat(run.path, spans[z:], run.schedules, run.log, moved)
                slow = decisions_repeat(run.path, spans[z:], run.schedules, run.log, moved, skip_settled=False)
                assert fast == slow
                settled = settled_steps(run.path, spans[z:], run.schedules, run.log, moved)
                assert settled is not None  # built schedules are tiled: the shortcut is taken
                assert settled.tolist() == settled_long(tuple(f[z:] for f in facts), cut)
                seen["settled"] += int(settled.sum())
                seen["looked"] += int((~settled).sum())
                seen["refused"] += slow is not None

    check()
    assert seen["settled"] and seen["looked"] and seen["refused"]
