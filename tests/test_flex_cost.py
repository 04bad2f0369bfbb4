"""The flex dispatcher's kernels (DeepEP / HybridEP) on NVLink, by GPU generation (sim/cost/collectives/flex.py):
golden numbers from DeepEP's own benchmarks and the per-generation cap on what the kernels push."""

from __future__ import annotations

import math

import pytest

from meshsim.sim.cost.collectives.cost import collective_cost
from meshsim.sim.cost.collectives.flex import (
    DEEPEP_NVLINK_EFFICIENCY,
    FLEX_CONSTANTS,
    FLEX_NVLINK_CAP_GBPS,
    flex_arguments,
    flex_constants,
)
from meshsim.topologies.registry import build_topology

# DeepEP V2's SM100 EP8 benchmark: 8,192 tokens, hidden 7,168, top-8 of 256 experts on 8 ranks (32 each); the
# logical bytes (local rows included) of its BF16 combine, one row per token and destination rank
DISTINCT_RANKS = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
COMBINE_BYTES = math.ceil(8192 * DISTINCT_RANKS) * 7168 * 2


def flex_time_s(preset: str, **topology) -> float:
    topo = build_topology(preset, **topology)
    return collective_cost(topo, "all_to_all", range(8), COMBINE_BYTES, **flex_arguments("deepep", topo)).time_s


def test_blackwell_flex_combine_runs_at_deepeps_measured_740_gbps():
    """DeepEP V2 README: "SM100 EP8 NVLink: 726/740 GB/s at 64 SMs"; the direct plan on 8 B200 moves the
    combine's 622 MB in 0.840 ms, 740 GB/s of logical bandwidth."""
    assert math.isclose(COMBINE_BYTES, 621.8e6, rel_tol=1e-3)
    assert COMBINE_BYTES / flex_time_s("dgx-b200") / 1e9 == pytest.approx(740.0, rel=0.01)


@pytest.mark.parametrize(("preset", "efficiency"), [("dgx-b200", 660.6 / 900), ("gb200-nvl72", 660.6 / 900),
                                                    ("dgx-b300", 660.6 / 900), ("gb300-nvl72", 660.6 / 900),
                                                    ("dgx-h100", 189 / 450), ("dgx-h200", 189 / 450)])
def test_the_generation_cap_sets_the_nvlink_efficiency(preset, efficiency):
    assert flex_constants(build_topology(preset)).nvlink_efficiency == pytest.approx(efficiency, rel=1e-12)
    assert FLEX_NVLINK_CAP_GBPS == {"hopper": 189.0, "blackwell": 660.6}


def test_an_h800_stays_under_the_cap_at_deepeps_153_of_160():
    """Negative control: with NVLink cut to the H800's 160 GB/s the Hopper cap does not bind and the kernels
    run at the H800 figure DeepEP measured (docs/legacy.md), so slower links give a longer time."""
    h800 = build_topology("dgx-h100", nvlink_gbps=160.0)
    assert flex_constants(h800).nvlink_efficiency == DEEPEP_NVLINK_EFFICIENCY
    assert flex_time_s("dgx-h100", nvlink_gbps=160.0) > flex_time_s("dgx-h100")


def test_nccl_takes_no_flex_arguments_and_unknown_kernels_are_refused():
    topo = build_topology("dgx-b200")
    assert flex_arguments("nccl", topo) == {}
    assert flex_constants(build_topology("dgx-a100")) is FLEX_CONSTANTS  # no cap measured for Ampere
    with pytest.raises(ValueError):
        flex_arguments("nvshmem", topo)
