"""mesh.stage_groups (a stage's distinct groups of an expert, "stage" or context-parallel kind by arithmetic on
the mesh) against the long way it replaces in ResolvedScenario.all_groups: every rank of the stage's group,
duplicates dropped, in first-met order. Generated meshes cover several stages (base > 0), etp > 1 and ep > 1
blocks, cp with an all-to-all level that divides it and one that does not, and stages that are not whole
expert blocks (where stage_groups declines and the long way runs)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_scenario, resolve
from meshsim.sim.core.mesh import CP_KINDS, EXPERT_KINDS, mesh_group, stage_groups

KINDS = (*EXPERT_KINDS, *CP_KINDS, "stage")


def long_way(kind, stage, tp, dp, cp, a2a, ep, etp, pp):
    size = tp * dp * cp
    base = stage * size
    return tuple(dict.fromkeys(mesh_group(kind, base + r, tp, dp, pp=pp, ep=ep, etp=etp, cp=cp, cp_a2a=a2a)
                               for r in range(size)))


meshes = st.tuples(st.sampled_from(KINDS), st.integers(1, 4), st.integers(1, 6), st.integers(1, 4),
                   st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))


@settings(max_examples=400, deadline=None)
@given(meshes)
def test_stage_groups_equal_the_long_way(case):
    kind, tp, dp, cp, a2a, ep, etp, pp = case
    size = tp * dp * cp
    for stage in range(pp):
        fast = stage_groups(kind, stage * size, size, tp, cp, a2a, ep, etp)
        whole = size % (etp * ep) == 0 if kind in EXPERT_KINDS else cp % a2a == 0 if kind in CP_KINDS else True
        assert (fast is not None) == whole  # declines exactly where the blocks are not whole
        if fast is not None:
            assert fast == long_way(kind, stage, tp, dp, cp, a2a, ep, etp, pp)


def test_declines_other_kinds_and_partial_blocks():
    """Negative controls: kinds it does not cover, and a stage of 6 ranks over expert blocks of 4."""
    assert stage_groups("tp", 0, 8, 2, 1, 1, 1, 1) is None
    assert stage_groups("dp_in", 0, 8, 2, 1, 1, 1, 1) is None
    assert stage_groups("ep", 0, 6, 2, 1, 1, 4, 1) is None
    assert stage_groups("ep", 8, 8, 2, 1, 1, 4, 1) == ((8, 9, 10, 11), (12, 13, 14, 15))


@pytest.mark.parametrize("name", ["deepseek-v3-h100-ep64", "llama3-8b-128k-h100-cp4", "qwen3-30b-a3b-h100-ep16",
                                  "llama31-405b-h100-tp8-pp8-cp2"])
def test_all_groups_of_library_scenarios_equal_the_long_way(name):
    rs = resolve(*load_scenario(name))
    for kind in KINDS:
        for stage in {0, rs.pp - 1}:
            base = stage * rs.stage_size
            assert rs.all_groups(kind, base) == rs.stage_groups_long_way(kind, base)
