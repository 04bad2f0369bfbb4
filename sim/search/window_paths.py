"""Combined-1F1B windows computed once (sim/search/overlap_windows.py step 6): a window's longest paths
walked without prices (`window_paths`), their lengths from the durations (`path_lengths`), and what a
window is made of (`window_key`: delay_wgrad and the templates chunk_step stamps, by value).

window_paths(ops) records what overlap_windows.longest_paths reaches from a window stream's first op and
through which predecessors: an op is reached iff one of its predecessors (its deps, and the previous op
of its FIFO stream) is, which reads the deps and streams only, as durations are >= 0. path_lengths then
takes the same maxima and sums of the same durations in the same order as longest_paths: equal to the
bit (tests/test_search_windows.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshsim.sim.schedule.ops import FIFO_STREAMS, Op
from meshsim.sim.schedule.pipeline_layout import ChunkLayout
from meshsim.sim.schedule.template import Template

WINDOW_STREAMS = ("compute", "ep_comm")  # overlap_windows.py step 1
WindowKey = tuple[int | None, int | None]  # (forward chunk, backward chunk)


@dataclass(frozen=True)
class WindowPaths:
    """A window's longest paths (overlap_windows.py step 3) with the prices left out: `priced` the ops whose
    durations the paths read ((position, op), FIFO ops only: the others last 0); per window stream x with
    ops, (x, its x-ops, the first x-op, the ops the path reaches after it in list order, each with its
    reached predecessors)."""

    size: int  # the window's op count
    priced: tuple[tuple[int, Op], ...]
    streams: tuple[tuple[str, tuple[int, ...], int, tuple[tuple[int, tuple[int, ...]], ...]], ...]


def window_paths(ops: list[Op]) -> WindowPaths:
    """overlap_windows.longest_paths' walk without durations: which ops it reaches and through which
    predecessors (module docstring)."""
    streams, needed = [], set()
    for x in WINDOW_STREAMS:
        mine = tuple(op.id for op in ops if op.stream == x)
        if not mine:
            continue
        first, last = mine[0], mine[-1]
        reached, order = {first}, []
        prev: dict[str, int] = {x: first}
        for op in ops[first + 1: last + 1]:
            preds = list(op.deps)
            if op.stream in FIFO_STREAMS and prev.get(op.stream) is not None:
                preds.append(prev[op.stream])
            mine_preds = tuple(q for q in preds if q in reached)
            if mine_preds:
                reached.add(op.id)
                order.append((op.id, mine_preds))
                needed.update(mine_preds)
                if op.stream in FIFO_STREAMS:
                    prev[op.stream] = op.id
        needed.update(mine)
        streams.append((x, mine, first, tuple(order)))
    priced = tuple((i, ops[i]) for i in sorted(needed) if ops[i].stream in FIFO_STREAMS)
    return WindowPaths(len(ops), priced, tuple(streams))


def path_lengths(paths: WindowPaths, price: Callable[[Op], float]) -> dict[str, tuple[float, float]]:
    """overlap_windows.longest_paths(ops, dur) from the window's WindowPaths (module docstring): the same
    maxima and sums of the same durations, in the same order."""
    dur = [0.0] * paths.size
    for i, op in paths.priced:
        dur[i] = price(op)
    out = {}
    for x, mine, first, order in paths.streams:
        reach = {first: 0.0}
        for j, preds in order:
            reach[j] = max([reach[q] + dur[q] for q in preds])
        last = mine[-1]
        out[x] = (reach[last] + dur[last], sum(dur[i] for i in mine))
    return out


class Canonical:
    """A template's value as a small int: equal templates (ops, marks, gradient lists), equal ints. `values`
    (a PriceCache's) is shared by a search; the identities are this call's (its templates stay alive)."""

    def __init__(self, values: dict):
        self.values, self.ids = values, {}

    def __call__(self, tpl: Template) -> int:
        hit = self.ids.get(id(tpl))
        if hit is None:
            value = (tuple(tpl.ops), tuple(sorted(tpl.marks.items())), tuple(tpl.grads), tuple(tpl.expert_grads))
            hit = self.ids[id(tpl)] = self.values.setdefault(value, len(self.values))
        return hit


def window_key(t, chunks: list[ChunkLayout], key: WindowKey, delay_wgrad: bool, canon: Canonical) -> tuple:
    """What the scratch window of kind `key` is made of (overlap_windows.py step 6): delay_wgrad, and per side
    the templates chunk_step stamps, by value, in its order."""
    f = b = None
    if key[0] is not None:
        ch = chunks[key[0]]
        f = (canon(t.embed_fwd) if ch.embedding else None, tuple(canon(t.layer_fwd(n)) for n in ch.layers),
             canon(t.head_fwd) if ch.head else None)
    if key[1] is not None:
        ch = chunks[key[1]]
        b = (canon(t.head_bwd) if ch.head else None, tuple(canon(t.layer_bwd(n)) for n in reversed(ch.layers)),
             canon(t.embed_bwd) if ch.embedding else None)
    return delay_wgrad, f, b
