"""tp_comm_overlap's userbuffers costs: a pipeline chunk's reduce-scatter is its share of the whole message's
NCCL time, and a GEMM beside a userbuffers kernel runs on the SMs it leaves (sim/schedule/shapes.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.scenarios.load import load_and_resolve
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.schedule.ops import Collective, Gemm
from meshsim.sim.schedule.shapes import UB_COMM_SMS, UB_PIPELINE_SPLITS, USERBUFFERS
from meshsim.topologies.gpus import GPUS


def test_a_userbuffers_chunk_costs_its_share_of_the_whole_message():
    rs = load_and_resolve("llama2-70b-h100-tp8")
    coster = CollectiveCoster(rs)
    group = rs.group("tp", 0)
    whole = Collective("reduce_scatter", "tp", 64 << 20)
    chunk = Collective("reduce_scatter", "tp", (64 << 20) // UB_PIPELINE_SPLITS, kernel=USERBUFFERS)
    (lat_w, bw_w, load_w), row_w = coster.cost(whole, group)
    (lat_c, bw_c, load_c), row_c = coster.cost(chunk, group)
    assert lat_c == pytest.approx(lat_w / UB_PIPELINE_SPLITS) and bw_c == pytest.approx(bw_w / UB_PIPELINE_SPLITS)
    assert load_c == load_w and row_c.busbw_gbps == pytest.approx(row_w.busbw_gbps)
    assert row_c.kernel == USERBUFFERS and row_c.to_json()["kernel"] == USERBUFFERS
    # negative control: the same quarter through NCCL pays the small message's protocol ramp
    nccl = coster.cost(replace(chunk, kernel="nccl"), group)[1]
    assert nccl.time_us > row_c.time_us


def test_a_gemm_beside_the_comm_kernel_runs_on_the_other_sms():
    """An 8192^3 GEMM fills every wave on 132 or 116 SMs alike (within the tile rounding), so it takes
    about 132 / 116 as long; a small one-wave GEMM (64 tiles) that cannot split k loses nothing."""
    h100 = ComputeModel(GPUS["h100-sxm"])
    big = Gemm(8192, 8192, 8192)
    ratio = (h100.time_s(replace(big, comm_sms=UB_COMM_SMS)) - h100.launch_s) / (h100.time_s(big) - h100.launch_s)
    assert ratio == pytest.approx(132 / 116, rel=0.03)
    small = Gemm(1024, 1024, 256)  # k too short to split (gemm_efficiency.SPLIT_K_MIN_K)
    assert h100.time_s(replace(small, comm_sms=UB_COMM_SMS)) == pytest.approx(h100.time_s(small), rel=1e-9)
    # with a long k the one-wave GEMM splits k over the idle SMs, so the comm kernel's SMs now cost it
    split = Gemm(1024, 1024, 8192)
    assert h100.time_s(replace(split, comm_sms=UB_COMM_SMS)) > h100.time_s(split)
