"""Stamping block templates into a rank's op list, and the order of one micro-batch's blocks.

`stamp` appends a template's ops with ids = list positions (every dep points to an earlier op), names
prefixed "L{layer}.mb{mb}." / "embed.mb{mb}." / "head.mb{mb}."; `micro_batch_blocks` lists one micro-batch's
blocks in the order a rank runs them without pipelining: embedding -> layers 0..L-1 forward -> (delayed FP8
scaling's amax block) -> head forward -> head backward -> layers L-1..0 backward -> (amax) -> embedding
backward. Each block's `ext` input is the output of the block before it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.ops import Op, new_op
from meshsim.sim.schedule.stencil import Stencil, stencil_of
from meshsim.sim.schedule.template import Template


def stamp(tpl: Template, ops: list[Op], prefix: str, ext: dict[str, int], layer: int | None,
          mb: int, gate: tuple[int, ...] = ()) -> int:
    """Append `tpl`'s ops to `ops` (ids from len(ops)); returns the base id. `gate`: ops every entry op (one
    with no dep inside the template) also waits for, e.g. the all-gather of the block's weights under FSDP.

    Per op: id base + i, name prefix + suffix, deps (base + local..., ext[e]..., gate... on entry ops); built
    from the template's Stencil by C-level passes (stamp_records), no Python code per op. An OpList `ops`
    also records the stamp (sim/schedule/tiling.py); a StageOps `ops` records only the stamp, no record
    (sim/schedule/stage_ops.py)."""
    s = stencil_of(tpl)
    add_stamp = getattr(ops, "add_stamp", None)
    if add_stamp is not None:
        return add_stamp(s, prefix, tuple(ext[e] for e in s.ext_keys), layer, mb, gate)
    base = len(ops)
    record = getattr(ops, "tiling", None)
    ext_vals = tuple(ext[e] for e in s.ext_keys)
    ops.extend(stamp_records(s, base, prefix, ext_vals, layer, mb, gate,
                             ops.ints(base + s.n) if record is not None else None))
    if record is not None:
        record.add(s, base, ext_vals, gate, layer, mb, prefix)
    return base


Link = tuple  # (template, block name, layer, ext key or None): one block of a chain (stamp_chain)


def stamp_chain(ops: list[Op], links: Sequence[Link], mb: int, x: int | None) -> list[int]:
    """Stamp `links` in turn for micro-batch `mb`, each block named "{block}.mb{mb}." and fed (under its ext
    key; none: no input) by the output mark of the block before it, the first by `x`: the bases. The same
    as stamp(tpl, ops, f"{block}.mb{mb}.", {key: x} if key else {}, layer, mb) per link, x = base +
    tpl.marks["out"] after each, which it is for any list but a StageOps (StageOps.add_chain: one call per
    chain, not per block; tests/test_build_chain.py compares the two)."""
    add_chain = getattr(ops, "add_chain", None)
    if add_chain is not None:
        return add_chain(links, mb, x)
    bases = []
    for tpl, block, layer, key in links:
        base = stamp(tpl, ops, f"{block}.mb{mb}.", {key: x} if key else {}, layer, mb)
        bases.append(base)
        x = base + tpl.marks["out"]
    return bases


def stamp_records(s: Stencil, base: int, prefix: str, ext_vals: tuple, layer: int | None, mb: int | None,
                  gate: tuple[int, ...] = (), ints: list[int] | None = None) -> map:
    """The Op records of stencil `s` stamped at `base` (stamp's module docstring), as an iterator built by
    C-level passes; `ints`: 0..base + n - 1 as shared int objects (OpList.ints), else fresh ints. What stamp
    appends, and what a schedule's StampedOps builds again on demand (sim/schedule/stamped_ops.py)."""
    n = s.n
    if ints is not None:  # one int object per position, shared by ids, deps and host waits
        ids, flat = ints[base:base + n], list(map(ints.__getitem__, map(base.__add__, s.flat_rel)))
    else:
        ids, flat = range(base, base + n), list(map(base.__add__, s.flat_rel))
    for pos, k in s.ext_slots:
        flat[pos] = ext_vals[k]
    deps = list(map(tuple(flat).__getitem__, s.slices))
    if gate:
        for i in s.entries:
            deps[i] += gate
    if s.waits:
        waits = [None] * n
        for i, w in s.waits:
            waits[i] = base + w if ints is None else ints[base + w]
    else:
        waits = repeat(None, n)
    return map(new_op, zip(ids, map(prefix.__add__, s.suffixes), s.streams, s.categories, s.phases, s.works, deps,
                           repeat(layer, n), repeat(mb, n), s.host_calls, waits, strict=True))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Build with the cyclic garbage collector paused: stamping allocates two tuples per op and no cyclic
    garbage, yet each collection they trigger rescans the young objects and now and then every object alive
    (on the 405B library run's 856k ops that was 60% of the build). Pausing it changes no value."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class Block:
    """One template stamped for one micro-batch: its name prefix, layer, the name of its external input (None
    for the embedding's forward), and whether it is a backward block (it produces gradients)."""

    tpl: Template
    prefix: str
    layer: int | None
    ext_key: str | None
    backward: bool


def micro_batch_blocks(t: Any, layers: int, mb: int) -> list[Block]:
    """The blocks of micro-batch `mb` in run order, from the step's templates `t` (builder.Templates)."""
    return [Block(tpl, f"{block}.mb{mb}.", layer, key, backward)
            for (tpl, block, layer, key), backward in zip(*micro_batch_links(t, layers), strict=True)]


def micro_batch_links(t: Any, layers: int) -> tuple[tuple[Link, ...], tuple[bool, ...]]:
    """One micro-batch's blocks in run order as stamp_chain's links (block name, no micro-batch), and which
    of them are backward blocks: micro_batch_blocks' order, for any micro-batch."""
    fwd = [(t.embed_fwd, K.EMBED_BLOCK, None, None)]
    fwd += [(t.layer_fwd(layer), K.layer_block(layer), layer, "in") for layer in range(layers)]
    if t.amax is not None:
        fwd.append((t.amax[0], K.FP8_BLOCK, None, "in"))
    fwd.append((t.head_fwd, K.HEAD_BLOCK, None, "in"))
    bwd = [(t.head_bwd, K.HEAD_BLOCK, None, "loss")]
    bwd += [(t.layer_bwd(layer), K.layer_block(layer), layer, "gin") for layer in reversed(range(layers))]
    if t.amax is not None:
        bwd.append((t.amax[1], K.FP8_BLOCK, None, "gin"))
    bwd.append((t.embed_bwd, K.EMBED_BLOCK, None, "gin"))
    return tuple(fwd + bwd), (False,) * len(fwd) + (True,) * len(bwd)
