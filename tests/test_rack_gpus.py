"""Rack-scale presets (NVL72): the GPUs of each rack a job uses (topology.gpus_per_node, by default the job's
GPUs spread evenly over the racks), so power-of-two groups stay inside one NVLink domain."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.topologies.registry import build_topology


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, overrides, source), source)


def test_a_rack_preset_builds_the_gpus_a_job_uses():
    full, used = build_topology("gb200-nvl72", 2), build_topology("gb200-nvl72", 2, gpus_per_node=64)
    assert (full.gpus_per_node, full.num_gpus) == (72, 144)
    assert (used.gpus_per_node, used.num_gpus) == (64, 128)
    assert used.nvlink_gbps_per_gpu == full.nvlink_gbps_per_gpu and used.nic_gbps_per_gpu == full.nic_gbps_per_gpu
    assert used.node_of(63) == 0 and used.node_of(64) == 1 and full.node_of(64) == 0


def test_the_default_spreads_the_job_evenly_over_its_racks():
    base = {"topology.preset": "gb200-nvl72", "topology.nodes": 4, "parallel.gpus": 256, "parallel.tp": 1,
            "parallel.global_batch": 256, "parallel.micro_batch": 1}
    rs = tiny(base)
    assert rs.topology.gpus_per_node == 64 and rs.topology.node_of(255) == 3
    # a 64-rank group is one rack's: every member on the same node
    assert {rs.topology.node_of(r) for r in range(64, 128)} == {1}
    whole = tiny({**base, "parallel.gpus": 288, "parallel.global_batch": 288})  # the racks are full
    assert whole.topology.gpus_per_node == 72
    one = tiny({**base, "topology.nodes": 1, "parallel.gpus": 64, "parallel.global_batch": 64})
    assert one.topology.gpus_per_node == 72  # one rack: the first 64 of its 72, as before
    uneven = tiny({**base, "topology.nodes": 3, "parallel.gpus": 200, "parallel.global_batch": 200})
    assert uneven.topology.gpus_per_node == 72  # 3 racks do not split 200 evenly: fill them in order


def test_an_explicit_count_wins_and_dgx_nodes_refuse_it():
    rs = tiny({"topology.preset": "gb300-nvl72", "topology.nodes": 2, "topology.gpus_per_node": 48, "parallel.gpus": 96,
               "parallel.tp": 1, "parallel.global_batch": 96, "parallel.micro_batch": 1})
    assert rs.topology.gpus_per_node == 48 and rs.gpus == 96
    for overrides, words in (({"topology.gpus_per_node": 4}, "used whole"),
                             ({"topology.preset": "gb200-nvl72", "topology.gpus_per_node": 80}, "1 to 72")):
        with pytest.raises(UserError) as err:
            tiny(overrides)
        assert err.value.field == "topology.gpus_per_node" and words in str(err.value)
