"""Run a sweep's configurations: in-process, on a local process pool, or as Ray tasks; resumable.

Every finished configuration is appended at once as one JSON line to `OUT/sweep.jsonl` (sim/sweep/store.py:
locked, append-only, records keyed by scenario digest and never deleted). On start the store is read
back: configurations whose key is present with this scenario's digest are not run again; bad lines are
reported on stderr and skipped.

Backends give identical records: each runs the same pure `record.run_point` (a module-level function).
- jobs=1: in this process (and the only mode where a monkeypatched runner is seen by tests);
- jobs>1: concurrent.futures.ProcessPoolExecutor with `jobs` workers, each of which exits when the sweep's
  process goes away (even on SIGKILL), so no worker is ever orphaned;
- ray_address: `ray.init(address)`; "local" starts a private local instance, "auto" joins a running
  cluster or starts a local instance when none is found; an already-initialized Ray is reused.

SIGTERM and SIGINT stop the sweep: the workers are killed, every finished record is already on disk, and
SweepInterrupted (exit status 128 + signal) says how many were kept; the same command resumes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshsim.sim.core.errors import CommandFailed, UserError
from meshsim.sim.core.interrupt import deferred, signals_raise
from meshsim.sim.core.text import plain
from meshsim.sim.sweep.axes import SweepPoint, referenced_snapshot, scenario_digest
from meshsim.sim.sweep.record import SweepRecord, run_point
from meshsim.sim.sweep.store import JSONL_NAME, append_record, read_records, read_store

__all__ = ["JSONL_NAME", "SweepInterrupted", "read_records", "ray_init", "run_sweep"]

Runner = Callable[..., SweepRecord]
PARENT_POLL_S = 0.5  # how often a pool worker checks that the sweep's process is still there


class SweepInterrupted(CommandFailed):
    """SIGTERM / SIGINT during a sweep; finished records are kept."""

    def __init__(self, signum: int, kept: int = 0, total: int = 0, out_dir: Path | None = None):
        self.signum = signum
        where = f" in {Path(out_dir) / JSONL_NAME}; run the same command to resume" if out_dir else ""
        super().__init__(f"interrupted by {signal.Signals(signum).name}: {kept} of {total} configurations "
                         f"kept{where}", exit_code=128 + signum)


def _signals_interrupt():
    """Turn SIGTERM and SIGINT into SweepInterrupted in this (main) thread for the block's duration."""
    return signals_raise(SweepInterrupted)


def worker_init(parent_pid: int) -> None:
    """In each pool worker: default SIGTERM, ignore SIGINT (the sweep's process handles Ctrl-C), and exit as
    soon as the parent is gone (prctl's parent-death signal where available, else a polling thread)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):  # Linux: the kernel SIGKILLs this worker with its parent
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="meshsim-parent-watch").start()


# ----- backends -------------------------------------------------------------------------------------
def _run_local(todo, args, jobs: int, runner: Runner, on_done) -> None:
    if jobs <= 1:
        for point in todo:
            on_done(runner(*args(point)))
        return
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=worker_init, initargs=(os.getpid(),))
    try:
        futures = [pool.submit(runner, *args(point)) for point in todo]
        for future in as_completed(futures):
            on_done(future.result())
    except BaseException:
        kill_workers(pool)
        raise
    pool.shutdown(wait=True)


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now: drop queued work and SIGKILL its processes (the executor keeps them in _processes)."""
    processes = list(getattr(pool, "_processes", {}).values())
    for proc in processes:
        if proc.is_alive():
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.join(timeout=5)
    # The executor's manager thread closes its wake-up pipe as it exits. CPython 3.11's atexit hook
    # (concurrent.futures.process._python_exit) checks that pipe's `_closed` flag and then writes to it
    # without a lock, so a manager thread that closes the pipe between the check and the write raises
    # "Bad file descriptor" at interpreter exit. Joining the thread here closes the pipe before exit.
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(timeout=5)


def ray_init(address: str):
    """Connect to (or start) Ray; returns the ray module. UserError if the extra is not installed."""
    try:
        import ray  # meshsim[ray] extra: optional
    except ImportError as exc:
        raise UserError("--ray", address, "install the Ray extra: pip install 'meshsim[ray]'",
                        problem="ray is not installed") from exc
    if ray.is_initialized():
        return ray
    if address == "local":
        ray.init(include_dashboard=False, log_to_driver=False)
    elif address == "auto":
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:
            ray.init(include_dashboard=False, log_to_driver=False)
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise UserError("--ray", address, "give a running cluster's address (HOST:6379 or ray://HOST:10001), "
                            "'auto' or 'local'", problem=str(exc).splitlines()[0] if str(exc) else "") from None
    return ray


def _run_ray(todo, scenario, source, digest, files, address: str, runner: Runner, on_done) -> None:
    ray = ray_init(address)
    remote = ray.remote(runner)
    scenario_ref, files_ref = ray.put(scenario), ray.put(files)
    pending = [remote.remote(scenario_ref, source, point, digest, files_ref) for point in todo]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            on_done(ray.get(ref))


# ----- the sweep ------------------------------------------------------------------------------------
def run_sweep(scenario, source: str, points: list[SweepPoint], *, jobs: int = 1, out_dir: str | Path | None = None,
              ray_address: str | None = None, progress: bool = True, runner: Runner = run_point,
              warn: Callable[[str], None] | None = None) -> list[dict]:
    """Run every configuration not already in OUT/sweep.jsonl -> records in `points` order. Bad lines of
    the store are passed to `warn` (default: printed on stderr). The files the scenario references are
    read once, here: every configuration is computed from these bytes and stored under their digest."""
    files = referenced_snapshot(scenario, source)
    digest = scenario_digest(scenario, source, files)
    done: dict[str, SweepRecord] = {}
    if out_dir is not None:
        stored = read_store(out_dir, digest)
        for problem in stored.problems:
            (warn or _warn)(f"{Path(out_dir) / JSONL_NAME} {problem}: skipped")
        done = stored.records
    wanted = {p.key for p in points}
    done = {k: r for k, r in done.items() if k in wanted}
    todo = [p for p in points if p.key not in done]
    with _progress(progress) as bar, _signals_interrupt():
        task = bar.add_task("sweep", total=len(points), completed=len(done))

        def on_done(record: SweepRecord) -> None:
            with deferred():  # stored and counted together: "N kept" is what the file holds
                if out_dir is not None:
                    append_record(out_dir, record)
                done[record.key] = record
            bar.update(task, advance=1, description=record.key, refresh=True)

        try:
            if ray_address:
                _run_ray(todo, scenario, source, digest, files, ray_address, runner, on_done)
            else:
                _run_local(todo, lambda p: (scenario, source, p, digest, files), jobs, runner, on_done)
        except SweepInterrupted as stop:
            raise SweepInterrupted(stop.signum, len(done), len(points), out_dir) from None
    return [done[p.key] for p in points]


def _warn(message: str) -> None:
    Console(stderr=True).print(f"warning: {plain(message)}", highlight=False, markup=False)


def _progress(enabled: bool) -> Progress:
    """A bar on stderr without a refresh thread (worker processes are forked while it is live)."""
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), auto_refresh=False, disable=not enabled, transient=False)
