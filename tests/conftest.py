"""Fixtures shared by several test files, and the order the suite runs in.

Under pytest-xdist (.ci/run), `--dist loadfile` (pyproject's addopts) runs each file's tests on one worker,
in file order: a module-scoped fixture (e.g. one spawn of gloo processes serving every check of a file) runs
once, not once per worker, and a test that reads what an earlier test of its file recorded sees it.
`pytest_collection_modifyitems` below starts the costliest files first, so the two workers end together
instead of one running a long file alone at the end. Neither changes what any test runs or asserts.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

# Seconds a file's tests keep a worker busy in a 2-core run (measured; they set the order files start in,
# nothing else). A file not listed starts after the listed ones, in collection order; re-measure with
# --durations when the figures drift. Measured 2026-12-07: `pytest -n 2 --no-loadscope-reorder --durations=0
# tests`, each file's setup + call + teardown summed, on a machine at load ~5 (halved: about a quiet run's).
FILE_COST_S = {
    "test_arbiter_compiled.py": 121,
    "test_search.py": 99,
    "test_steady_state.py": 88,
    "test_engine_compiled.py": 58,
    "test_search_screen.py": 50,
    "test_kineto_fast.py": 47,
    "test_validate_launch.py": 30,
    "test_path_columns.py": 28,
    "test_tiled_shortcuts.py": 26,
    "test_validate_timing.py": 25,
    "test_steady_state_generated.py": 22,
    "test_search_bound.py": 17,
    "test_period_path_settled.py": 16,
    "test_hostile_inputs.py": 14,
    "test_row_fields.py": 14,
    "test_library_runs.py": 13,
    "test_golden.py": 12,
    "test_kineto_hostile.py": 10,
    "test_command_signals.py": 10,
    "test_schedule_arrays.py": 9,
    "test_shared_prices.py": 9,
    "test_validate_without_torch.py": 7,
    "test_validate_numerics.py": 7,
    "test_timeline_rows.py": 6,
    "test_ops_arrays.py": 5,
    "test_output_shortcuts.py": 5,
    "test_validate_numerics4.py": 5,
    "test_microbatch_group_size.py": 4,
    "test_kineto_reader.py": 4,
    "test_notebooks.py": 4,
    "test_validate_fp8.py": 4,
    "test_stamped_ops.py": 4,
    "test_critical_path_compiled.py": 4,
    "test_sweep.py": 4,
    "test_maxmin_compiled.py": 4,
    "test_validate_moe.py": 4,
    "test_validate_moe_units.py": 4,
    "test_validate_pp_timing.py": 3,
    "test_cli_main.py": 3,
    "test_pipeline.py": 3,
    "test_topologies.py": 3,
    "test_op_bound.py": 3,
    "test_accuracy_cases.py": 3,
    "test_stage_ops.py": 3,
}


@pytest.fixture(scope="module")
def stamped_always():
    """Every built stage holds its ops as stamps, however small (sim/schedule/tiling.py STAMPED_MIN_OPS): for
    the files that test StampedOps on small generated schedules."""
    from meshsim.sim.schedule import tiling

    before, tiling.STAMPED_MIN_OPS = tiling.STAMPED_MIN_OPS, 0
    yield
    tiling.STAMPED_MIN_OPS = before


@pytest.fixture(scope="module")
def world1():
    """A one-rank gloo group in this process, so the dist calls really run (skipped without torch; a group
    another fixture already initialised is reused and left alone)."""
    dist = pytest.importorskip("torch.distributed")
    mine = not dist.is_initialized()
    if mine:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    if mine:
        dist.destroy_process_group()


def pytest_sessionfinish(session):
    """Stop the fork server validate's launcher started in this process (validate/launch/launch.py), and wait
    for it: no process outlives the session, and its workers' CPU time is counted with this process's."""
    import multiprocessing.forkserver as forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


def pytest_collection_modifyitems(config, items):
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-FILE_COST_S.get(Path(item.nodeid.split("::", 1)[0]).name, 0.0), order[id(item)]))
