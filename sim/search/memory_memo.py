"""The closed-form memory of a layout, priced once per memory class: `MemoryMemo()(layout, rs)`.

Claim: MemoryMemo()(layout, rs) == memory_per_gpu(rs) for every layout of a search and its resolved
scenario rs (rs = resolve(the scenario with the layout's overrides), sim/search/screen.py).

The argument. Within one search every resolved layout is a pure function of the layout (the scenario, the
files and the source are fixed: screen.py resolves under one file snapshot), so memory_per_gpu(rs) is a
function of the layout. Two layouts whose `memory_key` is equal differ at most in the axes of NOT_READ
(tp_comm_overlap, moe_dispatcher, flex_backend): their scenarios differ only in the fields
parallel.tp_comm_overlap, parallel.moe_dispatcher and parallel.moe_flex_backend, and resolve derives none of
rs's other fields (tp, dp, micro_batches, pp, vp, ep, etp, cp, gpu, topology, profile, release) from them. In
the closed form's call graph (sim/cost/memory.py and what it calls: layer_memory.py, state_memory.py,
fsdp_memory.py, fp8_memory.py, mtp_memory.py, fa2_memory.py, fa2_deterministic.py; sim/schedule/layer_kinds.py
layer_plan, shapes.py layer_dims, moe_shapes.py moe_dims and fp8_linear_weights, mla_ops.py, fp8_rules.py,
optimizer_states.py, muon.py, mtp_ops.py, pipeline.py, pipeline_layout.py) the three fields are read only to
fill LayerDims.chunks / rs_chunks / comm_sms (shapes.py, userbuffers) and MoeDims.dispatcher / flex_backend
(moe_shapes.py), and no function of that graph reads those five record fields (a grep of the files listed
finds their names only in the definitions). So the two layouts' memory is computed from equal values by the
same functions: equal, to the bit. tests/test_search_screen.py checks memo on == memo off over generated
layouts whose memory classes hold several layouts (the edge: layouts differing only in those axes, both
legal).

Where it pays: DeepSeek-V3's space has 3 dispatchers and both TP overlaps per memory class (6 layouts,
one memory); the Llama spaces 2 (TP overlap). Screening orders its chunks by memory_key
(screen_pool.py), so a class is screened in one process and its memo hits there.
If sim/cost/memory.py ever reads one of these fields, this memo must drop it from NOT_READ; the
eventual home of this key is beside memory_per_gpu (sim/cost/memory.py), as the list of what it reads.
"""

from __future__ import annotations

from dataclasses import replace

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.cost.memory import MemoryBreakdown, memory_per_gpu
from meshsim.sim.search.space import Layout

NOT_READ = ("tp_comm_overlap", "moe_dispatcher", "flex_backend")  # axes the closed form does not read
_NOT_READ_FIELDS = ("parallel.moe_dispatcher", "parallel.moe_flex_backend")  # their variant fields (space.py)


def memory_key(layout: Layout) -> tuple:
    """The layout with the axes of NOT_READ at one value: equal keys, equal memory (module docstring)."""
    point = replace(layout.point, tp_comm_overlap=False)
    return point, tuple(kv for kv in layout.variant if kv[0] not in _NOT_READ_FIELDS)


class MemoryMemo:
    """memory_key -> MemoryBreakdown, for the layouts screened in one process."""

    def __init__(self):
        self.made: dict[tuple, MemoryBreakdown] = {}
        self.hits = 0

    def __call__(self, layout: Layout, rs: ResolvedScenario) -> MemoryBreakdown:
        key = memory_key(layout)
        hit = self.made.get(key)
        if hit is None:
            hit = self.made[key] = memory_per_gpu(rs)
        else:
            self.hits += 1
        return hit
