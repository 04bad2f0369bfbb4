"""Differential test of the combined-1F1B windows computed once (sim/search/overlap_windows.py step 6):
window_excess, with one PriceCache shared by every generated layout (window paths kept by the templates'
value, lengths by (Pricer.key, rank, window)), equals window_excess_long_way (a scratch window and its
longest paths per window and stage, a fresh Pricer) to the bit. The edge: layouts that share a mesh and
templates but not template objects (rebuilt per layout), stages whose windows hold equal templates at
different ranks, dense layers first, the pipeline split, deferred weight gradients on and off; and a
negative control that the memo was used."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule.ops import FIFO_STREAMS
from meshsim.sim.search.bound_types import PriceCache, Pricer
from meshsim.sim.search.overlap_windows import (
    _scratch,
    _stage_layout,
    bound_templates,
    longest_paths,
    window_counts,
    window_excess,
    window_excess_long_way,
)
from meshsim.sim.search.window_paths import path_lengths, window_paths

SHARED = PriceCache()  # one cache for every example: later layouts meet earlier layouts' windows
hits: list[int] = []

layouts = st.fixed_dictionaries({
    "pp": st.sampled_from([1, 2, 4]),
    "vp": st.sampled_from([1, 2]),
    "layers_per_chunk": st.sampled_from([1, 2]),
    "dense_layers": st.sampled_from([0, 1]),
    "tp": st.sampled_from([1, 2]),
    "ep": st.sampled_from([2, 4]),
    "dispatcher": st.sampled_from(["alltoall", "flex"]),
    "delay_wgrad": st.booleans(),
    "micro_batches": st.integers(1, 8),
    "recompute": st.sampled_from(["none", "selective"]),
    "hidden": st.sampled_from([256, 512]),
    "split": st.booleans(),
    "distributed_optimizer": st.booleans(),
})


def resolved(p: dict):
    pp, tp, ep = p["pp"], p["tp"], p["ep"]
    vp = p["vp"] if pp > 1 else 1
    split = p["split"] and pp > 1
    layers = pp * vp * p["layers_per_chunk"] - (2 if split else 0)
    gpus = tp * pp * max(1, ep // tp)
    o = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512, "dense_layers": p["dense_layers"]},
         "model.bias": False, "model.mlp": "swiglu", "model.layers": layers, "model.hidden": p["hidden"],
         "model.seq_len": 256, "parallel.pp": pp, "parallel.vp": vp, "parallel.tp": tp, "parallel.sp": tp > 1,
         "parallel.ep": ep, "parallel.gpus": gpus, "topology.nodes": max(1, gpus // 8), "parallel.dp": "auto",
         "parallel.micro_batch": 1, "parallel.moe_dispatcher": p["dispatcher"], "parallel.moe_ep_overlap": True,
         "parallel.delay_wgrad_compute": p["delay_wgrad"], "parallel.recompute": p["recompute"],
         "parallel.distributed_optimizer": p["distributed_optimizer"], "parallel.p2p_overlap": vp == 1 or pp > 2,
         "parallel.account_for_embedding_in_split": split, "parallel.account_for_loss_in_split": split,
         "parallel.global_batch": gpus // (tp * pp) * p["micro_batches"], "run.cuda_graphs": True}
    if layers <= p["dense_layers"]:
        return None
    scenario, source = load_scenario("tiny-2gpu")
    try:
        return resolve(with_overrides(scenario, o, source), source)
    except UserError:
        return None


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(p=layouts)
def test_windows_computed_once_equal_the_long_way(p):
    rs = resolved(p)
    assume(rs is not None)
    before = len(SHARED.window_lengths)
    fast = window_excess(rs, SHARED.pricer(rs), SHARED)
    assert fast == window_excess_long_way(rs, Pricer(rs))
    assert window_excess(rs, Pricer(rs)) == fast  # a Pricer of its own: paths walked afresh, nothing kept
    hits.append(len(SHARED.window_lengths) == before)


def test_the_shared_windows_were_used():
    """Negative control (after the test above): some layouts found every window priced already."""
    assert len(hits) >= 20 and any(hits), hits


def test_path_lengths_equal_longest_paths_window_by_window():
    """Step 6 on single windows of a pipelined layout with dense layers first and deferred weight gradients:
    each window kind's lengths from its WindowPaths equal longest_paths on its scratch ops, at every stage's
    rank, and the compute stream's path is longer than its busy time somewhere (the windows bite)."""
    rs = resolved({"pp": 2, "vp": 2, "layers_per_chunk": 2, "dense_layers": 1, "tp": 1, "ep": 4,
                   "dispatcher": "alltoall", "delay_wgrad": True, "micro_batches": 6, "recompute": "none",
                   "hidden": 512, "split": False, "distributed_optimizer": True})
    assert rs is not None
    t, price, longer = bound_templates(rs), Pricer(rs), 0
    for stage, chunks in enumerate(_stage_layout(rs)):
        rank = stage * rs.stage_size
        for key in window_counts(rs, stage)[0]:
            ops = _scratch(t, chunks, key, True)
            long_way = longest_paths(ops, lambda op, r=rank: price(op, r) if op.stream in FIFO_STREAMS else 0.0)
            once = path_lengths(window_paths(ops), lambda op, r=rank: price(op, r))
            assert once == long_way
            longer += once["compute"][0] > once["compute"][1]
    assert longer > 0
