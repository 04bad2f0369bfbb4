"""The compiled core's inputs: each pipeline stage's schedule as arrays, built once per run from the checked
Inputs (sim/engine/events.py check_inputs), and the run itself (sim/engine/_core.pyx).

Per stage, ops are numbered by their position in stream order (FIFO streams in FIFO_STREAMS order, then the
pp_comm batches): `kind` (0 compute, 1 collective, 2 P2P batch), dependency lists in CSR form (`dep_ptr`,
`dep_idx`, as op indices, in each op's deps order), the host's issue time per op and its syncs
(sim/engine/host.py: `point_of` per op, and per sync the awaited op's index and its base clock). What the
events need per op (id, name, stream, category, phase, layer, micro-batch) is read off the op itself, and its
(bytes, flops) pair is built once per work. The core records each event as one row of arrays; the log is
those arrays (sim/engine/_rows.pyx EventRows), its Event tuples built only when read.

`AVAILABLE` says whether the extension was built (`pip install` builds it where a C compiler is present;
setup.py); without it events.run falls back to the Python core (`core_name()`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from itertools import chain
from operator import attrgetter

import numpy as np

from meshsim.sim.cost.collectives import maxmin
from meshsim.sim.engine.arbiter import Job, MemoRates
from meshsim.sim.engine.event_columns import EventColumns
from meshsim.sim.engine.job_rows import JobRows
from meshsim.sim.engine.processes import CollectiveFn, ComputeFn, Inputs, OpsAt, P2PFn, Transfer
from meshsim.sim.schedule.ops import FIFO_STREAMS, P2P, STREAMS, Collective, Op, Schedule

try:
    from meshsim.sim.engine import _core, _rows
except ImportError:  # no C compiler at install time: the Python core runs instead
    _core = _rows = None

AVAILABLE = _core is not None


def core_name() -> str:
    """The core `--engine compiled` runs on: the Cython extension, or the Python one when it is missing."""
    return "compiled (Cython)" if AVAILABLE else "python (the compiled core is not built)"


_ID, _WORK, _DEPS = attrgetter("id"), attrgetter("work"), attrgetter("deps")


def _stage(stage: int, schedule: Schedule, streams: dict, issue: Sequence[float], syncs,
           work_bytes: Callable[[Op], int], price: Callable[[Op], float] | None = None,
           kinds: dict[str, int] | None = None) -> _core.Stage:
    """One stage's arrays (module docstring). Ops are numbered by their position in the schedule; every
    per-op list is built by C-level map/zip passes, not a Python loop per op. `kinds`: the run's collective
    group kinds -> their codes, shared by its stages (new kinds are added)."""
    ops = schedule.ops
    tiled = schedule.tiled_arrays  # kind and deps tiled from the builder's stamps (ids are positions)
    ids = range(len(ops)) if tiled is not None else list(map(_ID, ops))
    dense = tiled is not None or ids == list(range(len(ops)))  # ids are positions (every built schedule)
    position = None if dense else {op_id: i for i, op_id in enumerate(ids)}
    if tiled is not None:
        kind, dep_ptr, dep_idx = tiled.kind, tiled.dep_ptr, tiled.dep_idx
    else:
        kind, dep_ptr, dep_idx = _kind_and_deps(ops, list(map(_WORK, ops)), position)
    table = schedule.work_table  # stamped ops share their work: size and price each work once, at its first op
    one_op = list(map(ops.__getitem__, table.first.tolist()))
    size_of = [(work_bytes(op), op.flops) for op in one_op]
    if price is not None:  # priced once per work (run's docstring)
        time_of = np.array([0.0 if isinstance(op.work, Collective | P2P) else float(price(op)) for op in one_op],
                           dtype=np.float64)
        durations = time_of[table.index] if len(ops) else np.zeros(0)
    else:
        durations = np.zeros(0)
    st = _core.Stage()
    st.ops = ops  # (records are read off the hot path only: a schedule may build them on demand)
    try:
        st.op_ids = ids
    except TypeError:  # an extension built before Stage.op_ids took a range (a stale build): a list
        st.op_ids = list(ids)
    st.works = tuple(table.works)
    st.sizes = list(map(size_of.__getitem__, table.index.tolist()))
    index = _ID if dense else (lambda op: position[op.id])
    if tiled is not None:  # `streams` holds the schedule's ops of each stream in order (events._by_stream)
        st.streams = [np.flatnonzero(tiled.stream == STREAMS.index(s)).astype(np.intc) for s in FIFO_STREAMS
                      if streams[s]]
    else:
        st.streams = [np.fromiter(map(index, streams[s]), dtype=np.intc, count=len(streams[s]))
                      for s in FIFO_STREAMS if streams[s]]
    batches = streams["pp_comm"]
    st.batches = batches.positions.tolist() if dense and isinstance(batches, OpsAt) else list(map(index, batches))
    st.stage = stage
    ids_arr = np.arange(len(ops), dtype=np.intp) if dense else np.asarray(ids, dtype=np.intp)
    issue_arr = np.asarray(issue, dtype=np.float64)[ids_arr] if len(issue) else np.zeros(0)
    if syncs is not None:
        point = np.asarray(syncs.point_of, dtype=np.intc)[ids_arr]
        awaited = np.array([a if dense else position[a] for a in syncs.awaited], dtype=np.intc)
        base = np.array(syncs.base_s, dtype=np.float64)
    else:
        point, awaited, base = np.zeros(0, dtype=np.intc), np.zeros(0, dtype=np.intc), np.zeros(0)
    st.set_arrays(kind, dep_ptr, dep_idx, issue_arr, point, awaited, base, durations)
    kinds = {} if kinds is None else kinds
    code_of = np.array([kinds.setdefault(w.group, len(kinds)) if isinstance(w, Collective) else -1
                        for w in table.works] + [-1], dtype=np.intc)  # (+ one: a stage without ops indexes none)
    work_ix = np.asarray(table.index, dtype=np.intc)
    st.set_groups(code_of[work_ix], work_ix, len(table.works))
    return st


def _kind_and_deps(ops: Sequence[Op], works: list, position: dict[int, int] | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kind, dep_ptr, dep_idx) read off the ops (`position`: op id -> index, None when ids are positions);
    what ScheduleArrays tiles for a built schedule (tests/test_engine_compiled.py compares the two)."""
    deps = list(map(_DEPS, ops))
    dep_ptr = np.zeros(len(ops) + 1, dtype=np.intc)
    np.cumsum(np.fromiter(map(len, deps), dtype=np.intc, count=len(ops)), out=dep_ptr[1:])
    flat = chain.from_iterable(deps) if position is None else map(position.__getitem__, chain.from_iterable(deps))
    dep_idx = np.fromiter(flat, dtype=np.intc, count=int(dep_ptr[-1]))
    types = list(map(type, works))
    kind_of = {t: 1 if issubclass(t, Collective) else 2 if issubclass(t, P2P) else 0 for t in set(types)}
    kind = np.fromiter(map(kind_of.__getitem__, types), dtype=np.intc, count=len(ops))
    return kind, dep_ptr, dep_idx


def run(inputs: Inputs, schedules: Sequence[Schedule], compute_s: ComputeFn, collective: CollectiveFn,
        p2p: P2PFn | None, event_type: type, work_bytes: Callable[[Op], int]
        ) -> tuple[_rows.EventRows, float, list[Transfer], JobRows, Callable[[int], set[int]]]:
    """_run with the cyclic garbage collector paused: a run allocates an event tuple per (rank, op) and a few
    per op, none of them cyclic garbage, and each collection the allocations would trigger rescans the
    whole young generation (and now and then every object alive). Pausing it changes no value."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(inputs, schedules, compute_s, collective, p2p, event_type, work_bytes)
    finally:
        if was_enabled:
            gc.enable()


def fair_rates() -> _core.FairRates:
    """The arbiter's rates for the compiled core: fair_rates in C over loads interned once per run
    (sim/engine/_fair_rates.pxi), the reference arbiter.MemoRates for loads outside its C loops."""
    return _core.FairRates(MemoRates(), maxmin._FACTOR, maxmin._TINY, maxmin._PLAIN_SUM)


def _run(inputs: Inputs, schedules: Sequence[Schedule], compute_s: ComputeFn, collective: CollectiveFn, p2p: P2PFn | None,
        event_type: type, work_bytes: Callable[[Op], int]
        ) -> tuple[_rows.EventRows, float, list[Transfer], list[Job], Callable[[int], set[int]]]:
    """The engine on the compiled core: (events in completion order, as arrays, the latest end (0.0: none), transfers,
    arbiter jobs, rank -> the op ids it finished). event_type, work_bytes: events.Event and events.work_bytes (that module calls this one)."""
    # the core fills event_type records like tuples: a tuple subclass without slots of its own
    assert issubclass(event_type, tuple) and event_type.__basicsize__ == tuple.__basicsize__
    assert issubclass(Job, tuple) and Job.__basicsize__ == tuple.__basicsize__  # so are arbiter jobs (JobRows)
    stage_of = inputs.stage_of
    ranks = inputs.ranks
    stage_ranks: dict[int, int] = {}
    for r in ranks:
        stage_ranks.setdefault(stage_of(r), r)
    stages = []
    kinds: dict[str, int] = {}  # collective group kind -> its code (Stage.set_groups)
    by_work = getattr(compute_s, "by_work", False)
    for stage, streams in enumerate(inputs.per_stream):
        first = stage_ranks.get(stage)
        issue = inputs.issue_of.get(first, ()) if first is not None else ()
        syncs = inputs.syncs_of.get(first) if first is not None else None
        price = (lambda op, rank=first: compute_s(op, rank)) if by_work and first is not None else None
        stages.append(_stage(stage, schedules[stage], streams, issue, syncs, work_bytes, price, kinds))
    issue_ranks = frozenset(r for r in ranks if inputs.issue_of.get(r))
    sync_ranks = frozenset(r for r in ranks if r in inputs.syncs_of)
    core = _core.Core(stages, [stage_of(r) for r in ranks], ranks, issue_ranks, sync_ranks, compute_s, collective,
                      p2p, inputs.group_of, inputs.kappa, fair_rates(), Transfer, list(kinds))
    core.run()
    position = {r: i for i, r in enumerate(ranks)}
    rows, latest_s = _rows_of(core, stages, ranks, stage_of, event_type)
    return rows, latest_s, core.transfers, JobRows(*core.job_rows()), lambda r: core.finished_ids(position[r])


def _positions(ids: Sequence[int]) -> bool:
    """Whether a stage's op ids are its positions 0, 1, ...: a range (a built schedule's), or a list equal to one."""
    return ids == range(len(ids)) if isinstance(ids, range) else ids == list(range(len(ids)))


def _rows_of(core: _core.Core, stages: list, ranks: Sequence[int], stage_of: Callable[[int], int], event_type: type
             ) -> tuple[_rows.EventRows, float]:
    """The core's records as an EventRows (sim/engine/event_rows.py): rank and op id columns from its rank
    index and op index columns, the stage column from the rank; and the latest end."""
    (ri, op, start_s, end_s, wait_s, peer, peer_op), latest_s = core.columns()
    rank = np.asarray(ranks, dtype=np.int64)[ri]
    stage = np.asarray([stage_of(r) for r in ranks], dtype=np.intc)[ri]
    ids = [st.op_ids for st in stages]
    if all(_positions(i) for i in ids):
        op_id = op.astype(np.int64)  # ids are positions (every built schedule)
    else:
        base = np.cumsum([0] + [len(i) for i in ids[:-1]]).astype(np.int64)
        op_id = np.asarray(list(chain.from_iterable(ids)), dtype=np.int64)[base[stage] + op]
    columns = EventColumns(rank, op_id, start_s, end_s, wait_s, peer, peer_op)
    return _rows.EventRows(columns, stage, op, [st.ops for st in stages], [st.sizes for st in stages],
                           event_type), latest_s
