"""sim/results/path_columns.py against the Segment lists of sim/results/critical_path.py, and the column
paths through the steady state's path checks (sim/results/period_path.py), on the short runs of generated
scenarios (test_schedule_arrays.scenarios) on the compiled core and the Python engine:
- critical_path_columns(...).segments() is critical_path(...) field for field (floats bit for bit);
- category_us, shares, top_op_types and inside_an_op over the columns give what the Segment versions give
  (values, key order), on the run's path and on paths whose period segments carry counts and shifts;
- extend_path over the columns gives the Segment version's verdict and, when proven, its segments, with the
  proof's cut and with cuts moved onto events' ends and starts (test_period_path_settled._cuts);
- settled_steps(images=True) passes exactly the steps the loop passes unread (its own image check, then
  the candidates' test), and decisions_repeat's verdict with it is the loop's over every step."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_period_path_settled import _cuts, short_run_of
from test_schedule_arrays import scenarios

from meshsim.sim.results import critical_path as cp
from meshsim.sim.results import path_columns as pc
from meshsim.sim.results import period_path as pp
from meshsim.sim.results.period_proof import prove
from meshsim.sim.schedule.ops import P2P


def _same_summaries(cols: pc.PathColumns, segs: list[cp.Segment]) -> None:
    assert cols.segments() == segs
    for flags in ((False, False, False), (True, False, False), (True, True, True), (False, True, False)):
        a, b = pc.category_us(cols, *flags), cp.category_us(segs, *flags)
        assert list(a.items()) == list(b.items())
        assert list(pc.shares(cols, 3.25, *flags).items()) == list(cp.shares(segs, 3.25, *flags).items())
    assert pc.top_op_types(cols, len(segs) + 1) == cp.top_op_types(segs, len(segs) + 1)
    assert pc.top_op_types(cols, 3) == cp.top_op_types(segs, 3)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), engine=st.sampled_from(("compiled", "python")), data=st.data())
def test_columns_equal_segments(case, engine, data):
    rs, plan, run = short_run_of(case, engine)
    cols = run.path
    assert isinstance(cols, pc.PathColumns)
    segs = cp.critical_path(run.schedules, run.log)
    _same_summaries(cols, segs)
    assert pc.from_segments(segs).segments() == segs
    # period segments with counts, the rest shifted (extend_path's shape), at drawn cuts
    n = len(segs)
    s1 = data.draw(st.integers(0, n))
    s2 = data.draw(st.integers(s1, n))
    k = data.draw(st.integers(0, 40))
    shift_us = data.draw(st.floats(0.0, 1e7, allow_nan=False))
    grown = cols.with_period(s1, s2, k, shift_us)
    want = [*segs[:s1], *(replace(s, count=k + 1) for s in segs[s1:s2]),
            *(replace(s, start_us=s.start_us + shift_us) for s in segs[s2:])]
    _same_summaries(grown, want)
    # inside_an_op at every segment's start and end, and a hair either side
    good_cols, good_segs = pc.inside_an_op(cols), pp.inside_an_op(segs)
    for s in segs[:: max(1, n // 200)]:
        for t_us in (s.start_us, s.start_us + s.dur_us):
            for c_s in (t_us * 1e-6, t_us * 1e-6 * (1 + 1e-15), t_us * 1e-6 * (1 - 1e-15)):
                assert good_cols(c_s) == good_segs(c_s)


def image_facts(path, spans, schedules, log, proof) -> tuple[np.ndarray, ...]:
    """Per step, read the long way (each step's op record, its deps, stream predecessor and image, their
    events): whether its op is a P2P batch, when it starts, whether its image check passes (mu(op) regular,
    with mu(prev(op)) as its stream predecessor), and the earliest end among its candidates (inf where
    none). None depends on the cut, so a run reads them once."""
    by, p2p, start, image, first_end = log.by_rank(), [], [], [], []
    for _, last in spans:
        seg = path[last]
        events, stage = by[seg.rank], proof.stage_of(seg.rank)
        op, prev, m = schedules[stage].ops[seg.op_id], proof.prevs[stage], proof.maps[stage]
        cands = [events[d] for d in op.deps] + ([events[prev[op.id]]] if prev[op.id] is not None else [])
        later = m.mu(op.id)
        image.append(later is not None and m.first_regular <= later < m.end_regular and
                     (None if prev[op.id] is None else m.mu(prev[op.id])) == prev[later])
        p2p.append(isinstance(op.work, P2P))
        start.append(events[seg.op_id].start_s)
        first_end.append(min((e.end_s for e in cands), default=np.inf))
    return (np.array(p2p, dtype=bool), np.array(start), np.array(image, dtype=bool), np.array(first_end))


def settled_with_images(facts, cut) -> list[bool]:
    """The loop's own test, per step: no P2P batch; starting at or after c2, or else its image check passes;
    each candidate ending at or after c1 (all of them: the earliest does)."""
    p2p, start, image, first_end = facts
    return (~p2p & ((start >= cut.c2) | image) & (first_end >= cut.c1)).tolist()


def test_column_paths_through_the_period_checks():
    """extend_path and decisions_repeat over columns and over Segments agree, on every run and cut; the
    image-settled steps are the loop's; not vacuous: steps before c2 were settled by their images, others
    looked at, and cuts refused."""
    seen = {"image-settled": 0, "looked": 0, "refused": 0, "extended": 0}

    @settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=scenarios(), engine=st.sampled_from(("compiled", "python")))
    def check(case, engine):
        rs, plan, run = short_run_of(case, engine)
        segs = run.path.segments()
        proof = prove(run.schedules, run.log, plan.lead, plan.unit, rs.micro_batches, rs.stage_of, run.issue_s,
                      run.kappa, pp.inside_an_op(run.path))
        assume(not isinstance(proof, str))
        spans = pp.steps(run.path)
        assert spans == pp.steps(segs)
        facts = image_facts(segs, spans, run.schedules, run.log, proof)
        for cut in _cuts(proof, run.log):
            moved = replace(proof, cut=cut)
            by_cols = pp.extend_path(run.path, run.schedules, run.log, moved)
            by_segs = pp.extend_path(segs, run.schedules, run.log, moved)
            if isinstance(by_segs, str):
                assert by_cols == by_segs
            else:
                assert by_cols.segments() == by_segs
                seen["extended"] += 1
            for z in sorted({0, len(spans) // 3, len(spans) // 2, max(len(spans) - 2, 0)}):
                fast = pp.decisions_repeat(run.path, spans[z:], run.schedules, run.log, moved)
                slow = pp.decisions_repeat(segs, spans[z:], run.schedules, run.log, moved, skip_settled=False)
                assert fast == slow
                settled = pp.settled_steps(run.path, spans[z:], run.schedules, run.log, moved, images=True)
                assert settled.tolist() == settled_with_images(tuple(f[z:] for f in facts), cut)
                early = [run.log.columns().start_s[run.log.rows_of()[segs[b].rank].row_of[segs[b].op_id]] < moved.cut.c2
                         for _, b in spans[z:]]
                seen["image-settled"] += sum(s and e for s, e in zip(settled.tolist(), early, strict=True))
                seen["looked"] += int((~settled).sum())
                seen["refused"] += slow is not None

    check()
    assert all(seen.values()), seen
