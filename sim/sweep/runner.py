"""Run a sweep's configurations: in-process, on a local process pool, or as Ray tasks; resumable.

Every finished configuration is appended at once as one JSON line to `OUT/sweep.jsonl` (flushed and
fsynced), keyed by `SweepPoint.key` and tagged with the scenario digest. On start the file is read back:
configurations whose key is present with the same digest are not run again; a truncated last line (a
killed run) and records of a different scenario (the scenario changed since) are dropped and the file
is rewritten without them, so later appends start on a clean line.

Backends give identical records: each runs the same pure `record.run_point` (a module-level function).
- jobs=1: in this process (and the only mode where a monkeypatched runner is seen by tests);
- jobs>1: concurrent.futures.ProcessPoolExecutor with `jobs` workers;
- ray_address: `ray.init(address)`; "local" starts a private local instance, "auto" joins a running
  cluster or starts a local instance when none is found; an already-initialized Ray is reused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meshsim.sim.core.errors import UserError
from meshsim.sim.sweep.axes import SweepPoint, scenario_digest
from meshsim.sim.sweep.record import SweepRecord, run_point

JSONL_NAME = "sweep.jsonl"
Runner = Callable[..., SweepRecord]


# ----- JSON-lines store ------------------------------------------------------------------------------
def read_records(path: str | Path, digest: str | None = None) -> tuple[dict[str, SweepRecord], int]:
    """Records by key from a JSON-lines file -> (records, dropped lines). Tolerates a truncated or
    garbled line; with `digest`, drops records of another scenario. Rewrites the file if it dropped any."""
    path = Path(path)
    if not path.exists():
        return {}, 0
    records: dict[str, SweepRecord] = {}
    dropped = 0
    text = path.read_text()
    for line in text.splitlines():
        try:
            record = SweepRecord.from_json(json.loads(line))
        except json.JSONDecodeError:
            dropped += bool(line.strip())
            continue
        except (ValueError, KeyError, TypeError, AttributeError):
            dropped += 1  # valid JSON that is not a record
            continue
        if digest is not None and record.scenario_digest != digest:
            dropped += 1
            continue
        records[record.key] = record
    if dropped or (text and not text.endswith("\n")):
        _rewrite(path, records.values())
    return records, dropped


def _rewrite(path: Path, records: Iterable[SweepRecord]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    os.replace(tmp, path)


def append_record(path: str | Path, record: SweepRecord) -> None:
    """Append one record as one line and make it durable before the next configuration finishes."""
    with open(path, "a") as fh:
        fh.write(json.dumps(record.to_json()) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# ----- backends -------------------------------------------------------------------------------------
def _run_local(todo, args, jobs: int, runner: Runner, on_done) -> None:
    if jobs <= 1:
        for point in todo:
            on_done(runner(*args(point)))
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(runner, *args(point)) for point in todo]
        for future in as_completed(futures):
            on_done(future.result())


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


def _run_ray(todo, scenario, source, digest, address: str, runner: Runner, on_done) -> None:
    ray = ray_init(address)
    remote = ray.remote(runner)
    scenario_ref = ray.put(scenario)
    pending = [remote.remote(scenario_ref, source, point, digest) for point in todo]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            on_done(ray.get(ref))


# ----- the sweep ------------------------------------------------------------------------------------
def run_sweep(scenario, source: str, points: list[SweepPoint], *, jobs: int = 1, out_dir: str | Path | None = None,
              ray_address: str | None = None, progress: bool = True, runner: Runner = run_point) -> list[SweepRecord]:
    """Run every configuration not already in OUT/sweep.jsonl -> records in `points` order."""
    digest = scenario_digest(scenario)
    log = Path(out_dir) / JSONL_NAME if out_dir is not None else None
    done: dict[str, SweepRecord] = {}
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        done, _ = read_records(log, digest)
    wanted = {p.key for p in points}
    done = {k: r for k, r in done.items() if k in wanted}
    todo = [p for p in points if p.key not in done]
    with _progress(progress) as bar:
        task = bar.add_task("sweep", total=len(points), completed=len(done))

        def on_done(record: SweepRecord) -> None:
            done[record.key] = record
            if log is not None:
                append_record(log, record)
            bar.update(task, advance=1, description=record.key, refresh=True)

        if ray_address:
            _run_ray(todo, scenario, source, digest, ray_address, runner, on_done)
        else:
            _run_local(todo, lambda p: (scenario, source, p, digest), jobs, runner, on_done)
    return [done[p.key] for p in points]


def _progress(enabled: bool) -> Progress:
    """A bar on stderr without a refresh thread (worker processes are forked while it is live)."""
    return Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), auto_refresh=False, disable=not enabled, transient=False)
