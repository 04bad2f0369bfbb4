"""Start N worker processes for a validate task, locally or under torchrun / SLURM.

Local: `launch(task, payload, nproc)` serves the workers' rendezvous store itself, on a localhost port the OS
picks (host_store), starts nproc processes (torch.multiprocessing; start method "forkserver" where the
platform has it, else "spawn"), and each one runs `worker_main`. The fork server imports torch and the
task modules once (PRELOAD) and forks every worker of this and later launches from that state: a worker
starts with its imports done (~2 s of CPU each otherwise) and, as with spawn, from a process that never
ran a task or touched CUDA. Under torchrun the same `worker_main` runs from
`python -m meshsim.validate.launch.launch TASK PAYLOAD.json --out DIR`, reading RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT from the environment (docs/validate.md).

A worker initialises the process group with a timeout (datetime.timedelta), runs the task, and rank 0
gathers every rank's result (gather_object) into DIR/results.json. Each rank writes DIR/joined.RANK once
it is in the group, so a rank that never joins, crashes or hangs is named in the error.

Locally spawned workers are watched (validate/launch/watchdog.py): heartbeats name a stopped or frozen
rank, exit codes a crashed one, and every worker is stopped before one LaunchError line is raised.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import importlib
import json
import os
import signal
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from meshsim.sim.core.userio import dumps_finite
from meshsim.validate.launch.watchdog import (
    RESULTS_FILE,
    LaunchError,
    fault_file,
    heartbeat,
    stale_after_s,
    stop_all,
    wait_for,
)
from meshsim.validate.stack.groups import set_timeout as set_group_timeout

TASKS = {
    "numerics": "meshsim.validate.numerics.check:numerics_task",
    "cp_numerics": "meshsim.validate.numerics.cp_check:cp_task",
    "timing": "meshsim.validate.timing.worker:timing_task",
    "calibrate": "meshsim.validate.calibrate.calibration:calibrate_task",
    "selftest": "meshsim.validate.launch.launch:selftest_task",
}


PRELOAD = list(dict.fromkeys(["torch", "torch.distributed", *(target.split(":")[0] for target in TASKS.values())]))


def start_method() -> str:
    """"forkserver" with PRELOAD imported in the server, where the platform has it; else "spawn"."""
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)  # takes effect when the server starts
    return "forkserver"


def _start(entry, args: tuple, nproc: int):
    """mp.start_processes with start_method(); spawn when the fork server cannot start (its AF_UNIX socket
    lives in TMPDIR, and a TMPDIR path near the 108-byte limit of such a path makes that fail)."""
    method = start_method()
    try:
        return mp.start_processes(entry, args=args, nprocs=nproc, join=False, start_method=method)
    except OSError:
        if method == "spawn":
            raise
        return mp.start_processes(entry, args=args, nprocs=nproc, join=False, start_method="spawn")


def host_store(nproc: int, timeout_s: float) -> dist.TCPStore:
    """The workers' rendezvous store, served by this process on a port the OS picks while binding it, and
    held until the launch ends. The workers connect to it as torchrun's workers connect to their agent's
    store (TORCHELASTIC_USE_AGENT_STORE, set in _spawn_entry). Picking a free port here and letting rank 0
    bind it later lost the port, now and then, to another process on a busy machine (EADDRINUSE)."""
    return dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


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
        if rank == 0:  # written whole, then renamed: the file exists only once complete
            (out / f"{RESULTS_FILE}.part").write_text(dumps_finite(gathered))  # what load_json reads back
            os.replace(out / f"{RESULTS_FILE}.part", out / RESULTS_FILE)
        dist.barrier()  # every rank is past the gather before any rank tears its connections down
    except Exception:
        (out / f"error.{rank}").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn_entry(local_rank: int, world: int, port: int, task: str, payload: dict, out_dir: str,
                 backend: str, timeout_s: float) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us, quietly
    if payload.get("absent_rank") == local_rank:  # launcher tests: this rank never joins
        return
    # A C++ abort or segfault, here or in the interpreter's teardown, leaves its Python stack in this file for
    # the watchdog; faulthandler holds the file open until the process ends.
    faulthandler.enable(open(fault_file(Path(out_dir), local_rank), "w"))  # noqa: SIM115
    with heartbeat(Path(out_dir) / f"alive.{local_rank}"):
        worker_main(task, payload, out_dir, backend, timeout_s)
    if payload.get("teardown_signal_rank") == local_rank:  # launcher tests: a crash after the results
        os.kill(os.getpid(), getattr(signal, payload["signal"]))


def launch(task: str, payload: dict, nproc: int, *, backend: str = "gloo", timeout_s: float = 60.0) -> list:
    """Spawn nproc local workers for `task`; returns the per-rank results (index = rank).
    Raises LaunchError naming the failing, missing or hung rank(s)."""
    with tempfile.TemporaryDirectory(prefix="meshsim-validate-") as tmp:
        out = Path(tmp)
        store = host_store(nproc, timeout_s)  # noqa: F841 (served while the workers run)
        ctx = _start(_spawn_entry, (nproc, store.port, task, payload, tmp, backend, timeout_s), nproc)
        try:
            wait_for(ctx, out, nproc, 2 * timeout_s + 30, stale_after_s(timeout_s))
        except BaseException:  # a LaunchError, or Ctrl-C / SIGTERM in the parent: no worker outlives it
            stop_all(ctx.processes)
            raise
        return json.loads((out / RESULTS_FILE).read_text())


def selftest_task(payload: dict) -> dict:
    """For tests of the launcher: payload {"fail_rank": r} raises there, {"hang_rank": r} sleeps there,
    {"signal_rank": r, "signal": "SIGSTOP" | "SIGKILL"} stops or kills rank r's process, {"absent_rank": r}
    makes rank r exit before joining and {"teardown_signal_rank": r, "signal": ...} signals rank r once the
    results are written (both handled in _spawn_entry)."""
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
