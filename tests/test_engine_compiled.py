"""The compiled core (sim/engine/_core.pyx) against the Python reference: the same event log, float for float
(compared through repr, so -0.0 and every last bit count), the same transfers and arbiter jobs, the same
deadlock message, on generated inputs aimed at its edges (ties at equal times, zero durations and zero
latency / bandwidth parts, skewed ranks at rendezvous, links shared by concurrent collectives, kappa > 0,
host syncs, P2P batches that cross), and the same results.json on library scenarios of every kind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.cli.main import main
from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import compiled, event_rows, simpy_loop
from meshsim.sim.engine.events import Event, run, symmetric_groups
from meshsim.sim.outputs.step_report import results_json_text, write_outputs
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.ops import P2P, Collective, Elementwise, Op, P2PTransfer, Schedule

built = pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled core is not built")

DURATIONS = (0.0, 0.5, 1.0, 1.0, 2.0, 0.25)  # repeats and binary fractions: many exact ties
LOADS = ({0: 1.0}, {1: 1.0}, {0: 0.6, 1: 0.7}, {0: 0.5}, {}, {2: 1.0, 0: 0.3})


def _outcome(**kwargs):
    """The run's whole observable outcome as text (events read one by one, by index and through by_rank;
    the columns; step time, transfers, jobs), or its error. The compiled core's events are an EventRows
    (built when read), the reference's a tuple: read alike, they must print alike."""
    try:
        log = run(**kwargs)
    except ValueError as exc:
        return f"error: {exc}"
    events = tuple(log.events)
    assert tuple(log.events[i] for i in range(len(log.events))) == events
    assert [e for r in log.ranks for e in log.by_rank()[r].values()] == [e for r in log.ranks for e in events
                                                                         if e.rank == r]
    assert all(list(log.of_rank(r)) == [e for e in events if e.rank == r] for r in log.ranks)
    return repr((events, _columns_text(log), log.step_time_s, log.transfers, log.jobs, log.ranks))


def _columns_text(log) -> str:
    cols = log.columns()
    return repr([getattr(cols, f).tolist() for f in ("rank", "op_id", "start_s", "end_s", "wait_s", "peer", "peer_op")])


def _same_on_every_engine(**kwargs) -> str:
    outcomes = {engine: _outcome(**kwargs, engine=engine) for engine in ("compiled", "python", "simpy")}
    assert outcomes["compiled"] == outcomes["python"] == outcomes["simpy"]
    return outcomes["compiled"]


@st.composite
def flat_runs(draw):
    """One stage: compute and collectives on tp/dp groups of 1-4 explicit ranks, random deps (earlier ops, or
    a later one now and then: a deadlock both cores must report alike), rank-skewed durations, shared links,
    kappa, and a host clock with syncs."""
    tp, dp = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]))
    n = draw(st.integers(1, 14))
    ops = []
    for i in range(n):
        deps = tuple(sorted(set(draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3))))) if i else ()
        if i and draw(st.integers(0, 30)) == 0:
            deps = (*deps, draw(st.integers(i, n - 1)))  # a later op: may deadlock (one of the same stream does)
            deps = tuple(d for d in deps if d != i)
        wait = draw(st.sampled_from([None, None, None, *range(i)])) if i else None
        if draw(st.booleans()):
            group = draw(st.sampled_from(["tp", "dp"]))
            stream = "tp_comm" if group == "tp" else "dp_comm"
            work = Collective("all_reduce", group, 1000 * (i + 1))
        else:
            stream, work = "compute", Elementwise(f"k{i}", 8 * i, 8)
        ops.append(Op(i, f"op{i}", stream, stream, "fwd", work, deps, 0, 0, host_wait=wait))
    sched = Schedule(tuple(ops), tp=tp, dp=dp, micro_batches=1)
    durations = draw(st.lists(st.sampled_from(DURATIONS), min_size=n, max_size=n))
    skew = draw(st.sampled_from([0.0, 0.0, 0.5, 1.0]))
    comm = draw(st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.125, 1.0]), st.sampled_from(DURATIONS),
                                   st.sampled_from(range(len(LOADS)))), min_size=n, max_size=n))

    def compute_s(op, rank):
        return durations[op.id] + skew * (rank % 2) * (op.id % 3)

    def collective(op, group):
        latency_s, bandwidth_s, load = comm[op.id]
        return latency_s, bandwidth_s, LOADS[load]

    if not skew and draw(st.booleans()):  # one time per work (each op has its own): the core prices it once
        compute_s.by_work = True
    if draw(st.booleans()):  # one timing per (work, group) (each op has its own work): the core asks once per pair
        collective.by_value = True

    kappa = draw(st.sampled_from([0.0, 0.0, 0.5, 1.0]))
    dispatch_us = draw(st.sampled_from([None, 0.0, 2e5, 1e6]))
    issue_s = issue_times_s(sched, dispatch_us * 1e-6) if dispatch_us is not None else ()
    return dict(schedule=sched, ranks=list(range(tp * dp)), compute_s=compute_s, collective=collective,
                group_of=symmetric_groups(tp, dp), comm_interference=kappa, issue_s=issue_s)


@built
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flat_runs())
def test_generated_single_stage_runs_are_bit_identical_on_every_engine(kwargs):
    _same_on_every_engine(**kwargs)


@st.composite
def pipelines(draw):
    """Two stages, one rank each: forward micro-batches flow 0 -> 1, gradients 1 -> 0, through P2P batches
    that may cross (a send and a receive in one batch), zero-cost transfers, one shared link."""
    mbs = draw(st.integers(1, 3))
    cross = draw(st.booleans())
    d = draw(st.lists(st.sampled_from(DURATIONS), min_size=4 * mbs, max_size=4 * mbs))
    s0, s1 = [], []

    def add(ops, name, work, deps=(), stream="compute"):
        ops.append(Op(len(ops), name, stream, stream, "fwd", work, tuple(deps), 0, None))
        return len(ops) - 1

    def xfer(send, direction, mb, sender, peer):
        return P2PTransfer(send, direction, mb, sender, peer, 4096)

    fwd0 = [add(s0, f"F{m}", Elementwise(f"f0_{m}", 1, 1)) for m in range(mbs)]
    recv_b = []
    for m in range(mbs):
        transfers = [xfer(True, "fwd", m, 0, 1)]
        if cross and m:  # the send of micro-batch m with the receive of m - 1's gradient
            transfers.append(xfer(False, "bwd", m - 1, 1, 1))
            recv_b.append(add(s0, f"P{m}", P2P(tuple(transfers)), [fwd0[m]], "pp_comm"))
        else:
            add(s0, f"P{m}", P2P(tuple(transfers)), [fwd0[m]], "pp_comm")
    while len(recv_b) < mbs:
        recv_b.append(add(s0, f"R{len(recv_b)}", P2P((xfer(False, "bwd", len(recv_b), 1, 1),)), (), "pp_comm"))
    for m in range(mbs):
        add(s0, f"B{m}", Elementwise(f"b0_{m}", 2, 2), [recv_b[m]])
    for m in range(mbs):
        r = add(s1, f"R{m}", P2P((xfer(False, "fwd", m, 0, 0),)), (), "pp_comm")
        f = add(s1, f"F{m}", Elementwise(f"f1_{m}", 1, 1), [r])
        b = add(s1, f"B{m}", Elementwise(f"b1_{m}", 2, 2), [f])
        add(s1, f"S{m}", P2P((xfer(True, "bwd", m, 1, 0),)), [b], "pp_comm")
    stages = [Schedule(tuple(ops), tp=1, dp=1, micro_batches=mbs, pp=2, stage=k) for k, ops in enumerate((s0, s1))]
    p2p_costs = draw(st.tuples(st.sampled_from([0.0, 0.5]), st.sampled_from([0.0, 1.0, 2.0]),
                               st.sampled_from(range(len(LOADS)))))

    def compute_s(op, rank):
        return d[(op.id + 2 * rank) % len(d)]

    return dict(schedule=stages, ranks=[0, 1], compute_s=compute_s, collective=lambda op, g: (0.0, 1.0, {0: 1.0}),
                group_of=lambda kind, rank: (0, 1), stage_of=lambda rank: rank,
                p2p=lambda src, dst, nbytes: (p2p_costs[0], p2p_costs[1], LOADS[p2p_costs[2]]),
                comm_interference=draw(st.sampled_from([0.0, 0.5])))


@built
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipelines())
def test_generated_pipelines_are_bit_identical_on_every_engine(kwargs):
    _same_on_every_engine(**kwargs)


@built
def test_a_deadlock_is_reported_alike():
    """Negative control: an op that waits for a later op of its own stream never runs, on either core."""
    ops = (Op(0, "a", "compute", "compute", "fwd", Elementwise("a", 0, 0), (1,)),
           Op(1, "b", "compute", "compute", "fwd", Elementwise("b", 0, 0)))
    out = _same_on_every_engine(schedule=Schedule(ops, tp=1, dp=1, micro_batches=1), ranks=[0],
                                compute_s=lambda op, r: 1.0, collective=lambda op, g: (0, 0, {}))
    assert out.startswith("error: deadlock: 2 ops never ran")


def _tiny_pipeline(**kw):
    """Two stages, one forward each and the P2P pair between them."""
    def x(send, peer):
        return P2P((P2PTransfer(send, "fwd", 0, 0, peer, 64),))

    s0 = Schedule((Op(0, "mb0.fwd", "compute", "compute", "fwd", Elementwise("f", 8, 8, 2.0), layer=0, micro_batch=0),
                   Op(1, "send", "pp_comm", "pp_comm", "fwd", x(True, 1), (0,), micro_batch=0)),
                  tp=1, dp=1, micro_batches=1, pp=2, stage=0)
    s1 = Schedule((Op(0, "recv", "pp_comm", "pp_comm", "fwd", x(False, 0), micro_batch=0),
                   Op(1, "mb0.fwd", "compute", "compute", "fwd", Elementwise("f", 8, 8, 2.0), (0,), layer=1,
                      micro_batch=0)), tp=1, dp=1, micro_batches=1, pp=2, stage=1)
    return run([s0, s1], [0, 1], lambda op, r: 1.5, lambda op, g: (0.0, 0.0, {}), group_of=lambda k, r: (0, 1),
               stage_of=lambda r: r, p2p=lambda a, b, n: (0.25, 0.5, {0: 1.0}), **kw)


@built
def test_compiled_events_are_arrays_read_as_the_reference_tuples():
    """The compiled core's log is an EventRows (no tuple held): each event it builds is an Event equal field
    for field to the Python core's, each field of the same type (an int stays an int, not a numpy int); the
    columns are the arrays it holds; of_rank / by_rank read them without listing the log."""
    ref, rows = _tiny_pipeline(engine="python"), _tiny_pipeline(engine="compiled")
    assert isinstance(ref.events, tuple) and event_rows.is_rows(rows.events)
    assert isinstance(rows.events, Sequence) and isinstance(rows.by_rank()[0], Mapping)
    assert len(rows.events) == len(ref.events) == 4
    for a, b in zip(rows.events, ref.events, strict=True):
        assert type(a) is Event and a == b and [type(f) for f in a] == [type(f) for f in b]
    assert rows.events[-1] == ref.events[-1] and rows.events[1:3] == ref.events[1:3]
    assert rows.events == ref.events and list(reversed(rows.events)) == list(reversed(ref.events))
    assert rows.columns() is rows.events.columns
    assert _columns_text(rows) == _columns_text(ref)
    assert rows.get(1, 0) == ref.get(1, 0) and 5 not in rows.by_rank()[1] and rows.by_rank()[1].get(5) is None
    assert list(rows.by_rank()[1]) == list(ref.by_rank()[1])
    assert list(rows.of_rank(1)) == ref.of_rank(1)
    with pytest.raises(KeyError):
        rows.by_rank()[0][7]
    with pytest.raises(IndexError):
        rows.events[4]


@built
def test_a_changed_column_or_op_table_shows_in_the_events():
    """Negative control: the events are read off the arrays and the op tables, not stored aside; a change
    to either changes what the log reads, and the comparison of the harness sees it."""
    ref, rows = _tiny_pipeline(engine="python"), _tiny_pipeline(engine="compiled")
    rows.events.columns.end_s[0] = np.nextafter(rows.events.columns.end_s[0], 1.0)  # one ulp later
    assert rows.events[0] != ref.events[0] and tuple(rows.events) != ref.events
    rows.events.columns.end_s[0] = ref.events[0].end_s
    assert tuple(rows.events) == ref.events
    rows.events.op_index_arr[0] = 1 - rows.events.op_index_arr[0]  # another op of the stage
    assert rows.events[0].name != ref.events[0].name


@built
def test_retimed_rows_match_retimed_tuples():
    """EventLog.retimed (the steady state's shifted events) gives the same events over either log form."""
    ref, rows = _tiny_pipeline(engine="python"), _tiny_pipeline(engine="compiled")
    pick, start, end = np.array([3, 0, 0]), np.array([9.0, 0.5, 1.25]), np.array([10.0, 2.0, 3.5])
    a, b = ref.retimed(pick, start, end), rows.retimed(pick, start, end)
    assert isinstance(a, tuple) and event_rows.is_rows(b)
    assert list(b) == list(a) == [ref.events[3]._replace(start_s=9.0, end_s=10.0),
                                  ref.events[0]._replace(start_s=0.5, end_s=2.0),
                                  ref.events[0]._replace(start_s=1.25, end_s=3.5)]
    assert list(event_rows.events_of_rank(b, 1)) == event_rows.events_of_rank(a, 1) == [a[0]]


# every kind of step: pipelined (interleaved), MoE / EP (with the dispatcher's host syncs), CP, FP8, and one
# whose host cannot keep up; the default scenario; each with a few micro-batches so the suite stays quick
LIBRARY = {
    "llama2-70b-h100-tp8": {},
    "llama2-70b-h100-pp4": {},
    "mixtral-8x7b-h100-ep8": {},
    "llama3-70b-h100-cp2": {},
    "llama3-8b-h100-fp8": {},
    "tiny-2gpu": {"hardware.compute.host_dispatch_us": 400.0},
}


EXPLICIT = ("mixtral-8x7b-h100-ep8", "llama2-70b-h100-pp4", "llama3-70b-h100-cp2")  # also with explicit ranks


@built
@pytest.mark.parametrize(("name", "explicit"), [(n, False) for n in sorted(LIBRARY)] + [(n, True) for n in EXPLICIT])
def test_library_results_json_is_byte_identical_across_engines(name, explicit):
    """Explicit ranks: real rendezvous of every TP (and EP, CP) group member, symmetric copies sharing keys."""
    scenario, source = load_scenario(name)
    rs = resolve(with_overrides(scenario, LIBRARY[name], source) if LIBRARY[name] else scenario, source)
    texts = {engine: results_json_text(simulate(rs, explicit_ranks=explicit, engine_name=engine))
             for engine in ("compiled", "python", "simpy")}
    assert texts["compiled"] == texts["python"] == texts["simpy"]


@built
@pytest.mark.parametrize("name", ["tiny-2gpu", "llama2-70b-h100-pp4"])
def test_written_outputs_are_byte_identical_across_engines(name, tmp_path):
    """results.json, trace.json and timeline.html written from the compiled core's arrays (events built as
    the writers read them) and from the Python core's tuples: the same bytes, extrapolated or whole."""
    scenario, source = load_scenario(name)
    rs = resolve(scenario, source)
    for full in (False, True):
        for engine in ("compiled", "python"):
            result = simulate(rs, full=full, engine_name=engine)
            write_outputs(result, result.events, tmp_path / f"{engine}-{full}")
        for f in ("results.json", "trace.json", "timeline.html"):
            assert (tmp_path / f"compiled-{full}" / f).read_bytes() == (tmp_path / f"python-{full}" / f).read_bytes()


def test_without_the_extension_the_python_core_runs_and_run_says_so(monkeypatch, capsys, tmp_path):
    """The extension is optional: "compiled" then runs the Python core (the same figures), and `meshsim run`
    says so in one line; "native" stays an alias of "python"."""
    assert simpy_loop.resolve_engine("native") == "python"
    monkeypatch.setattr(compiled, "AVAILABLE", False)
    assert simpy_loop.resolve_engine("compiled") == "python"
    assert main(["run", "tiny-2gpu", "--outputs", "none"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "compiled engine core" in line]
    assert notes == ["meshsim: the compiled engine core is not built (no C compiler at install); running the "
                     "Python core: the same figures, slower"]
    assert main(["run", "tiny-2gpu", "--outputs", "none", "--engine", "simpy"]) == 0
    assert "compiled engine core" not in capsys.readouterr().err  # asked for another engine: nothing to say
