"""Issue 42: Blackwell BF16 GEMMs at their own fitted ceiling; a fused wgrad into a bf16 main grad moves 2 + 2
bytes per element of C, and a bf16 gradient reduction makes Megatron's main-grad buffer bf16 (closed forms)."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_and_resolve, resolve, with_overrides
from meshsim.scenarios.schema import ComputeTuning, OptimizerConfig
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.schedule.layer_ops import wgrad
from meshsim.sim.schedule.ops import FUSED_WGRAD_OUT_BYTES, Gemm
from meshsim.sim.schedule.optimizer_states import main_grad_bytes
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.topologies.gpus import GPUS

NO_LAUNCH = ComputeTuning(launch_overhead_us=0.0)


def test_blackwell_bf16_reference_gemm_runs_at_its_own_ceiling():
    """8192^3 bf16 on B200: 0.60 x 2,250 = 1,350 TFLOP/s (H100's ceiling was assumed before: 1,687.5 at 0.75); GB200 at the same absolute rate."""
    g = Gemm(8192, 8192, 8192)
    for gpu in ("b200", "gb200"):
        t = ComputeModel(GPUS[gpu], NO_LAUNCH).time_s(g)
        assert g.flops / t / 1e12 == pytest.approx(1350.0, rel=1e-12)
    # negative control: Hopper keeps its own (sustained) 0.68
    assert g.flops / ComputeModel(GPUS["h100-sxm"], NO_LAUNCH).time_s(g) / 1e12 == pytest.approx(989 * 0.68)


def test_fused_wgrad_into_a_bf16_main_grad_moves_four_bytes_per_element():
    g = Gemm(4096, 13312, 16384)
    assert wgrad(g, True).out_bytes == FUSED_WGRAD_OUT_BYTES == 8
    assert wgrad(g, True, main_grad_bytes=2).out_bytes == 4
    assert wgrad(g, False, main_grad_bytes=2).out_bytes == 2  # no fusion: a fresh 16-bit dW
    # on an H100 the skinny-k epilogue (k = 4096 tokens) costs k_fill x out_bytes / 2 k-steps
    model = ComputeModel(GPUS["h100-sxm"], NO_LAUNCH)
    k_fill = 989e12 / 3350e9
    fp32, bf16 = (model.time_s(wgrad(g, True, main_grad_bytes=b)) for b in (4, 2))
    assert fp32 / bf16 == pytest.approx((4096 + 4 * k_fill) / (4096 + 2 * k_fill), rel=1e-9)


def test_main_grad_is_bf16_under_a_bf16_reduction():
    assert main_grad_bytes(OptimizerConfig()) == 4
    assert main_grad_bytes(OptimizerConfig(), "bf16") == 2
    assert main_grad_bytes(OptimizerConfig(), "fp32") == 4
    assert main_grad_bytes(OptimizerConfig(main_grads_dtype="bf16")) == 2


def test_bf16_reduction_halves_the_grads_and_the_wgrad_epilogue():
    rs = load_and_resolve("llama3-8b-h200")
    bf = resolve(with_overrides(rs.scenario, {"run.grad_reduce_dtype": "bf16"}, "test"), "test")
    assert layer_dims(rs).main_grad_bytes == 4 and layer_dims(bf).main_grad_bytes == 2
    assert memory_per_gpu(bf).grads_gb == pytest.approx(memory_per_gpu(rs).grads_gb / 2, rel=1e-12)


def test_moe_expert_wgrads_accumulate_into_the_main_grad_dtype():
    """The routed experts' and the shared expert's fused wgrads follow the main grad too (moe_ops.py)."""
    from meshsim.sim.schedule.moe_shapes import moe_dims

    rs = load_and_resolve("mixtral-8x7b-h100-ep8")
    bf = resolve(with_overrides(rs.scenario, {"run.grad_reduce_dtype": "bf16"}, "test"), "test")
    assert moe_dims(rs).main_grad_bytes == 4 and moe_dims(bf).main_grad_bytes == 2
