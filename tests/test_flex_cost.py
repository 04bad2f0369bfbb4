"""The flex dispatcher's kernels (DeepEP / HybridEP) on NVLink, by GPU generation (sim/cost/collectives/flex.py):
golden numbers from DeepEP's own benchmarks."""

from __future__ import annotations

import math

import pytest

from meshsim.sim.cost.collectives.cost import collective_cost
from meshsim.sim.cost.collectives.flex import (
    DEEPEP_NVLINK_EFFICIENCY,
    DEEPEP_SM100_NVLINK_EFFICIENCY,
    FLEX_CONSTANTS,
    flex_arguments,
)
from meshsim.topologies.registry import build_topology

# DeepEP V2's SM100 EP8 benchmark: 8,192 tokens, hidden 7,168, top-8 of 256 experts on 8 ranks (32 each); the
# logical bytes (local rows included) of its BF16 combine, one row per token and destination rank
DISTINCT_RANKS = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
COMBINE_BYTES = math.ceil(8192 * DISTINCT_RANKS) * 7168 * 2


def test_blackwell_flex_combine_runs_at_deepeps_measured_740_gbps():
    """DeepEP V2 README: "SM100 EP8 NVLink: 726/740 GB/s at 64 SMs"; the direct plan on 8 B200 moves the
    combine's 622 MB in 0.840 ms, 740 GB/s of logical bandwidth."""
    cost = collective_cost(build_topology("dgx-b200"), "all_to_all", range(8), COMBINE_BYTES,
                           **flex_arguments("deepep", "b200"))
    assert math.isclose(COMBINE_BYTES, 621.8e6, rel_tol=1e-3)
    assert COMBINE_BYTES / cost.time_s / 1e9 == pytest.approx(740.0, rel=0.01)


@pytest.mark.parametrize("preset", ["gb200-nvl72", "dgx-b300", "gb300-nvl72"])
def test_every_blackwell_part_takes_the_sm100_figure(preset):
    topo = build_topology(preset)
    args = flex_arguments("hybridep", topo.gpu)
    assert args["constants"].nvlink_efficiency == DEEPEP_SM100_NVLINK_EFFICIENCY


def test_hopper_keeps_the_h800_figure_and_nccl_takes_none():
    """Negative controls: on H100 the H800-derived 153 / 160; NCCL's own all-to-all has no flex arguments."""
    args = flex_arguments("deepep", "h100-sxm")
    assert args["constants"] is FLEX_CONSTANTS and FLEX_CONSTANTS.nvlink_efficiency == DEEPEP_NVLINK_EFFICIENCY
    assert flex_arguments("nccl", "b200") == {}
    hopper = collective_cost(build_topology("dgx-h100"), "all_to_all", range(8), COMBINE_BYTES,
                             **flex_arguments("deepep", "h100-sxm"))
    blackwell = collective_cost(build_topology("dgx-b200"), "all_to_all", range(8), COMBINE_BYTES,
                                **flex_arguments("deepep", "b200"))
    assert blackwell.time_s < hopper.time_s  # NVLink 5's 900 GB/s still beats 450 at the lower efficiency
    with pytest.raises(ValueError):
        flex_arguments("nvshmem", "b200")
