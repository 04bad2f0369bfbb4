"""A template compiled for stamping: everything about its ops that does not depend on where it is stamped.

Stamping template T at base b (its first op's id) with external inputs x (a value per name in `ext_keys`)
gives op i the id b + i, the name prefix + suffix_i and the deps (b + l for l in local_deps_i) followed by
(x[e] for e in ext_deps_i): every dep is b + rel_j over the template's flattened dep list, except the
ext slots, which take x. `Stencil` holds that flat list (`flat_rel`, ext slots as 0), the slice of it each op
owns, and the per-op columns (streams, works, ...), as Python tuples for stamping Op records and as numpy
arrays for tiling the schedule's arrays (sim/schedule/arrays.py).

A Template is mutable while it is built (moe_sync, mtp_ops rewrite ops in place), so `stencil_of` keeps
the template's op list it compiled and recompiles when the list differs (a C-level comparison by identity).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshsim.sim.schedule.ops import STREAMS, kind_of
from meshsim.sim.schedule.template import Template, TemplateOp

STREAM_INDEX = {s: i for i, s in enumerate(STREAMS)}  # ScheduleArrays.stream: the index in STREAMS


@dataclass(frozen=True, eq=False)
class Stencil:
    ops: list[TemplateOp]  # the template's op list compiled (a copy)
    n: int
    suffixes: tuple[str, ...]
    streams: tuple[str, ...]
    categories: tuple[str, ...]
    phases: tuple[str, ...]
    works: tuple
    host_calls: tuple[int, ...]
    flat_rel: tuple[int, ...]  # every op's deps relative to the base, ext slots 0
    slices: tuple[slice, ...]  # op i's deps: flat[slices[i]]
    ext_keys: tuple[str, ...]  # the external inputs' names, in first-use order
    ext_slots: tuple[tuple[int, int], ...]  # (flat position, index in ext_keys)
    waits: tuple[tuple[int, int], ...]  # (op, local op its host waits for)
    entries: tuple[int, ...]  # ops with no dep inside the template (a gate's followers)
    # numpy columns for tiling (sim/schedule/arrays.py)
    kind: np.ndarray
    stream_idx: np.ndarray
    calls_arr: np.ndarray
    wait_arr: np.ndarray  # local index, -1: none
    counts: np.ndarray  # deps per op
    rel_arr: np.ndarray  # flat_rel
    owner: np.ndarray  # flat position -> its op
    within: np.ndarray  # flat position -> its place in the op's deps
    ext_pos: np.ndarray  # ext_slots' flat positions
    ext_idx: np.ndarray  # and their ext_keys indices


def compile_template(tpl: Template) -> Stencil:
    ops = list(tpl.ops)
    flat: list[int] = []
    slices, ext_keys, ext_slots, owner, within = [], [], [], [], []
    for i, t in enumerate(ops):
        start = len(flat)
        flat += t.local_deps
        for e in t.ext_deps:
            if e not in ext_keys:
                ext_keys.append(e)
            ext_slots.append((len(flat), ext_keys.index(e)))
            flat.append(0)
        slices.append(slice(start, len(flat)))
        owner += [i] * (len(flat) - start)
        within += range(len(flat) - start)
    waits = tuple((i, t.host_wait) for i, t in enumerate(ops) if t.host_wait is not None)
    wait_arr = np.full(len(ops), -1, dtype=np.intc)
    for i, w in waits:
        wait_arr[i] = w
    intp = np.intc
    return Stencil(
        ops, len(ops), tuple(t.suffix for t in ops), tuple(t.stream for t in ops), tuple(t.category for t in ops),
        tuple(t.phase for t in ops), tuple(t.work for t in ops), tuple(t.host_calls for t in ops), tuple(flat),
        tuple(slices), tuple(ext_keys), tuple(ext_slots), waits, tuple(i for i, t in enumerate(ops) if not t.local_deps),
        np.array([kind_of(t.work) for t in ops], dtype=np.int8),
        np.array([STREAM_INDEX[t.stream] for t in ops], dtype=np.int8),
        np.array([t.host_calls for t in ops], dtype=np.int32), wait_arr,
        np.array([s.stop - s.start for s in slices], dtype=intp), np.array(flat, dtype=intp),
        np.array(owner, dtype=intp), np.array(within, dtype=intp),
        np.array([p for p, _ in ext_slots], dtype=intp), np.array([k for _, k in ext_slots], dtype=intp))


def stencil_of(tpl: Template) -> Stencil:
    """`tpl` compiled, reusing the last compilation (kept on the template) while its op list is unchanged."""
    s = tpl.stencil
    if s is None or s.ops != tpl.ops:
        s = tpl.stencil = compile_template(tpl)
    return s
