"""The launcher's watchdog over locally spawned workers: heartbeats, and one line naming what went wrong.

Each spawned worker runs `heartbeat`, a daemon thread touching DIR/alive.RANK every HEARTBEAT_S. `wait_for`
polls exit codes and heartbeats: a rank whose heartbeat is older than stale_after_s(timeout_s) (stopped by
SIGSTOP, or frozen) is named as hung; a rank that died (kill -9) is named with its signal, and the ranks
that were only waiting for it are not called hung; a rank that never wrote DIR/joined.RANK never joined.
Then every worker is stopped (`stop_all`: SIGTERM, and SIGKILL after KILL_GRACE_S, since a stopped process
never acts on SIGTERM) and a LaunchError carries one line; the CLI prints it and exits 1.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from pathlib import Path

from meshsim.sim.core.errors import CommandFailed

FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to exit before being called hung
HEARTBEAT_S = 0.5  # a spawned worker touches DIR/alive.RANK this often
STALE_MAX_S = 30.0  # a heartbeat older than min(this, timeout_s / 2) means the rank is stopped or frozen,
STALE_MIN_S = 5.0  # ... but never less than this (a loaded machine delays threads by a second or two)
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
MESSAGE_CHARS = 200  # each rank's error line is cut to this length
TEARDOWN_GRACE_S = 10.0  # once the results are written, how long the ranks get to exit before being stopped
RESULTS_FILE = "results.json"  # rank 0 writes it whole (renamed into place) once every rank's result is in
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


class LaunchError(CommandFailed):
    """A worker failed, never joined or hung; the one-line message names the rank(s). Exit status 1."""





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


def fault_file(out: Path, rank: int) -> Path:
    """Where rank's faulthandler writes the Python stack of a fatal signal (SIGABRT, SIGSEGV, ...)."""
    return out / f"fault.{rank}"


def fault_site(out: Path, rank: int) -> str:
    """' (in FUNC, FILE:LINE)': the innermost Python frame of the crashing thread that rank's faulthandler
    recorded, or '' when it recorded none (SIGKILL cannot be caught)."""
    try:
        text = fault_file(out, rank).read_text()
    except OSError:
        return ""
    current = text.split("Current thread", 1)[-1]
    frame = _FRAME.search(current) or _FRAME.search(text)
    return f" (in {frame['func']}, {Path(frame['file']).name}:{frame['line']})" if frame else ""


def _death_of(out: Path, rank: int, code: int) -> str:
    return f"rank {rank} {_death(code)}" + (fault_site(out, rank) if code < 0 else "")


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


def _diagnosis(out: Path, codes: list, stopped: list[int], late: bool, deadline_s: float, stale_s: float
               ) -> list[str]:
    """What went wrong, naming the rank(s) responsible first and the ranks merely waiting last."""
    killed = [r for r, c in enumerate(codes) if c is not None and c < 0]
    failed = [r for r, c in enumerate(codes) if c is not None and c > 0]
    alive = [r for r, c in enumerate(codes) if c is None and r not in stopped]
    what = [f"rank(s) {stopped} stopped responding (no heartbeat for {stale_s:.0f} s: stopped or frozen)"] \
        if stopped else []
    what += [_death_of(out, r, codes[r]) for r in killed]
    cause = bool(stopped or killed)
    if failed:
        what += [f"rank(s) {failed} failed while waiting for them"] if cause else \
            [_death_of(out, r, codes[r]) for r in failed]
    if not what and late:
        what.append(f"no result after {deadline_s:.0f} s")
    if alive:
        what.append(f"rank(s) {alive} were waiting for them and were stopped" if cause else
                    f"rank(s) {alive} still running (hung or blocked in a collective)")
    return what


def wait_for(ctx, out: Path, nproc: int, deadline_s: float, stale_s: float) -> None:
    """Poll the workers: return when all exit 0; on a failure, a stale heartbeat or past the deadline stop
    every worker and raise, naming stopped, failed, waiting and never-joined ranks. Once rank 0 has written
    the results, a rank that fails or hangs while tearing down is reported (after_results), not raised."""
    start = time.monotonic()
    while True:
        codes = [p.exitcode for p in ctx.processes]
        if all(c == 0 for c in codes):
            return
        if (out / RESULTS_FILE).exists():
            return after_results(ctx.processes, out)
        stopped = _stale(out, codes, stale_s)
        failed = any(c not in (None, 0) for c in codes)
        late = time.monotonic() - start > deadline_s
        if stopped or failed or late:
            if failed and not stopped:
                _grace(ctx.processes, FAILURE_GRACE_S)
                codes = [p.exitcode for p in ctx.processes]
            what = _diagnosis(out, codes, stopped, late, deadline_s, stale_s)
            stop_all(ctx.processes)
            raise _failure(out, nproc, what)
        time.sleep(0.05)


def after_results(processes, out: Path) -> None:
    """Every rank passed the gather and rank 0 wrote the results: give the ranks TEARDOWN_GRACE_S to exit,
    stop the rest, and name on stderr any that crashed or hung while tearing down. Nothing after the gather
    can change the results, so they stand (a CI run saw one rank abort there, "terminate called without an
    active exception", while the others exited cleanly)."""
    _grace(processes, TEARDOWN_GRACE_S)
    codes = [p.exitcode for p in processes]
    stop_all(processes)
    bad = [_death_of(out, r, c) if c is not None else f"rank {r} did not exit" for r, c in enumerate(codes) if c != 0]
    if bad:
        print(f"meshsim validate: {'; '.join(bad)} after every rank's result was gathered, while tearing down; "
              "the results are complete and stand", file=sys.stderr)
