"""Screening's shortcuts equal the long way: the memory memo (sim/search/memory_memo.py) gives every layout
memory_per_gpu's breakdown to the bit, over generated spaces whose memory classes hold several legal
layouts; ordering the pool's chunks by memory class screens every layout once. And --budget bounds the
whole search, screening included, and the result states each claim on its own (branch.py step 4)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshsim.sim.search.branch as branch
import meshsim.sim.search.screen_pool as screen_pool
from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.search.branch import search
from meshsim.sim.search.memory_memo import MemoryMemo, memory_key
from meshsim.sim.search.report import verdict
from meshsim.sim.search.screen import Candidate, Variants, screen
from meshsim.sim.search.screen_pool import by_memory_class, shape_group, tasks
from meshsim.sim.search.space import build_space, layouts, parse_assignment
from meshsim.sim.sweep.record import run_point

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


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(space=SPACES, jobs=st.integers(2, 4), chunk=st.sampled_from([1, 4, 256]))
def test_pool_tasks_cover_every_layout_once_a_group_in_one_task_where_it_fits(space, jobs, chunk):
    """screen_pool.tasks: the memory-class order cut into tasks, in order, every layout once; a pipeline group
    (shape_group) is one task unless it is larger than the cap, then near-equal pieces of it; a memory class
    never spans two groups (so the memo still hits in one process)."""
    scenario, source = _scenario(moe=True)
    opened = dict(parse_assignment("--space", f"{k}={v}", False) for k, v in space.items())
    todo = layouts(scenario, build_space(scenario, {"dist_opt_instances": (1,)}, opened))
    order = by_memory_class(todo)
    old, screen_pool.CHUNK = screen_pool.CHUNK, chunk
    try:
        cut = tasks(order, todo, jobs)
        cap = max(chunk, -(-len(order) // (4 * jobs)))
    finally:
        screen_pool.CHUNK = old
    assert [i for task in cut for i in task] == order
    groups: dict[tuple, list[int]] = {}
    for i in order:
        groups.setdefault(shape_group(todo[i]), []).append(i)
    assert all(len({shape_group(todo[i]) for i in task}) == 1 for task in cut)
    for members in groups.values():
        pieces = [task for task in cut if shape_group(todo[task[0]]) == shape_group(todo[members[0]])]
        assert len(pieces) == -(-len(members) // cap)  # whole where it fits (negative control: chunk 1, jobs 4)
        assert max(map(len, pieces)) - min(map(len, pieces)) <= 1
    group_of_class: dict = {}
    for i in order:
        assert group_of_class.setdefault(memory_key(todo[i]), shape_group(todo[i])) == shape_group(todo[i])


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


class _Clock:
    """A monotonic clock the test moves: search's --budget is read off it (branch.py, screen_pool.py)."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _budget_case(moe: bool = False):
    scenario, source = _scenario(moe)
    fixed = {"fsdp": (False,), "cp": (1,), "embedding_in_split": (False,), "loss_in_split": (False,)}
    return scenario, source, fixed


def test_a_budget_spent_while_screening_names_a_layout_and_claims_nothing(monkeypatch):
    """--budget bounds the whole search: past it screening stops once a layout fits, that layout is
    simulated (the search always names one), and neither claim holds; the counts say what was left."""
    scenario, source, fixed = _budget_case()
    clock = _Clock()
    monkeypatch.setattr(branch, "time", clock)
    monkeypatch.setattr(screen_pool, "time", clock)
    full = search(scenario, source, fixed=fixed)
    clock.now = 0.0

    def late(*args, **kwargs):  # every simulation ends past the budget
        clock.now = 1e9
        return run_point(*args, **kwargs)

    calls = []

    def screening_clock() -> float:  # the budget runs out after the first few layouts are screened
        calls.append(1)
        return 0.0 if len(calls) < 4 else 1e9

    monkeypatch.setattr(clock, "monotonic", screening_clock)
    cut = search(scenario, source, fixed=fixed, budget_s=1.0, runner=late)
    assert cut.unscreened > 0 and cut.searched == full.searched
    assert cut.searched == cut.unscreened + cut.refused_total + cut.out_of_memory + len(cut.entries)
    assert cut.winner is not None and len(cut.simulated) == 1
    assert not cut.proven and not cut.band_complete
    assert "not screened" in verdict(cut) and "not proven optimal" in verdict(cut)
    assert full.proven and full.unscreened == 0 and full.band_complete


def test_a_budget_spent_on_the_error_band_keeps_the_proof(monkeypatch):
    """The budget runs out right after the simulations the proof needs (they come first: ascending bound):
    the winner is still proven optimal, and the output says the error band's list is incomplete."""
    scenario, source, fixed = _budget_case(moe=True)
    # one micro-batch size, TP overlap off: 5,040 layouts (not 30,240), 12 simulations prove the winner and
    # its error band takes 29 more (all open: 59 and 4), a fifth of the search's cost
    fixed |= {"micro_batch": (1,), "tp_comm_overlap": (False,)}
    full = search(scenario, source, fixed=fixed)
    for_proof = full.needed_for_proof
    assert len(full.simulated) > for_proof  # the band took simulations (else this test checks nothing)
    clock = _Clock()
    monkeypatch.setattr(branch, "time", clock)
    monkeypatch.setattr(screen_pool, "time", clock)
    done = []

    def counting(*args, **kwargs):
        done.append(1)
        if len(done) >= for_proof:
            clock.now = 1e9
        return run_point(*args, **kwargs)

    cut = search(scenario, source, fixed=fixed, budget_s=1.0, runner=counting)
    assert cut.proven and cut.winner.key == full.winner.key and cut.winner.step_s == full.winner.step_s
    assert len(cut.simulated) == for_proof < len(full.simulated)
    assert not cut.band_complete and cut.band_missing > 0 and cut.unproven == 0
    assert "fastest layout of the space" in verdict(cut) and "incomplete" in verdict(cut)
