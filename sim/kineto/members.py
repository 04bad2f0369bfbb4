"""A Kineto trace's top-level members, read and checked: distributedInfo (rank, world size, backend, process
groups) and deviceProperties (device name, SM count).

A wrong type in a field the reader uses is one UserError naming the field (exit 2); a missing member is read
as absent. A trace without a rank in distributedInfo takes it from its file name (`rank3`, `rank_3`), else 0.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from meshsim.sim.core.errors import FilePath, UserError
from meshsim.sim.kineto.jsonstream import FIX, iter_trace

RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)
MAX_COUNT = 1 << 53  # an NCCL element / byte count or group size


def distributed_info(info: object, path: Path) -> dict:
    """distributedInfo with its fields checked: rank and world_size integers, pg_config a list of dicts
    with integer pg_size; a wrong type is one UserError naming the field."""
    if not isinstance(info, dict):
        return {}
    for key, low in (("rank", 0), ("world_size", 1)):
        v = info.get(key)
        if v is not None and (type(v) is not int or not low <= v <= MAX_COUNT):
            raise UserError("trace", FilePath(path), FIX, problem=f"distributedInfo.{key} is {str(v)[:60]!r}; "
                            f"PyTorch records an integer >= {low}")
    pgs = info.get("pg_config")
    rows = [p for p in pgs if isinstance(p, dict)] if isinstance(pgs, list) else []
    for p in rows:
        size = p.get("pg_size", 0)
        if type(size) is not int or not 0 <= size <= MAX_COUNT:
            raise UserError("trace", FilePath(path), FIX, problem=f"distributedInfo.pg_config pg_size is "
                            f"{str(size)[:60]!r}; PyTorch records an integer")
    backend = info.get("backend")
    return {"rank": info.get("rank"), "world_size": info.get("world_size"), "pg_config": tuple(rows),
            "backend": str(backend)[:64] if backend is not None else None}


def rank_of(info: dict, path: Path) -> int:
    rank = info.get("rank")
    if type(rank) is int and rank >= 0:
        return rank
    m = RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else 0


def device_figures(props: object, device: int) -> tuple[str, int | None]:
    rows = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    row = next((p for p in rows if p.get("id") == device), rows[0] if rows else {})
    sms = row.get("numSms")
    return str(row.get("name", ""))[:200], sms if type(sms) is int and 0 < sms <= MAX_COUNT else None


def leading_members(path: Path) -> list[tuple[str, Any]]:
    """The top-level members before traceEvents, from the reference parser (it stops at the first event)."""
    out = []
    for kind, item in iter_trace(path):
        if kind == "event":
            break
        out.append(item)
    return out
