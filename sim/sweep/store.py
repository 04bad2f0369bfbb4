"""The sweep's record store, OUT/sweep.jsonl: append-only, locked, never loses a record.

- One JSON line per finished configuration, tagged with its scenario digest (sim/sweep/axes.py scenario_digest: the
  scenario without its swept fields, plus the content of every file it references). Records are never
  rewritten or deleted: sweeping another scenario (or an edited one) into the same OUT appends beside
  the earlier records, and a resume reads only the records of its own digest (the last one per key wins).
- Every read and append holds an exclusive lock on OUT/sweep.lock (fcntl.flock, released by the kernel
  if the process dies), so concurrent sweeps on one OUT interleave whole lines and never corrupt them.
- sweep.jsonl and sweep.lock are opened without following links: a symlink (even a dangling one) or a
  directory in their place is refused with one line, so nothing is ever written outside OUT.
- A line that is not a valid record (a truncated write of a killed run, a hand edit, another schema) is
  reported and skipped, never fatal; an append after a truncated line first ends that line.
"""

from __future__ import annotations

import fcntl  # POSIX advisory locks; meshsim targets Linux and macOS
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from meshsim.sim.core.errors import UserError
from meshsim.sim.core.outfiles import open_own_file
from meshsim.sim.core.userio import dumps_finite, parse_json
from meshsim.sim.results.result_ranges import result_problem
from meshsim.sim.sweep.record import SweepRecord

JSONL_NAME = "sweep.jsonl"
LOCK_NAME = "sweep.lock"
OUT_FLAG = "--out"  # what a refused store file is attributed to


class StoredRecord(BaseModel):
    """The schema a line of sweep.jsonl must satisfy to be reused (extra keys are kept, not checked)."""

    model_config = ConfigDict(extra="allow")

    key: str
    config: dict
    scenario_digest: str
    status: Literal["ok", "skipped"]
    result: dict | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> StoredRecord:
        if self.status == "skipped":
            if not isinstance(self.reason, str):
                raise ValueError("a skipped record needs its reason")
            return self
        if not isinstance(self.result, dict):
            raise ValueError("an ok record needs its result")
        problem = result_problem(self.result)  # every number within its range (sim/results/result_ranges.py)
        if problem:
            raise ValueError(f"result: {problem}")
        return self


@dataclass
class StoreRead:
    """Records of one digest by key, and one line per skipped bad line ('line 7: ...')."""

    records: dict[str, SweepRecord] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    other_digests: int = 0  # valid records of other scenarios, kept in the file


@contextmanager
def locked(out_dir: str | Path) -> Iterator[None]:
    """Hold OUT/sweep.lock exclusively for the duration of the block (a symlinked or non-regular lock file
    is refused, never followed: outfiles.open_own_file)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fd = open_own_file(OUT_FLAG, Path(out_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _record(number: int, line: str) -> tuple[SweepRecord | None, str | None]:
    """(the record on line `number`, None), or (None, why it is not a valid record)."""
    try:
        data = parse_json(line, f"line {number}")
        StoredRecord.model_validate(data)
        return SweepRecord.from_json(data), None
    except UserError as exc:
        problem = exc.problem[:1].lower() + exc.problem[1:]
        cause = " (a run killed mid-write leaves such a line)" if problem.startswith("not JSON") else ""
        return None, f"line {number}: {problem}{cause}"
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        return None, f"line {number}: not a sweep record ({where}: {first['msg']})"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"line {number}: not a sweep record ({type(exc).__name__}: {exc})"[:200]


def parse_records(text: str, digest: str | None = None) -> StoreRead:
    """Valid records (of `digest`, when given) by key; the last record of a key wins."""
    read = StoreRead()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        record, problem = _record(number, line)
        if record is None:
            read.problems.append(problem)
        elif digest is not None and record.scenario_digest != digest:
            read.other_digests += 1
        else:
            read.records[record.key] = record
    return read


def read_store(out_dir: str | Path, digest: str | None = None) -> StoreRead:
    """Read OUT/sweep.jsonl under the lock (a missing file is an empty store)."""
    path = Path(out_dir) / JSONL_NAME
    with locked(out_dir):
        if path.exists() or path.is_symlink():
            with os.fdopen(open_own_file(OUT_FLAG, path, os.O_RDONLY), "rb") as fh:
                text = fh.read().decode("utf-8", errors="replace")
        else:
            text = ""
    return parse_records(text, digest)


def read_records(path: str | Path, digest: str | None = None) -> tuple[dict[str, SweepRecord], list[str]]:
    """Records by key from a sweep.jsonl path -> (records, problems); the file is never modified."""
    read = read_store(Path(path).parent, digest)
    return read.records, read.problems


def append_lines(out_dir: str | Path, name: str, text: str, *, durable: bool) -> None:
    """Append `text` (whole lines) to OUT/name under the folder's lock. A previous line left unterminated
    (a killed writer) is ended first, so it stays one bad line. durable: fsync before returning."""
    path = Path(out_dir) / name
    with locked(out_dir), os.fdopen(open_own_file(OUT_FLAG, path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "ab+") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                text = "\n" + text
        fh.write(text.encode())
        fh.flush()
        if durable:
            os.fsync(fh.fileno())


def append_record(out_dir: str | Path, record: SweepRecord) -> None:
    """Append one record as one line (append_lines), durable before the next configuration finishes."""
    append_lines(out_dir, JSONL_NAME, dumps_finite(record.to_json()) + "\n", durable=True)
