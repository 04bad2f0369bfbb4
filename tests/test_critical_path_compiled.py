"""The compiled critical-path walk (sim/results/_walk.pyx) against the Python walk it replaces
(critical_path.critical_path_python), segment for segment and float for float (float.hex), on generated
runs (pipelines with and without interleaving, P2P overlap, MoE, CP, interference, host-bound runs: the
P2P bubble, peer moves and tie breaks) and on the short runs of library scenarios; and the error of a
walk that meets an op with no event is the same KeyError. Negative control: a segment one ulp off is seen."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from test_results_arrays import MOE, fresh, pipelined
from test_steady_state import resolved
from test_steady_state_generated import HOST, _no_pp, host, no_pp

from meshsim.sim.core.errors import UserError
from meshsim.sim.engine.event_columns import EventColumns
from meshsim.sim.engine.events import EventLog
from meshsim.sim.results import critical_path as cp
from meshsim.sim.results import simulate as sim_glue

pytestmark = pytest.mark.skipif(cp._walk is None, reason="the compiled walk is not built")  # noqa: SLF001
SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}


def as_bits(path) -> list[tuple]:
    return [(s.name, s.category, s.rank, s.start_us.hex(), s.dur_us.hex(), s.op_id, s.count) for s in path]


def short_run(rs):
    plan = sim_glue.steady_plan(rs)
    n_b = plan.lead + 2 * plan.unit + plan.tail
    return sim_glue._short_run(rs, n_b, False, sim_glue.CollectiveCoster(rs), None)  # noqa: SLF001


def compare(run) -> list:
    fast = cp.critical_path(run.schedules, fresh(run.log))
    assert as_bits(fast) == as_bits(cp.critical_path_python(run.schedules, fresh(run.log)))
    return fast


@settings(max_examples=25, **SETTINGS)
@given(overrides=no_pp, host_mode=HOST)
def test_compiled_walk_equals_python_without_pipelines(overrides, host_mode):
    assert compare(short_run(resolved("tiny-2gpu", _no_pp(overrides, host_mode), 48)))


@settings(max_examples=30, **SETTINGS)
@given(overrides=pipelined, host_mode=HOST)
def test_compiled_walk_equals_python_on_pipelines_moe_and_cp(overrides, host_mode):
    o = dict(overrides)
    pp, vp, tp, moe, cp_ = o["parallel.pp"], o["parallel.vp"], o["parallel.tp"], o.pop("moe"), o["parallel.cp"]
    if vp > 1:
        o["parallel.pp"] = pp = min(pp, 3)
        o["parallel.p2p_overlap"] = o["parallel.p2p_overlap"] and pp > 2
    o["parallel.moe_ep_overlap"] = o["parallel.moe_ep_overlap"] and moe and vp > 1
    o.update({"model.layers": pp * vp, "parallel.gpus": tp * pp * cp_ * 2, "parallel.dp": "auto",
              "parallel.sp": o["parallel.sp"] and tp > 1, "topology.nodes": 4, "parallel.micro_batch": 1})
    if moe:
        o.update({**MOE, "parallel.ep": 2, "parallel.sp": tp > 1})
    try:
        o.update(host(o, *host_mode))
        rs = resolved("tiny-2gpu", o, 48)
    except UserError:
        assume(False)
    path = compare(short_run(rs))
    assert any(s.category == "pp_comm" for s in path) or pp == 1


@pytest.mark.parametrize("name", ["tiny-2gpu", "llama2-70b-h100-pp4", "mixtral-8x7b-h100-ep8", "llama3-70b-h100-cp2"])
def test_compiled_walk_equals_python_on_library_scenarios(name):
    assert compare(short_run(resolved(name)))


def test_a_missing_event_is_the_same_key_error_and_one_ulp_is_seen():
    run = short_run(resolved("llama2-70b-h100-pp4"))
    log = fresh(run.log)
    path = cp.critical_path(run.schedules, log)
    bits = as_bits(path)
    k = len(bits) // 2
    off = bits[:k] + [(*bits[k][:3], math.nextafter(path[k].start_us, 0.0).hex(), *bits[k][4:])] + bits[k + 1:]
    assert off != bits  # negative control: the comparison sees one ulp
    cols = log.columns()
    on_path = {(s.rank, s.op_id) for s in path if s.op_id is not None and s.category != "pp_comm"}
    last_rank, last_op = path[-1].rank, path[-1].op_id
    victim = next(i for i in range(len(cols)) if (int(cols.rank[i]), int(cols.op_id[i])) in on_path
                  and (int(cols.rank[i]), int(cols.op_id[i])) != (last_rank, last_op))
    keep = np.arange(len(cols)) != victim
    gone = EventColumns(*(getattr(cols, f)[keep] for f in ("rank", "op_id", "start_s", "end_s", "wait_s", "peer",
                                                           "peer_op")))
    broken = EventLog([log.events[i] for i in np.flatnonzero(keep).tolist()], log.ranks, log.step_time_s)
    broken._columns.append(gone)  # noqa: SLF001
    errors = []
    for walk in (cp.critical_path, cp.critical_path_python):
        with pytest.raises(KeyError) as info:
            walk(run.schedules, fresh(broken))
        errors.append(str(info.value))
    assert errors[0] == errors[1]
