"""Adam's state bytes per parameter and the cost of its step, on the GPU or offloaded to the host.

Megatron-Core's options (NVIDIA/Megatron-LM @d98e8a64, megatron/core/optimizer/optimizer_config.py,
megatron/training/arguments.py L3667-3685, L2918-2935), scenario section `optimizer`:

Main gradients, per parameter a rank holds: fp32 4 B; `main_grads_dtype: bf16` 2 B. With bf16 main grads
Megatron leaves accumulate_allreduce_grads_in_fp32 off (arguments.py L1215), so the DDP gradient buffer
is bf16 and the DP reduction moves bf16 (sim/schedule/run_settings.grad_reduce_bytes).

Optimizer states, per parameter this rank's optimizer owns (its dp / edp shard under the distributed
optimizer):
- default mixed precision: fp32 master 4 + exp_avg 4 + exp_avg_sq 4 = 12 B.
- precision-aware (TE FusedAdam with master_weights, optimizer/__init__.py L562-588): the master in
  main_params_dtype (fp32 4, fp16 2), or 2 B when store_param_remainders and bf16 training (the fp32
  master's low 16 bits kept as int16 beside the bf16 weight, its high half; distrib_optimizer.py L1008),
  plus exp_avg and exp_avg_sq in their dtypes (fp32 4, fp16 / bf16 2, fp8 1; TE's per-tensor fp8
  scales are neglected).
- cpu_offload (HybridDeviceOptimizer, optimizer/__init__.py L504-544, cpu_offloading/hybrid_optimizer.py):
  the first offload_fraction f of the owned parameters (whole tensors in order; modeled as the fraction)
  are updated by torch's fused CPU Adam with param_update_in_fp32: the host holds an fp32 copy of the
  parameter 4, its fp32 gradient 4 and fp32 exp_avg / exp_avg_sq 8 = 16 B (the sub-optimizers get only
  lr, betas, eps and weight decay, so the precision-aware dtypes do not apply); the rest stays on the GPU
  as an fp32 copy with fp32 moments, 12 B.

Muon (optimizer.name: muon, sim/schedule/muon.py): its parameters hold an fp32 master and one fp32 momentum,
MUON_STATE_BYTES = 8 per owned parameter, and its update streams both states and the 16-bit weight
(MUON_STEP_BYTES = 20) after the Newton-Schulz GEMMs; the other parameters keep Adam's figures.

Step cost:
- GPU Adam streams its states: read and write the master and both moments, read the gradient, read and
  write the 16-bit weight: 2 (master + m + v) + grad + 4 bytes per owned parameter (32 B in default
  mixed precision, the figure sim/schedule/ops.OptimizerStep always used).
- Offloaded share (n = f x owned parameters): the gradients go device-to-host as fp32, n x 4 B, and the
  updated fp32 parameters host-to-device, n x 4 B (non-blocking copies convert dtypes on the GPU, so fp32
  crosses PCIe both ways: PyTorch aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda, "If non_blocking
  is true - type conversions are performed on the GPU"); the CPU Adam moves n x 28 B of host DRAM (read
  parameter, gradient, exp_avg, exp_avg_sq; write parameter, exp_avg, exp_avg_sq). Without
  overlap_cpu_d2h_h2d the D2H copies run on the compute stream and the CPU steps after the whole copy's
  event, the H2D copies after the CPU step: d2h + cpu + h2d. With it every parameter tensor has its own
  CPU optimizer and the copies their own streams, so the three pipeline over tensors: max(d2h, cpu, h2d)
  (one tensor's fill and drain neglected). The schedule runs the offloaded share after the GPU share's
  step (HDO.step also issues the D2H copies first and steps the GPU share meanwhile; the serial order
  overstates the step by at most the GPU share's step, zero at f = 1).

Achieved bandwidths (assumptions; no measurement in our calibration set, overridable per scenario):
- PCIe: the GPU's PCIe link in the topology (DGX H100: Gen5 x16, 64 GB/s per direction,
  hardware-facts.md) x PCIE_COPY_EFFICIENCY 0.8 for pinned-memory copies (TLP headers and flow control).
- Host DRAM: the node's channels (HOST_DRAM_GBPS by the GPU's DGX host: DGX H100 / H200 two Xeon
  Platinum 8480C with 8 DDR5-4800 channels each, 2 x 8 x 38.4 = 614.4 GB/s; DGX A100 two EPYC 7742, 8
  DDR4-3200 channels each, 409.6 GB/s; DGX-1 two Xeon E5-2698 v4, 4 DDR4-2400 channels each, 153.6 GB/s;
  DGX B200 two Xeon Platinum 8570, 8 DDR5-5600 each, 716.8 GB/s: vendor datasheets) shared by the
  node's ranks, which all step at once, x HOST_ADAM_EFFICIENCY 0.5 (a multi-threaded streaming kernel
  on two NUMA sockets).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import OptimizerConfig, Scenario
from meshsim.sim.core.units import BF16_BYTES, FP32_BYTES, GB
from meshsim.sim.schedule.ops import OptimizerStep

STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
DEFAULT_ADAM_BYTES = 12  # fp32 master + two fp32 moments
HOST_STATE_BYTES = 16  # offloaded: fp32 parameter copy, fp32 gradient, two fp32 moments
HOST_ADAM_TRAFFIC_BYTES = 28  # read param, grad, m, v (4 each); write param, m, v
OFFLOAD_COPY_BYTES = FP32_BYTES  # each way over PCIe per offloaded parameter
WEIGHT_RW_BYTES = 2 * BF16_BYTES  # GPU Adam reads and writes the 16-bit weight
MUON_STATE_BYTES = 8  # Muon: fp32 master + fp32 momentum
MUON_STEP_BYTES = 2 * MUON_STATE_BYTES + WEIGHT_RW_BYTES  # read and write both states and the 16-bit weight
PCIE_COPY_EFFICIENCY = 0.8
DEFAULT_PCIE_GBPS = 32.0  # a topology without a PCIe link at its GPU: Gen4 x16 (hardware-facts.md)
HOST_ADAM_EFFICIENCY = 0.5
HOST_DRAM_GBPS = {"h100-sxm": 614.4, "h200-sxm": 614.4, "a100-80gb": 409.6, "a100-40gb": 409.6,
                  "v100-sxm2": 153.6, "b200": 716.8}
DEFAULT_HOST_DRAM_GBPS = 409.6  # a GPU without a DGX host of its own above: the DGX A100 figure


def main_grad_bytes(opt: OptimizerConfig, grad_reduce_dtype: str | None = None) -> int:
    """Bytes of one main gradient (the DDP buffer element): bf16 with main_grads_dtype bf16, or with a bf16
    gradient reduction (run.grad_reduce_dtype: bf16, Megatron --grad-reduce-in-bf16 / NeMo's
    grad_reduce_in_fp32 False): accumulate_allreduce_grads_in_fp32 is then off (arguments.py L1213-1214
    @d98e8a64) and DDP groups the parameters into buffers of the parameter dtype
    (distributed_data_parallel.py L191-192, group_params_for_buffers); else fp32."""
    bf16 = opt.main_grads_dtype == "bf16" or grad_reduce_dtype == "bf16"
    return BF16_BYTES if bf16 else FP32_BYTES


def master_bytes(opt: OptimizerConfig, bf16: bool) -> int:
    """The master copy's bytes under the precision-aware optimizer (remainders: the low 16 bits)."""
    if opt.main_params_dtype == "fp32" and opt.store_param_remainders and bf16:
        return 2
    return STATE_BYTES[opt.main_params_dtype]


def gpu_adam_bytes(opt: OptimizerConfig, bf16: bool) -> int:
    """GPU optimizer-state bytes per owned parameter that stays on the GPU."""
    if opt.cpu_offload or not opt.precision_aware:
        return DEFAULT_ADAM_BYTES
    return master_bytes(opt, bf16) + STATE_BYTES[opt.exp_avg_dtype] + STATE_BYTES[opt.exp_avg_sq_dtype]


def offloaded(opt: OptimizerConfig, owned: float) -> float:
    """Owned parameters the host updates."""
    return owned * opt.offload_fraction if opt.cpu_offload else 0.0


def state_bytes(opt: OptimizerConfig, bf16: bool, owned: float, muon: float = 0.0) -> tuple[float, float]:
    """(GPU, host) optimizer-state bytes for `owned` parameters, `muon` of them Muon's (8 B each)."""
    host = offloaded(opt, owned)
    return (owned - host - muon) * gpu_adam_bytes(opt, bf16) + muon * MUON_STATE_BYTES, host * HOST_STATE_BYTES


def gpu_step_bytes_per_param(opt: OptimizerConfig, bf16: bool) -> int:
    """HBM bytes the GPU Adam streams per owned parameter (module docstring)."""
    return 2 * gpu_adam_bytes(opt, bf16) + main_grad_bytes(opt) + WEIGHT_RW_BYTES


def offload_rates(s: Scenario, gpu_name: str, pcie_link_gbps: float, gpus_per_node: int) -> tuple[float, float]:
    """(PCIe, host DRAM) achieved bytes/s one rank's offloaded step gets: the scenario's figures, else the
    defaults of the module docstring."""
    o = s.optimizer
    pcie = o.pcie_gbps or pcie_link_gbps * PCIE_COPY_EFFICIENCY
    host = o.host_mem_gbps or (HOST_DRAM_GBPS.get(gpu_name, DEFAULT_HOST_DRAM_GBPS) * HOST_ADAM_EFFICIENCY
                               / gpus_per_node)
    return pcie * GB, host * GB


def gpu_pcie_gbps(rs: ResolvedScenario) -> float:
    """Bandwidth of rank 0's GPU's own PCIe link in the topology (its path to the host), else Gen4 x16."""
    gpu = rs.topology.gpu_names[0]
    links = [link.bw_gbps for link in rs.topology.links if link.src == gpu and link.kind == "pcie"]
    return links[0] if links else DEFAULT_PCIE_GBPS


@dataclass(frozen=True)
class StepPlan:
    """How a rank's optimizer step runs: GPU bytes per parameter, the host-updated fraction and rates."""

    bytes_per_param: int = 32
    offload_fraction: float = 0.0
    pcie_bytes_s: float = 0.0
    host_bytes_s: float = 0.0
    host_overlap: bool = False
    muon_params: float = 0.0  # owned parameters Muon updates (MUON_STEP_BYTES each; sim/schedule/muon.py)

    def work(self, owned: int) -> OptimizerStep:
        """The step over `owned` parameters: the GPU share and the host share (module docstring)."""
        host = round(owned * self.offload_fraction)
        gpu = owned - host
        per_param = self.bytes_per_param
        if self.muon_params and gpu:  # the average over Adam's and Muon's parameters
            muon = min(self.muon_params, gpu)
            per_param = ((gpu - muon) * self.bytes_per_param + muon * MUON_STEP_BYTES) / gpu
        return OptimizerStep(gpu, per_param, host, self.pcie_bytes_s, self.host_bytes_s, self.host_overlap)


def step_plan(rs: ResolvedScenario, muon_params: float = 0.0) -> StepPlan:
    """`muon_params`: the owned parameters Muon updates (sim/schedule/muon.owned_muon_params)."""
    s = rs.scenario
    opt, bf16 = s.optimizer, s.model.dtype == "bf16"
    plan = StepPlan(gpu_step_bytes_per_param(opt, bf16), muon_params=muon_params)
    if not opt.cpu_offload:
        return plan
    pcie, host = offload_rates(s, rs.gpu.name, gpu_pcie_gbps(rs), rs.topology.gpus_per_node)
    return StepPlan(plan.bytes_per_param, opt.offload_fraction, pcie, host, opt.overlap_cpu_d2h_h2d)
