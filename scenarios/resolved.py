"""A scenario with every default and reference resolved: the object the simulator consumes.

Produced by `meshsim.scenarios.load.resolve()` (scenarios/load.py) after all checks have passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.cp_checks import a2a_size
from meshsim.scenarios.profile import HardwareProfile
from meshsim.scenarios.releases import ReleaseProfile
from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.mesh import CP_KINDS, EXPERT_KINDS, INSTANCE_KINDS, mesh_group, stage_groups
from meshsim.topologies.gpus import GPUS, GpuSpec
from meshsim.topologies.model import Topology


@dataclass(frozen=True)
class ResolvedScenario:
    scenario: Scenario
    source: str  # file path or "builtin:NAME"; used in messages
    gpu: GpuSpec  # preset with hardware overrides and profile figures applied
    topology: Topology  # the whole machine (all nodes)
    gpus: int  # GPUs used: the first `gpus` ranks of the topology, TP innermost, then CP, then DP, then PP
    tp: int
    dp: int
    micro_batches: int  # gradient-accumulation steps per DP rank = global_batch / (micro_batch * dp)
    profile: HardwareProfile | None = None
    pp: int = 1  # pipeline stages: stage s holds ranks s*tp*dp ... (s+1)*tp*dp - 1
    vp: int = 1  # virtual stages (model chunks) per rank
    ep: int = 1  # expert parallel (the experts' mesh etp x ep x edp x pp, sim/core/mesh.py)
    etp: int = 1  # expert tensor parallel
    cp: int = 1  # context parallel: the sequence over cp ranks (sim/core/mesh.py)
    # the software-release family's constants (hardware.release, else the newest; scenarios/releases.py);
    # None only for records built by hand (tests): no release rate applies
    release: ReleaseProfile | None = None

    @property
    def fp8_gemm_rate(self) -> float:
        """The release's multiplier on the GPU generation's FP8 GEMM ceiling (1 without a release)."""
        return self.release.fp8_rate(self.gpu.name) if self.release is not None else 1.0

    @property
    def cp_comm(self) -> str:
        """parallel.cp_comm (p2p, a2a, allgather or a2a+p2p)."""
        return self.scenario.parallel.cp_comm

    @property
    def cp_a2a(self) -> int:
        """Ranks of the all-to-all level of context parallelism: cp for a2a, hierarchical_cp[0] for a2a+p2p."""
        return a2a_size(self.scenario)

    @property
    def grad_dp(self) -> int:
        """Ranks that reduce one gradient and shard the distributed optimizer: dp x cp (Megatron's dp-cp group)."""
        return self.dp * self.cp

    @property
    def instances(self) -> int:
        """Distributed-optimizer instances (parallel.dist_opt_instances): the optimizer states shard over
        grad_dp / instances and edp / instances ranks."""
        return self.scenario.parallel.dist_opt_instances

    @property
    def instance_shards(self) -> tuple[int, int]:
        """Ranks one instance shards the dense and the expert states over: grad_dp / instances and
        edp / instances (the whole groups with one instance)."""
        return self.grad_dp // self.instances, self.edp // self.instances

    @property
    def edp(self) -> int:
        """Expert data parallel: the stage's ranks over etp x ep (Megatron parallel_state.py L874-883)."""
        return self.stage_size // (self.etp * self.ep)

    @property
    def stage_size(self) -> int:
        """Ranks per pipeline stage: tp x cp x dp."""
        return self.tp * self.cp * self.dp

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_size

    @property
    def name(self) -> str:
        return self.scenario.name

    def tp_group(self, index: int = 0) -> tuple[int, ...]:
        """Global ranks of TP group `index` (TP innermost: ranks index*tp ... index*tp+tp-1)."""
        return mesh_group("tp", index * self.tp, self.tp, self.dp, cp=self.cp)

    def dp_group(self, tp_rank: int = 0) -> tuple[int, ...]:
        """Global ranks of the DP (x CP) group holding (stage 0's) rank `tp_rank`: tp_rank, tp_rank+tp, ..."""
        return mesh_group("dp", tp_rank, self.tp, self.dp, cp=self.cp)

    @property
    def datasheet_peak_tflops(self) -> float:
        """The peak MFU is quoted against: the GPU preset's datasheet figure, or hardware.peak_tflops when
        the scenario states one. Never a profile's measured best GEMM (that feeds the cost models only)."""
        stated = self.scenario.hardware.peak_tflops
        preset = GPUS.get(self.gpu.name)
        return stated or (preset.peak_tflops if preset is not None else self.gpu.peak_tflops)

    @property
    def kv_replicas(self) -> int:
        """Ranks of a TP group holding the same KV head: tp / kv_heads when kv_heads < tp, else 1."""
        kv = self.scenario.model.num_kv_heads
        return self.tp // kv if kv < self.tp else 1

    def kv_group(self, rank: int = 0) -> tuple[int, ...]:
        """The ranks replicating `rank`'s KV head: a block of kv_replicas consecutive ranks of its TP group."""
        return mesh_group("kv", rank, self.tp, self.dp, self.kv_replicas, cp=self.cp)

    def all_kv_groups(self) -> tuple[tuple[int, ...], ...]:
        return self.all_groups("kv")

    def group(self, kind: str, rank: int = 0) -> tuple[int, ...]:
        """`rank`'s group of a schedule's symbolic kind: "tp", "dp", "kv", "pp", "embed", "stage", an expert
        kind ("etp", "ep", "etp_ep", "edp"), a context-parallel kind ("cp", "cp_a2a", "cp_p2p") or a
        distributed-optimizer-instance kind ("dp_in", "edp_in", "dp_out")."""
        return mesh_group(kind, rank, self.tp, self.dp, self.kv_replicas, self.pp, self.ep, self.etp, self.cp,
                          self.cp_a2a, self.instances)

    def all_groups(self, kind: str, rank: int = 0) -> tuple[tuple[int, ...], ...]:
        """Every group of that kind in `rank`'s pipeline stage: the symmetric copies that run a collective
        at the same time (other stages run other ops then). "embed" groups span the first and last stage."""
        base = self.stage_of(rank) * self.stage_size
        if kind == "embed":
            return tuple(self.group("embed", r) for r in range(self.stage_size))
        if kind == "kv":
            return tuple(self.kv_group(base + r) for r in range(0, self.stage_size, self.kv_replicas))
        if kind in EXPERT_KINDS or kind == "stage" or kind in CP_KINDS or kind in INSTANCE_KINDS:
            fast = stage_groups(kind, base, self.stage_size, self.tp, self.cp, self.cp_a2a, self.ep, self.etp)
            return fast if fast is not None else self.stage_groups_long_way(kind, base)
        step = self.tp if kind == "tp" else 1
        count = self.dp * self.cp if kind == "tp" else self.tp
        return tuple(self.group(kind, base + i * step) for i in range(count))

    def stage_groups_long_way(self, kind: str, base: int) -> tuple[tuple[int, ...], ...]:
        """The distinct groups of `kind` met by the stage's ranks from `base` on, in that order (what
        mesh.stage_groups gives by arithmetic; tests/test_stage_groups.py compares the two)."""
        return tuple(dict.fromkeys(self.group(kind, base + r) for r in range(self.stage_size)))

    def all_tp_groups(self) -> tuple[tuple[int, ...], ...]:
        return self.all_groups("tp")

    def all_dp_groups(self) -> tuple[tuple[int, ...], ...]:
        return self.all_groups("dp")

    def crosses_nodes(self) -> bool:
        """True when a TP group spans more than one node (TP leaves the NVLink domain)."""
        return self.tp > self.topology.gpus_per_node
