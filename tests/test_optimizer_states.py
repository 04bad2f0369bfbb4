"""The optimizer section (precision-aware Adam, bf16 main grads, CPU offload): state bytes by hand, the
offloaded step's closed form, the DP reduction's bytes, Megatron's rules with negative controls."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.scenarios.schema import OptimizerConfig
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.results.step_result import non_defaults
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.ops import Collective, OptimizerStep
from meshsim.sim.schedule.optimizer_states import (
    gpu_adam_bytes,
    gpu_step_bytes_per_param,
    offload_rates,
    state_bytes,
    step_plan,
)
from meshsim.topologies.gpus import GPUS

PA = {"optimizer.precision_aware": True}
BF16_STATES = {**PA, "optimizer.main_grads_dtype": "bf16", "optimizer.exp_avg_dtype": "bf16",
               "optimizer.exp_avg_sq_dtype": "bf16"}
OFFLOAD = {**PA, "optimizer.cpu_offload": True}


def tiny(overrides: dict):
    """tiny-2gpu (dense, two GPUs of a DGX H100, dp 2, distributed optimizer)."""
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.tp": 1, "parallel.distributed_optimizer": True}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def test_state_bytes_by_hand():
    default = OptimizerConfig()
    assert gpu_adam_bytes(default, True) == 12 and gpu_step_bytes_per_param(default, True) == 32
    bf16 = OptimizerConfig(precision_aware=True, main_grads_dtype="bf16", exp_avg_dtype="bf16",
                           exp_avg_sq_dtype="bf16")
    assert gpu_adam_bytes(bf16, True) == 2 + 2 + 2  # int16 remainders + two bf16 moments
    assert gpu_adam_bytes(bf16.model_copy(update={"store_param_remainders": False}), True) == 4 + 2 + 2
    assert gpu_adam_bytes(bf16, False) == 4 + 2 + 2  # remainders only split a bf16 weight's fp32 master
    fp8 = bf16.model_copy(update={"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8", "main_params_dtype": "fp16"})
    assert gpu_adam_bytes(fp8, True) == 2 + 1 + 1
    assert gpu_step_bytes_per_param(bf16, True) == 2 * 6 + 2 + 4
    half = OptimizerConfig(precision_aware=True, cpu_offload=True, offload_fraction=0.25)
    assert state_bytes(half, True, 1000) == (750 * 12, 250 * 16)  # GPU share fp32, host fp32 copy+grad+m+v


def test_memory_follows_the_optimizer_section():
    base, bf16, off = tiny({}), tiny(BF16_STATES), tiny(OFFLOAD)
    mb, m16, mo = memory_per_gpu(base), memory_per_gpu(bf16), memory_per_gpu(off)
    held = mb.weights_gb / 2  # GB of parameters held (weights are 2 B each)
    assert mb.grads_gb == pytest.approx(4 * held) and m16.grads_gb == pytest.approx(2 * held)
    assert mb.optimizer_gb == pytest.approx(12 * held / 2)  # sharded over dp 2
    assert m16.optimizer_gb == pytest.approx(6 * held / 2)
    assert mo.optimizer_gb == 0 and mo.host_gb == pytest.approx(16 * held / 2) and mb.host_gb == 0
    assert mo.total_gb == pytest.approx(mb.total_gb - mb.optimizer_gb)  # host states are not GPU memory


def test_bf16_main_grads_reduce_in_bf16():
    def dp_bytes(rs):
        return sum(op.work.nbytes for op in build_schedule(rs).ops
                   if isinstance(op.work, Collective) and op.work.op == "reduce_scatter")
    assert dp_bytes(tiny(BF16_STATES)) * 2 == dp_bytes(tiny({}))


def test_offloaded_step_closed_form():
    rs = tiny({**OFFLOAD, "optimizer.offload_fraction": 0.5})
    step = next(op.work for op in build_schedule(rs).ops if isinstance(op.work, OptimizerStep))
    owned = step.params + step.host_params
    assert abs(step.host_params - owned / 2) <= 1
    pcie_s, host_s = offload_rates(rs.scenario, "h100-sxm", 64.0, 8)
    assert (pcie_s, host_s) == (pytest.approx(64.0 * 0.8e9), pytest.approx(614.4 * 0.5 / 8 * 1e9))
    cm = ComputeModel(GPUS["h100-sxm"])
    gpu_s = step.params * step.bytes_per_param / cm.optimizer_bw_bytes_s
    n = step.host_params
    serial = n * 4 / pcie_s + n * 28 / host_s + n * 4 / pcie_s
    assert cm.time_s(step) == pytest.approx(gpu_s + cm.launch_s + serial)
    over = step_plan(tiny({**OFFLOAD, "optimizer.offload_fraction": 0.5, "optimizer.overlap_cpu_d2h_h2d": True}))
    pipelined = over.work(owned)
    assert cm.time_s(pipelined) == pytest.approx(gpu_s + cm.launch_s + max(n * 4 / pcie_s, n * 28 / host_s))
    # negative control: without offload the same step has no host share
    assert step_plan(tiny({})).work(owned).host_params == 0


def test_mixtral_library_scenario_fits_only_with_its_optimizer_options():
    scenario, source = load_scenario("mixtral-8x7b-h100-ep8")
    assert memory_per_gpu(resolve(scenario, source)).fits
    default = with_overrides(scenario, {"optimizer.cpu_offload": False, "optimizer.overlap_cpu_d2h_h2d": False,
                                        "optimizer.precision_aware": False}, source)
    assert not memory_per_gpu(resolve(default, source)).fits


@pytest.mark.parametrize("overrides,field,words", [
    ({"optimizer.exp_avg_dtype": "bf16"}, "optimizer.exp_avg_dtype", "precision-aware"),
    ({"optimizer.cpu_offload": True}, "optimizer.cpu_offload", "precision-aware"),
    ({"optimizer.overlap_cpu_d2h_h2d": True}, "optimizer.overlap_cpu_d2h_h2d", "offload"),
    ({"optimizer.pcie_gbps": 50.0}, "optimizer.pcie_gbps", "offload"),
    ({**BF16_STATES, "run.grad_reduce_dtype": "fp32"}, "run.grad_reduce_dtype", "bf16 main gradients"),
])
def test_optimizer_rules(overrides, field, words):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)


def test_results_echo_the_optimizer_fields_set():
    from meshsim.sim.results.step_result import config_echo
    echo = config_echo(tiny(OFFLOAD))
    assert echo.optimizer == {"precision_aware": True, "cpu_offload": True} and echo.has("optimizer")
    assert config_echo(tiny({})).optimizer is None and "optimizer" not in config_echo(tiny({})).to_json()


@pytest.mark.parametrize("fields", [{}, {"name": "muon"}, {"name": "adam", "muon_ns_steps": 5},
                                    {"muon_ns_steps": 7, "exp_avg_dtype": "bf16", "store_param_remainders": False},
                                    {"cpu_offload": True, "offload_fraction": 0.5, "pcie_gbps": 20.0},
                                    {"offload_fraction": 1.0, "host_mem_gbps": 80.0, "main_grads_dtype": "bf16"}])
def test_optimizer_echo_equals_pydantic_dump_without_defaults(fields):
    """The results echo's non_defaults (no pydantic serializer built) is model_dump(exclude_defaults=True):
    fields set to their default value are left out too, and the order is the fields' order."""
    section = OptimizerConfig.model_validate(fields)
    dumped = section.model_dump(exclude_defaults=True)
    assert non_defaults(section) == dumped and list(non_defaults(section)) == list(dumped)
