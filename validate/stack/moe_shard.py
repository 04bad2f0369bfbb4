"""An MoE layer's parameters and which slice of each a rank holds (Megatron-Core's MoELayer and its expert
mesh, "parallel folding": sim/core/mesh.py).

Full tensors, torch Linear layout [out, in], in layer i ("layers.i."):
- router.weight [experts, h] and, with add_bias_linear, router.bias [experts]: replicated on every rank;
  under SP each TP rank routes only its sequence shard, so their gradients join the SP all-reduce;
- experts.e.fc1 (gelu, relu2) or experts.e.gate / experts.e.up (swiglu) [ffn, h] and experts.e.fc2 [h, ffn]
  (ffn = model.moe.ffn_hidden), biases with add_bias_linear: a rank holds the experts of its expert-parallel
  position, experts ep_rank * E/ep ... (ep_rank + 1) * E/ep - 1 (Megatron's local_expert_indices), and of
  each the rows (fc1, gate, up) or columns (fc2) of its expert-tensor position, ffn / etp of them; fc2's
  bias whole (biases need etp = 1, scenarios/moe_checks.py);
- shared.fc1 / gate / up [shared_ffn, h], shared.fc2 [h, shared_ffn] (SharedExpertMLP): an MLP split over
  the attention TP group like the dense one, fc2's bias replicated (and in the SP region).
The layer's kind (dense or MoE) is model.moe.is_moe_layer, the rule the simulator uses
(sim/schedule/layer_kinds.py); widths and biases follow sim/schedule/model_family.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.schema import MoeConfig, Scenario
from meshsim.sim.schedule.model_family import is_gated


@dataclass(frozen=True)
class MoeLayout:
    """A scenario's model.moe and its expert mesh sizes."""

    config: MoeConfig
    ep: int = 1
    etp: int = 1

    @classmethod
    def from_scenario(cls, s: Scenario) -> MoeLayout | None:
        moe = s.model.moe
        return None if moe is None else cls(moe, s.parallel.ep, s.parallel.etp)

    @property
    def local_experts(self) -> int:
        return self.config.experts // self.ep

    def is_moe(self, layer: int) -> bool:
        return self.config.is_moe_layer(layer)

    def local(self, ep_rank: int) -> range:
        """The experts an expert-parallel position holds."""
        return range(ep_rank * self.local_experts, (ep_rank + 1) * self.local_experts)


@dataclass(frozen=True)
class ExpertMesh:
    """This rank's place on the expert mesh (sim/core/mesh.py expert_group) and its groups (None when of one
    rank): "ep" (the token all-to-all), "etp" (the experts' tensor parallelism), "etp_ep" (the token counts'
    all-gather) and "edp" (the experts' gradients)."""

    ep: int
    etp: int
    edp: int
    ep_rank: int
    etp_rank: int
    ep_group: object = None
    etp_group: object = None
    etp_ep_group: object = None
    edp_group: object = None


def _mlp(prefix: str, ffn: int, h: int, gated: bool, bias: bool) -> dict[str, tuple[int, ...]]:
    linears = {n: (ffn, h) for n in (("gate", "up") if gated else ("fc1",))}
    linears["fc2"] = (h, ffn)
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in linears.items():
        out[f"{prefix}{name}.weight"] = shape
        if bias:
            out[f"{prefix}{name}.bias"] = (shape[0],)
    return out


def moe_shapes(prefix: str, moe: MoeConfig, hidden: int, mlp: str, bias: bool) -> dict[str, tuple[int, ...]]:
    """Name -> full shape of one MoE layer's router, routed experts and shared expert (module docstring)."""
    out: dict[str, tuple[int, ...]] = {prefix + "router.weight": (moe.experts, hidden)}
    if bias:
        out[prefix + "router.bias"] = (moe.experts,)
    for e in range(moe.experts):
        out.update(_mlp(f"{prefix}experts.{e}.", moe.ffn_hidden, hidden, is_gated(mlp), bias))
    if moe.shared_ffn_hidden:
        out.update(_mlp(prefix + "shared.", moe.shared_ffn_hidden, hidden, is_gated(mlp), bias))
    return out


def expert_of(name: str) -> int | None:
    """The routed expert a parameter belongs to ("layers.1.experts.5.fc2.weight" -> 5), else None."""
    parts = name.split(".")
    return int(parts[3]) if len(parts) > 4 and parts[2] == "experts" else None


def is_moe_param(name: str) -> bool:
    parts = name.split(".")
    return len(parts) > 3 and parts[2] in ("router", "experts", "shared")


def moe_sp_params(names) -> list[str]:
    """MoE parameters in the SP region: the router's (replicated, fed the sequence shard) and the shared
    expert's row-parallel fc2 bias (added after its reduce-scatter)."""
    return [n for n in names if ".router." in n or n.endswith(".shared.fc2.bias")]


def _slice(full, part: int, parts: int, dim: int):
    n = full.shape[dim] // parts
    return full[part * n:(part + 1) * n] if dim == 0 else full[:, part * n:(part + 1) * n]


def holds(name: str, layout: MoeLayout | None, experts: ExpertMesh | None) -> bool:
    """Whether a rank holds (a slice of) parameter `name`: every one but other ranks' routed experts."""
    e = expert_of(name)
    return e is None or layout is None or e in layout.local(experts.ep_rank if experts else 0)


def moe_shard(name: str, full, tp: int, tp_rank: int, experts: ExpertMesh | None):
    """This rank's slice of an MoE parameter (module docstring); the expert must be one it holds."""
    kind, leaf = name.split(".")[-2:]
    if ".router." in name or (kind == "fc2" and leaf == "bias"):
        return full
    parts, part = (tp, tp_rank) if ".shared." in name else \
        (experts.etp, experts.etp_rank) if experts is not None else (1, 0)
    if kind == "fc2":
        return _slice(full, part, parts, 1)
    return _slice(full, part, parts, 0)  # fc1 / gate / up: rows (and their biases)
