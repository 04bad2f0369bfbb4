"""A block's ops recorded once with relative deps, then stamped per (layer, micro-batch) by the builder.

`Template.add` appends an op: deps are ints (ops of the same template, by index) or strs (named external
inputs: "in" = the layer input's producer, "gin" = the producer of the gradient of the layer output);
`marks` names outputs, `grads` / `expert_grads` list the (op, params) producers of gradients reduced over
dp / edp. An op also carries its host side (Op.host_calls, and host_wait as a local index).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshsim.sim.schedule.ops import Work, stream_of

Deps = tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class TemplateOp:
    suffix: str  # "fwd.qkv": the op name after the "L3.mb0." prefix
    stream: str
    category: str
    phase: str
    work: Work
    local_deps: tuple[int, ...]
    ext_deps: tuple[str, ...]
    host_calls: int = 2  # Op.host_calls
    host_wait: int | None = None  # Op.host_wait, as a local index


@dataclass
class Template:
    """Ops of one block with relative deps; `marks` names outputs, `grads` lists (op, params) producers of
    gradients reduced over dp, `expert_grads` those of the routed experts (reduced over edp)."""

    ops: list[TemplateOp] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    grads: list[tuple[int, int]] = field(default_factory=list)
    expert_grads: list[tuple[int, int]] = field(default_factory=list)
    # its last compilation for stamping (sim/schedule/stencil.stencil_of): a cache, not part of its value
    stencil: object = field(default=None, init=False, compare=False, repr=False)

    def add(self, phase: str, key: str, work: Work, deps: Deps = (), host_calls: int = 2,
            host_wait: int | None = None) -> int:
        stream = stream_of(work)
        local = tuple(d for d in deps if isinstance(d, int))
        ext = tuple(d for d in deps if isinstance(d, str))
        self.ops.append(TemplateOp(f"{phase}.{key}", stream, stream, phase, work, local, ext, host_calls, host_wait))
        return len(self.ops) - 1
