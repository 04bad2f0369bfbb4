"""Start N worker processes for a validate task, locally (spawn) or under torchrun / SLURM.

Local: `launch(task, payload, nproc)` picks a free localhost port, spawns nproc processes
(torch.multiprocessing, start method "spawn"), and each one runs `worker_main`. Under torchrun the
same `worker_main` runs from `python -m meshsim.validate.launch.launch TASK PAYLOAD.json --out DIR`, reading
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from the environment (docs/validate.md).

A worker initialises the process group with a timeout (datetime.timedelta), runs the task, and rank 0
gathers every rank's result (gather_object) into DIR/results.json. Each rank writes DIR/joined.RANK once
it is in the group, so a rank that never joins, crashes or hangs is named in the error.

Locally spawned workers also run a heartbeat thread that touches DIR/alive.RANK every HEARTBEAT_S. The
launcher polls exit codes and heartbeats: a rank whose heartbeat is older than stale_after_s(timeout_s)
(stopped by SIGSTOP, or frozen) is named as hung; a rank that died (kill -9) is named with its signal,
and the ranks that were only waiting for it are not called hung. Then every worker is stopped: SIGTERM,
and SIGKILL after KILL_GRACE_S (a stopped process never acts on SIGTERM). LaunchError carries one line;
the CLI prints it and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import signal
import socket
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshsim.sim.core.errors import CommandFailed
from meshsim.sim.core.userio import dumps_finite
from meshsim.validate.stack.groups import set_timeout as set_group_timeout

TASKS = {
    "numerics": "meshsim.validate.numerics.check:numerics_task",
    "cp_numerics": "meshsim.validate.numerics.cp_check:cp_task",
    "timing": "meshsim.validate.timing.worker:timing_task",
    "calibrate": "meshsim.validate.calibrate.calibration:calibrate_task",
    "selftest": "meshsim.validate.launch.launch:selftest_task",
}


FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to exit before being called hung
HEARTBEAT_S = 0.5  # a spawned worker touches DIR/alive.RANK this often
STALE_MAX_S = 30.0  # a heartbeat older than min(this, timeout_s / 2) means the rank is stopped or frozen,
STALE_MIN_S = 5.0  # ... but never less than this (a loaded machine delays threads by a second or two)
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
MESSAGE_CHARS = 200  # each rank's error line is cut to this length


class LaunchError(CommandFailed):
    """A worker failed, never joined or hung; the one-line message names the rank(s). Exit status 1."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pin_to_core(local_rank: int) -> None:
    """On CPU, pin local rank r to core r (when there are enough cores): a rank and its gloo threads then
    always share one core, instead of the scheduler moving processes across cores between runs, which
    made whole runs 10-30% slower or faster than others on a 2-core machine."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    world_local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if cores and world_local <= len(cores):
        os.sched_setaffinity(0, {cores[local_rank % len(cores)]})


def init_process_group(backend: str, timeout_s: float) -> tuple[int, int]:
    """env:// initialisation with a timeout (also recorded for every subgroup validate/ creates); one CPU
    thread per process; CUDA device = LOCAL_RANK. Returns (rank, world_size)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        torch.set_num_threads(1)
        pin_to_core(int(os.environ.get("LOCAL_RANK", rank)))
    timeout = datetime.timedelta(seconds=timeout_s)
    set_group_timeout(timeout)  # the same timeout on every subgroup (validate/stack/groups.py)
    try:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
    except Exception as exc:
        raise LaunchError(f"rank {rank}: the process group ({world} ranks, {backend}) did not form within "
                          f"{timeout_s:.0f} s: some rank never joined ({exc})") from exc
    return rank, world


def _task(name: str):
    module, func = TASKS[name].split(":")
    return getattr(importlib.import_module(module), func)


def worker_main(task: str, payload: dict, out_dir: str, backend: str = "gloo", timeout_s: float = 60.0) -> None:
    """Run one task on this rank; rank 0 writes every rank's result to out_dir/results.json.
    A failure is also written to out_dir/error.RANK (its last line names the problem)."""
    out = Path(out_dir)
    rank = int(os.environ.get("RANK", -1))
    try:
        rank, world = init_process_group(backend, timeout_s)
        (out / f"joined.{rank}").touch()
        result = _task(task)(payload)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        if rank == 0:
            (out / "results.json").write_text(dumps_finite(gathered))  # what load_json reads back
    except Exception:
        (out / f"error.{rank}").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn_entry(local_rank: int, world: int, port: int, task: str, payload: dict, out_dir: str,
                 backend: str, timeout_s: float) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us, quietly
    if payload.get("absent_rank") == local_rank:  # launcher tests: this rank never joins
        return
    with heartbeat(Path(out_dir) / f"alive.{local_rank}"):
        worker_main(task, payload, out_dir, backend, timeout_s)


@contextlib.contextmanager
def heartbeat(path: Path):
    """Touch `path` every HEARTBEAT_S from a daemon thread while the block runs (a stopped or frozen
    process stops it too); the file is removed when the block ends, so a finished rank is never stale."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            path.touch()

    path.touch()
    threading.Thread(target=beat, daemon=True, name="meshsim-heartbeat").start()
    try:
        yield
    finally:
        done.set()
        path.unlink(missing_ok=True)


def stale_after_s(timeout_s: float) -> float:
    """Heartbeat age that marks a rank as stopped: within the configured timeout, before a waiting peer's
    own collective timeout fires."""
    return max(STALE_MIN_S, min(STALE_MAX_S, timeout_s / 2))


def _stale(out: Path, codes: list, stale_s: float) -> list[int]:
    """Running ranks whose heartbeat (once started) is older than stale_s."""
    now, stale = time.time(), []
    for rank, code in enumerate(codes):
        beat = out / f"alive.{rank}"
        try:
            if code is None and now - beat.stat().st_mtime > stale_s:
                stale.append(rank)
        except OSError:
            continue  # not started yet: covered by the overall deadline
    return stale


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _failure(out: Path, nproc: int, what: list[str]) -> LaunchError:
    joined = {int(p.suffix[1:]) for p in out.glob("joined.*")}
    errors = {int(p.suffix[1:]): (p.read_text().strip().splitlines() or [""])[-1][:MESSAGE_CHARS]
              for p in out.glob("error.*")}
    missing = [r for r in range(nproc) if r not in joined and r not in errors]
    parts = list(what)
    if missing:
        parts.append(f"rank(s) {missing} never joined the process group")
    parts += [f"rank {r}: {msg}" for r, msg in sorted(errors.items())]
    return LaunchError("; ".join(parts))


def _grace(processes, seconds: float) -> None:
    """Give the other ranks a moment to fail on their own (a peer's crash closes their connections)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(p.is_alive() for p in processes):
        time.sleep(0.05)


def stop_all(processes, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every live worker, then SIGKILL what is left after grace_s (SIGKILL also ends a stopped one)."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    _grace(processes, grace_s)
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join(timeout=5)


def _diagnosis(codes: list, stopped: list[int], late: bool, deadline_s: float, stale_s: float) -> list[str]:
    """What went wrong, naming the rank(s) responsible first and the ranks merely waiting last."""
    killed = [r for r, c in enumerate(codes) if c is not None and c < 0]
    failed = [r for r, c in enumerate(codes) if c is not None and c > 0]
    alive = [r for r, c in enumerate(codes) if c is None and r not in stopped]
    what = [f"rank(s) {stopped} stopped responding (no heartbeat for {stale_s:.0f} s: stopped or frozen)"] \
        if stopped else []
    what += [f"rank {r} {_death(codes[r])}" for r in killed]
    cause = bool(stopped or killed)
    if failed:
        what += [f"rank(s) {failed} failed while waiting for them"] if cause else \
            [f"rank {r} {_death(codes[r])}" for r in failed]
    if not what and late:
        what.append(f"no result after {deadline_s:.0f} s")
    if alive:
        what.append(f"rank(s) {alive} were waiting for them and were stopped" if cause else
                    f"rank(s) {alive} still running (hung or blocked in a collective)")
    return what


def _wait(ctx, out: Path, nproc: int, deadline_s: float, stale_s: float) -> None:
    """Poll the workers: return when all exit 0; on a failure, a stale heartbeat or past the deadline stop
    every worker and raise, naming stopped, failed, waiting and never-joined ranks."""
    start = time.monotonic()
    while True:
        codes = [p.exitcode for p in ctx.processes]
        if all(c == 0 for c in codes):
            return
        stopped = _stale(out, codes, stale_s)
        failed = any(c not in (None, 0) for c in codes)
        late = time.monotonic() - start > deadline_s
        if stopped or failed or late:
            if failed and not stopped:
                _grace(ctx.processes, FAILURE_GRACE_S)
                codes = [p.exitcode for p in ctx.processes]
            what = _diagnosis(codes, stopped, late, deadline_s, stale_s)
            stop_all(ctx.processes)
            raise _failure(out, nproc, what)
        time.sleep(0.05)


def launch(task: str, payload: dict, nproc: int, *, backend: str = "gloo", timeout_s: float = 60.0) -> list:
    """Spawn nproc local workers for `task`; returns the per-rank results (index = rank).
    Raises LaunchError naming the failing, missing or hung rank(s)."""
    with tempfile.TemporaryDirectory(prefix="meshsim-validate-") as tmp:
        out = Path(tmp)
        ctx = mp.start_processes(_spawn_entry, args=(nproc, free_port(), task, payload, tmp, backend, timeout_s),
                                 nprocs=nproc, join=False, start_method="spawn")
        try:
            _wait(ctx, out, nproc, 2 * timeout_s + 30, stale_after_s(timeout_s))
        except BaseException:  # a LaunchError, or Ctrl-C / SIGTERM in the parent: no worker outlives it
            stop_all(ctx.processes)
            raise
        return json.loads((out / "results.json").read_text())


def selftest_task(payload: dict) -> dict:
    """For tests of the launcher: payload {"fail_rank": r} raises there, {"hang_rank": r} sleeps there,
    {"signal_rank": r, "signal": "SIGSTOP" | "SIGKILL"} stops or kills rank r's process, {"absent_rank": r}
    makes rank r exit before joining (handled in _spawn_entry)."""
    rank = dist.get_rank()
    if payload.get("signal_rank") == rank:  # stop (SIGSTOP) or kill (SIGKILL) this whole process
        os.kill(os.getpid(), getattr(signal, payload["signal"]))
    if payload.get("fail_rank") == rank:
        raise RuntimeError(f"deliberate failure on rank {rank}")
    if payload.get("hang_rank") == rank:
        time.sleep(payload.get("hang_s", 3600))
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)
    return {"rank": rank, "sum": value.item()}


def main(argv: list[str] | None = None) -> None:
    """torchrun entry: python -m meshsim.validate.launch.launch TASK PAYLOAD.json --out DIR [--backend B]."""
    parser = argparse.ArgumentParser(prog="python -m meshsim.validate.launch.launch")
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("payload", help="JSON file with the task's payload (meshsim validate --dump-payload)")
    parser.add_argument("--out", required=True, help="directory for results.json (rank 0)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                        help="default: the payload's backend (meshsim ... --dump-payload writes it), else nccl "
                        "when CUDA is available")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    payload = json.loads(Path(args.payload).read_text())
    try:
        backend = payload_backend(payload, args.backend)
    except ValueError as exc:
        parser.error(str(exc))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    worker_main(args.task, payload, args.out, backend, args.timeout_s)


def payload_backend(payload: dict, requested: str | None) -> str:
    """The backend to run a dumped payload on: the one it was shrunk for (payload["backend"]), so the
    workers measure the schedule the parent will rebuild; a different --backend is refused (ValueError).
    Payloads without one (hand-written) take `requested`, else nccl when CUDA is available."""
    dumped = payload.get("backend")
    if dumped is not None and requested is not None and requested != dumped:
        raise ValueError(f"--backend {requested} but the payload was made for {dumped}; drop --backend, or "
                         f"dump the payload again with --backend {requested}")
    return dumped or requested or ("nccl" if torch.cuda.is_available() else "gloo")


if __name__ == "__main__":
    main()
