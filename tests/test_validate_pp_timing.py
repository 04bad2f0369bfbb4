"""Timing of a pipeline (pp = 2, world 2, gloo on CPU): per-stage schedules, P2P rendezvous keys, the
per-stage reduction, and the cross-check of the simulated against the measured step (one spawn pair)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from meshsim.scenarios.load import load_scenario, resolve  # noqa: E402
from meshsim.sim.core.mesh import mesh_group  # noqa: E402
from meshsim.sim.results.simulate import simulate  # noqa: E402
from meshsim.sim.schedule.ops import P2P  # noqa: E402
from meshsim.validate.crosscheck.crosscheck import run_crosscheck  # noqa: E402
from meshsim.validate.launch.shrink import TIMING, shrink, with_profile  # noqa: E402
from meshsim.validate.stack.comm import p2p_tag  # noqa: E402
from meshsim.validate.timing import measured  # noqa: E402
from meshsim.validate.timing.trace_merge import MEASURED_PID_OFFSET  # noqa: E402

pytestmark = pytest.mark.slow


def _shrunk():
    sc, src = load_scenario("llama2-70b-h100-pp4")
    return sc, src, shrink(sc, 2, TIMING, src)


def test_every_timed_send_meets_one_receive_with_the_same_tag_and_size():
    """The executor's rendezvous (peer rank from the "pp" group, p2p_tag) pairs every transfer."""
    _, src, shrunk = _shrunk()
    schedules = measured.stage_schedules_of(shrunk, src)
    assert [s.stage for s in schedules] == [0, 1]
    ends = {True: [], False: []}
    for s in schedules:
        rank = s.stage  # tp = dp = 1: stage s is rank s
        pp_ranks = mesh_group("pp", rank, s.tp, s.dp, pp=len(schedules))
        for op in s.ops:
            if isinstance(op.work, P2P):
                for t in op.work.transfers:
                    peer = pp_ranks[t.peer_stage]
                    src_dst = (rank, peer) if t.send else (peer, rank)
                    ends[t.send].append((src_dst, p2p_tag(t.direction, t.micro_batch, t.sender_vstage, 2),
                                         t.nbytes))
    assert ends[True] and sorted(ends[True]) == sorted(ends[False])
    assert len(set(ends[True])) == len(ends[True])  # one key per transfer
    assert len(ends[True]) == 2 * 4  # m' = 4 micro-batches, an activation forward and a gradient back


def test_reduce_run_is_per_stage_and_the_step_is_the_slowest_stage():
    _, src, shrunk = _shrunk()
    schedules = measured.stage_schedules_of(shrunk, src)

    def rank(r, scale, steps):
        n = len(schedules[r].ops)
        return {"rank": r, "timed": [[[0.0, scale * (i + 1)]] * n for i in range(2)], "step_s": steps}

    m = measured.reduce_run(schedules, [rank(0, 1.0, [1.0, 4.0, 2.0]), rank(1, 10.0, [3.0, 1.0, 1.0])])
    assert m.step_s == pytest.approx(3.0)  # median of the per-step max (3, 4, 2)
    assert [len(d) for d in m.op_mean_s] == [len(s.ops) for s in schedules]
    assert all(v == pytest.approx(1.5) for v in m.op_mean_s[0].values())  # stage 0: its rank only
    assert all(v == pytest.approx(15.0) for v in m.op_mean_s[1].values())
    assert {ev.rank for ev in m.events} == {0, 1}


def test_crosscheck_of_a_pipeline_reports_the_step_error(tmp_path):
    sc, src, shrunk = _shrunk()
    # the calibration's structure, not its accuracy: 5 timed runs per work, not 30
    check = run_crosscheck(sc, src, 2, out_dir=tmp_path, repeats=3, accept_noise=True, calibration_repeats=5)
    r = check.report
    assert r["pp"] == 2 and r["numerics_ok"] is True
    simulated = simulate(resolve(with_profile(shrunk, str(tmp_path / "profile.yaml")), src), full=True)
    assert simulated.pipeline is not None and r["simulated_step_s"] == simulated.step_time_s
    assert r["simulated_step_s"] > 0 and r["measured_step_s"] > 0
    # the error's size is measured (benchmarks print it); here only its definition
    expected = 100 * (r["simulated_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
    assert r["error_pct"] == pytest.approx(expected)
    assert {"compute", "pp_comm"} <= set(r["categories"])
    share = r["critical_path_agreement"]["share"]
    assert "pipeline_bubble" in share and 0 <= r["critical_path_agreement"]["jaccard"] <= 1
    doc = json.loads((tmp_path / "trace_merged.json").read_text())
    pids = {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert {0, 1, MEASURED_PID_OFFSET, MEASURED_PID_OFFSET + 1} <= pids  # a simulated and a measured rank per stage
