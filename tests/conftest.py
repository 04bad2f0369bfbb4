"""Fixtures shared by several test files, and the order the suite runs in.

Under pytest-xdist (.ci/run), `--dist loadfile` (pyproject's addopts) runs each file's tests on one worker,
in file order: a module-scoped fixture (e.g. one spawn of gloo processes serving every check of a file) runs
once, not once per worker, and a test that reads what an earlier test of its file recorded sees it.
`pytest_collection_modifyitems` below starts the costliest files first, so the two workers end together
instead of one running a long file alone at the end. Neither changes what any test runs or asserts.
"""

from __future__ import annotations

import gc
import socket
from pathlib import Path

import pytest

# Seconds a file's tests keep a worker busy in a 2-core run (measured; they set the order files start in,
# nothing else). Every file is listed; a file not listed (a new one) counts as UNLISTED_COST_S: started among
# the middling files, not last, so the cheap listed files fill the tail. Re-measure when the figures drift.
# Measured 2026-12-07 on a machine at load ~14: `pytest -n 2 --no-loadscope-reorder tests` with a plugin
# summing each test's setup + call + teardown per file, as CPU seconds of the worker and its waited-for
# children, or as wall seconds over the run's wall/CPU ratio (7.4) where larger (files whose work runs in
# processes the worker does not wait for: torch.distributed's, notebook kernels); about a quiet run's seconds.
# test_search.py and test_search_screen.py: that figure less what their cheaper tests saved, measured alone.
FILE_COST_S = {
    "test_arbiter_compiled.py": 48, "test_tiled_shortcuts.py": 36, "test_steady_state.py": 35,
    "test_engine_compiled.py": 32, "test_search.py": 31, "test_kineto_fast.py": 30,
    "test_steady_state_generated.py": 22, "test_validate_launch.py": 20, "test_search_screen.py": 20,
    "test_validate_timing.py": 17, "test_search_bound.py": 17, "test_hostile_inputs.py": 13,
    "test_path_columns.py": 11, "test_maxmin_compiled.py": 11, "test_command_signals.py": 10,
    "test_row_fields.py": 10, "test_golden.py": 9.2, "test_microbatch_group_size.py": 9.1,
    "test_library_runs.py": 8.9, "test_ops_arrays.py": 8.9, "test_stage_ops.py": 8.2, "test_notebooks.py": 8.1,
    "test_shared_prices.py": 7.3, "test_kineto_hostile.py": 7.2, "test_kineto_reader.py": 7.2,
    "test_output_shortcuts.py": 6.4, "test_validate_numerics4.py": 6.0, "test_validate_fp8.py": 6.0,
    "test_trace_rows.py": 5.9, "test_critical_path_compiled.py": 5.7, "test_architecture.py": 5.7,
    "test_stamped_ops.py": 5.5, "test_sweep.py": 5.4, "test_pipeline.py": 5.1,
    "test_validate_without_torch.py": 4.6, "test_validate_pp_timing.py": 4.6, "test_identity_memos.py": 4.5,
    "test_period_path_settled.py": 4.2, "test_timeline_rows.py": 4.2, "test_validate_moe_units.py": 4.1,
    "test_op_bound.py": 4.0, "test_job_rows.py": 4.0, "test_validate_numerics.py": 3.9, "test_sweep_store.py": 3.5,
    "test_results_arrays.py": 3.5, "test_fair_rates_compiled.py": 3.5, "test_kineto_validate.py": 3.3,
    "test_collective_plans_fast.py": 2.7, "test_accuracy_cases.py": 2.6, "test_search_pipeline_arrays.py": 2.4,
    "test_topologies.py": 2.4, "test_readable_output.py": 2.4, "test_first_contact.py": 2.4,
    "test_fabric_blocks.py": 2.3, "test_validate_units.py": 2.2, "test_collectives_sharing.py": 2.2,
    "test_cp_moe.py": 2.2, "test_route_bulk.py": 2.1, "test_cli_main.py": 2.1, "test_validate_moe.py": 2.1,
    "test_bounded_inputs.py": 2.0, "test_presentation.py": 2.0, "test_validate_pipeline.py": 1.8,
    "test_search_windows.py": 1.8, "test_count_between.py": 1.7, "test_qk_norm.py": 1.6, "test_kineto_cli.py": 1.6,
    "test_arbiter_memo.py": 1.6, "test_result_records.py": 1.3, "test_collectives_maxmin.py": 1.3,
    "test_outputs.py": 1.3, "test_search_pipeline.py": 1.2, "test_overlapped_group_plan.py": 1.1,
    "test_mtp.py": 0.9, "test_schedule_arrays.py": 0.9, "test_releases.py": 0.9, "test_validate_backends.py": 0.8,
    "test_fabric_build.py": 0.8, "test_search_memory.py": 0.8, "test_validate_cp.py": 0.8,
    "test_period_path_before.py": 0.7, "test_engine_loop.py": 0.6, "test_compare.py": 0.5,
    "test_first_contact_cli.py": 0.5, "test_stage_groups.py": 0.4, "test_store_integrity.py": 0.4,
    "test_scenarios.py": 0.3, "test_validate_library.py": 0.3, "test_schema_defaults.py": 0.3, "test_fp8.py": 0.2,
    "test_collectives_model.py": 0.2, "test_collectives_cli.py": 0.2, "test_builder.py": 0.2,
    "test_interference.py": 0.2, "test_usage_errors.py": 0.2, "test_run_cli.py": 0.2, "test_nvls_tree.py": 0.2,
    "test_collectives_choice.py": 0.2, "test_ep_overlap_pp.py": 0.2, "test_dist_opt_instances.py": 0.1,
    "test_terminal_text.py": 0.1, "test_moe_schedule.py": 0.1, "test_optimizer_states.py": 0.1,
    "test_ep_overlap.py": 0.1, "test_expert_bias_clamp.py": 0.1, "test_cp.py": 0.1, "test_fsdp.py": 0.1,
    "test_operand_traffic.py": 0.1, "test_moe_config.py": 0.1, "test_host_sync.py": 0.1, "test_gc_frozen.py": 0.1,
    "test_scenario_value_names.py": 0.1, "test_validate_noise.py": 0.1, "test_timeline_runs.py": 0.1,
    "test_rss_shortcuts.py": 0.1, "test_p2p_scatter_gather.py": 0.1, "test_collectives_nccl_geometry.py": 0.1,
    "test_mla_fp8.py": 0.1, "test_recompute_modules.py": 0.1, "test_moe_fp8.py": 0.0, "test_muon.py": 0.0,
    "test_run_mechanisms.py": 0.0, "test_compute.py": 0.0, "test_engine.py": 0.0, "test_rack_gpus.py": 0.0,
    "test_ep_results.py": 0.0, "test_layer_templates_memo.py": 0.0, "test_fp8_paths.py": 0.0, "test_memory.py": 0.0,
    "test_nvfp4.py": 0.0, "test_nccl_limits.py": 0.0, "test_flex_cost.py": 0.0, "test_trace_hta.py": 0.0,
    "test_step_event_log.py": 0.0, "test_gemm_by_gpu.py": 0.0, "test_gemm_clock.py": 0.0,
    "test_fa2_legacy_rate.py": 0.0, "test_cudnn_deterministic.py": 0.0, "test_fa2_deterministic.py": 0.0,
    "test_userbuffers.py": 0.0, "test_event_columns.py": 0.0, "test_gemm_split_k.py": 0.0,
}
UNLISTED_COST_S = 8.0


def file_cost_s(nodeid: str) -> float:
    """FILE_COST_S of the test's file, UNLISTED_COST_S when the file is not listed."""
    return FILE_COST_S.get(Path(nodeid.split("::", 1)[0]).name, UNLISTED_COST_S)


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


# The cyclic collector's young-generation threshold (CPython's default 700 allocations): the tests allocate
# millions of short-lived containers (generated cases, Segment lists, events), and a collection every 700 of
# them took ~20% of a file's CPU time (test_path_columns: 1.9 of 9.8 s) for nothing, since almost none
# of them are cyclic garbage. 20,000 keeps the young generation small (a few MiB) and the same objects are
# collected, only later; no value depends on when (simulate runs with the collector off: gc_frozen).
GC_YOUNG_THRESHOLD = 20_000


def pytest_configure(config):
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def pytest_sessionfinish(session):
    """Stop the fork server validate's launcher started in this process (validate/launch/launch.py), and wait
    for it: no process outlives the session, and its workers' CPU time is counted with this process's."""
    import multiprocessing.forkserver as forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()


def pytest_collection_modifyitems(config, items):
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-file_cost_s(item.nodeid), order[id(item)]))
