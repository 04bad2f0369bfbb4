"""Screening's shortcuts equal the long way: the memory memo (sim/search/memory_memo.py) gives every layout
memory_per_gpu's breakdown to the bit, over generated spaces whose memory classes hold several legal
layouts; ordering the pool's chunks by memory class screens every layout once."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.search.memory_memo import MemoryMemo, memory_key
from meshsim.sim.search.screen import Candidate, Variants, screen
from meshsim.sim.search.screen_pool import by_memory_class
from meshsim.sim.search.space import build_space, layouts, parse_assignment

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}

SPACES = st.fixed_dictionaries({
    "tp": st.sampled_from(["2", "2,4", "1,2,8"]),
    "pp": st.sampled_from(["1", "1,2", "2,4"]),
    "micro_batch": st.sampled_from(["1", "1,2"]),
    "recompute": st.sampled_from(["none", "selective,full"]),
    "cp": st.sampled_from(["1", "1,2"]),
    "fsdp": st.sampled_from(["off", "both"]),
    "fp8": st.sampled_from(["off", "off,tensorwise,delayed"]),
    "ep": st.sampled_from(["1,2", "2,4"]),
    "ep_overlap": st.sampled_from(["off", "both"]),
})


def _scenario(moe: bool):
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": 8, "parallel.global_batch": 16, "model.layers": 4, "model.seq_len": 256,
            **(MOE if moe else {})}
    return with_overrides(scenario, over, source), source


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(space=SPACES, moe=st.booleans())
def test_memory_memo_equals_memory_per_gpu(space, moe):
    scenario, source = _scenario(moe)
    opened = dict(parse_assignment("--space", f"{k}={v}", False) for k, v in space.items()
                  if moe or k not in ("ep", "ep_overlap"))
    opened["tp_comm_overlap"] = (False, True)
    fixed = {"dist_opt_instances": (1,), "loss_in_split": (False,), "embedding_in_split": (False,)}
    todo = layouts(scenario, build_space(scenario, fixed, opened))
    variants, memo = Variants(scenario, source), MemoryMemo()
    for i in by_memory_class(todo):
        outcome = screen(todo[i], variants, memo=memo)
        plain = screen(todo[i], variants)
        assert type(outcome) is type(plain)
        if isinstance(outcome, Candidate):
            assert outcome.memory == plain.memory == memory_per_gpu(outcome.rs)
        elif not hasattr(outcome, "rule"):  # out of memory: the breakdown that does not fit
            assert outcome == plain
    assert memo.hits > 0  # negative control: classes of several legal layouts were generated


def test_memory_classes_hold_layouts_that_differ_in_the_unread_axes_only():
    """The key drops tp_comm_overlap and the dispatcher (and its flex backend), and nothing else; the pool
    order is a permutation in which each class is contiguous."""
    scenario, source = _scenario(moe=True)
    opened = {"tp": (2,), "ep": (1, 2), "recompute": ("none", "full"), "tp_comm_overlap": (False, True)}
    todo = layouts(scenario, build_space(scenario, {"micro_batch": (1,), "pp": (1,), "cp": (1,)}, opened))
    order = by_memory_class(todo)
    assert sorted(order) == list(range(len(todo)))
    keys = [memory_key(todo[i]) for i in order]
    assert all(keys.index(k) == len(keys) - 1 - keys[::-1].index(k) - (keys.count(k) - 1) for k in set(keys))
    for a in todo:
        for b in todo:
            if memory_key(a) == memory_key(b):
                da, db = dict(a.variant), dict(b.variant)
                assert {k for k in da.keys() | db.keys() if da.get(k) != db.get(k)} <= {
                    "parallel.moe_dispatcher", "parallel.moe_flex_backend"}
                assert (a.point.tp, a.point.ep, a.point.recompute) == (b.point.tp, b.point.ep, b.point.recompute)
    assert len(set(keys)) < len(keys) and len({memory_key(x) for x in todo if x.point.ep == 2}) >= 2
