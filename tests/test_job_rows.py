"""The compiled core's arbiter jobs as columns (sim/engine/job_rows.py) read as the Python core's Job records:
on the engine's generated differential inputs (test_engine_compiled) every job of a compiled run equals the
native loop's, field for field, by index, slice, iteration and reversed; golden rows on a hand-made table
with odd tags and keys (not pairs of ints) and a chunk boundary; negative control: a changed column is seen."""

from __future__ import annotations

import numpy as np
import pytest
from test_steady_state import resolved

from meshsim.sim.engine import job_rows
from meshsim.sim.engine.arbiter import Job
from meshsim.sim.engine.job_rows import JobRows
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.results.simulate import run_stages, simulated_ranks
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules


def _table(n: int) -> tuple[JobRows, list[Job]]:
    load, own = {1: 1.0}, {2: 0.5}
    jobs = []
    for k in range(n):
        tag = (k % 5, k) if k % 7 else (0, 1, "fwd", k, 2)  # a P2P transfer's tag
        key = (k % 3, k) if k % 11 else ("compute", k)
        jobs.append(Job(tag, key, k * 0.1, k * 0.1 + 1 / 3, load, own if k % 2 else None))
    plain = [not (k % 7 == 0 or k % 11 == 0) for k in range(n)]

    def col(f) -> np.ndarray:
        return np.array([f(j) if p else 0 for j, p in zip(jobs, plain, strict=True)], np.int64)

    rows = JobRows(col(lambda j: j.tag[0]), col(lambda j: j.tag[1]), col(lambda j: j.key[0]), col(lambda j: j.key[1]),
                   np.array([j.start_s for j in jobs]), np.array([j.end_s for j in jobs]), [j.load for j in jobs],
                   [j.own for j in jobs], {k: (j.tag, j.key) for k, (j, p) in enumerate(zip(jobs, plain, strict=True)) if not p})
    return rows, jobs


@pytest.mark.parametrize("n", [0, 1, 13, 2 * 4096 + 5])
def test_rows_read_as_the_records(n, monkeypatch):
    rows, jobs = _table(n)
    assert len(rows) == n and list(rows) == jobs and rows == tuple(jobs) and tuple(jobs) == rows
    assert [rows[i] for i in range(-n, n)] == jobs + jobs
    assert rows[3:n - 2] == tuple(jobs[3:n - 2]) and rows[::3] == tuple(jobs[::3]) and rows[::-2] == tuple(jobs[::-2])
    assert list(reversed(rows)) == jobs[::-1] and repr(rows) == repr(tuple(jobs))
    assert all(type(j) is Job and type(j.tag[0]) is int and type(j.start_s) is float for j in rows)
    with pytest.raises(IndexError):
        rows[n]
    if n:
        rows.end_s[n - 1] += 1e-12  # negative control: another end time is another record
        assert rows != tuple(jobs) and rows[n - 1] != jobs[n - 1]


def test_columns_of_different_lengths_are_refused():
    rows, _ = _table(3)
    with pytest.raises(ValueError, match="different lengths"):
        JobRows(rows.tag0, rows.tag1, rows.key0, rows.key1, rows.start_s[:2], rows.end_s, rows.loads, rows.owns, {})


@pytest.mark.parametrize("name", ["llama2-70b-h100-pp4", "mixtral-8x7b-h100-ep8", "tiny-2gpu"])
def test_a_compiled_runs_jobs_equal_the_python_cores(name):
    rs = resolved(name, {}, 8)
    schedules = build_stage_schedules(rs)
    logs = [run_stages(rs, schedules, simulated_ranks(rs, False), CollectiveCoster(rs), engine)
            for engine in ("compiled", "python")]
    assert isinstance(logs[0].jobs, JobRows) and type(logs[1].jobs) is tuple
    assert logs[0].jobs == logs[1].jobs and len(logs[1].jobs)
    for which in ("jobs",):
        a, b = logs[0].span_times(which), logs[1].span_times(which)
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert job_rows.CHUNK > 0
