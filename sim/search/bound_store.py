"""The search's bound store, OUT/bounds.jsonl, beside the sweep's OUT/sweep.jsonl: a rerun does not re-bound.

One JSON line per computed bound (either level, sim/search/bound_types.LEVELS): the layout's key, the
level, the bound with its per-stage terms, the scenario digest (sim/sweep/axes.py scenario_digest of the
searched scenario: its layout axes aside, plus the bytes of every file it references; the layout key
carries the rest) and BOUND_VERSION (raised whenever a bound's definition changes, so a bound another
definition computed is never reused). Appends and reads hold the sweep store's lock (OUT/sweep.lock), and
the file is opened without following links (sim/sweep/store.py: the same rules). A line that is not a valid
bound of this digest and version is skipped (a killed run's truncated line is reported by count); the
last line of a (layout, level) wins. A stored bound is reused as computed: it is the same function of the
same inputs, so every proof about it holds unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from meshsim.sim.core.outfiles import open_own_file
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.search.bound_types import LEVELS, Bound, StageBound
from meshsim.sim.sweep.store import OUT_FLAG, append_lines, locked

BOUNDS_NAME = "bounds.jsonl"
BOUND_VERSION = 2  # 1: the single bound; 2: cheap (block templates and forced gaps) and refined levels


def _to_json(digest: str, key: str, bound: Bound) -> dict:
    stages = [[sb.stage, [[x, s] for x, s in sb.busy_s], sb.host_s] for sb in bound.stages]
    return {"version": BOUND_VERSION, "digest": digest, "layout": key, "level": bound.level, "step_s": bound.step_s,
            "short_micro_batches": bound.short_micro_batches, "micro_batches": bound.micro_batches, "stages": stages}


def _from_json(data: dict) -> Bound:
    stages = tuple(StageBound(int(st), tuple((str(x), float(s)) for x, s in busy), float(host))
                   for st, busy, host in data["stages"])
    level = data["level"]
    if level not in LEVELS:
        raise ValueError(level)
    return Bound(float(data["step_s"]), stages, int(data["short_micro_batches"]), int(data["micro_batches"]), level)


class BoundStore:
    """(layout key, level) -> Bound, read once from OUT/bounds.jsonl; `put` appends. No OUT: memory only."""

    def __init__(self, out_dir: str | Path | None, digest: str):
        self.out_dir, self.digest = out_dir, digest
        self.bounds: dict[tuple[str, str], Bound] = {}
        self.bad_lines = 0
        if out_dir is not None:
            self._read(Path(out_dir) / BOUNDS_NAME)

    def _read(self, path: Path) -> None:
        with locked(self.out_dir):
            if not (path.exists() or path.is_symlink()):
                return
            with os.fdopen(open_own_file(OUT_FLAG, path, os.O_RDONLY), "rb") as fh:
                text = fh.read().decode("utf-8", errors="replace")
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if data.get("version") != BOUND_VERSION or data.get("digest") != self.digest:
                    continue
                self.bounds[(str(data["layout"]), data["level"])] = _from_json(data)
            except (ValueError, KeyError, TypeError, AttributeError):
                self.bad_lines += 1

    def get(self, key: str, level: str) -> Bound | None:
        return self.bounds.get((key, level))

    def put(self, items: list[tuple[str, Bound]]) -> None:
        """Keep (layout key, bound) pairs, and append them to OUT/bounds.jsonl in one write."""
        for key, bound in items:
            self.bounds[(key, bound.level)] = bound
        if self.out_dir is not None and items:
            self.append(items)

    def append(self, items: list[tuple[str, Bound]]) -> None:
        """Append one line per bound (sim/sweep/store.py append_lines: under the lock, a killed writer's
        unterminated line ended first; not fsynced: a lost bound is recomputed)."""
        text = "".join(dumps_finite(_to_json(self.digest, k, b)) + "\n" for k, b in items)
        append_lines(self.out_dir, BOUNDS_NAME, text, durable=False)
