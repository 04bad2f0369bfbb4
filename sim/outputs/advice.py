"""What to change when a configuration does not fit in GPU memory, from what it already sets.

One rule for every report that says "does not fit" (the `meshsim run` banner, a sweep's explanation): each
knob that lowers memory per GPU is suggested only when it is not already at the setting that saves the
most, with the scenario field that sets it:
- activation recompute: none -> selective or full; selective -> full; full -> nothing to add;
- sequence parallelism (tp > 1 only: it shards activations over the tp group);
- the distributed optimizer (shards optimizer state and master weights over dp; known off only);
- fewer distributed-optimizer instances (each holds a whole copy of the optimizer state; when above 1);
- FSDP (shards the weights and gradients over dp too; when the distributed optimizer is known on, FSDP known
  off, one optimizer instance, and there is no pipeline, which meshsim's FSDP does not model);
- a smaller micro-batch (activations scale with it), when it is above 1;
- a larger tp, while the tp group stays inside one node (beyond it, TP runs over InfiniBand);
- a larger ep, while it is below the expert count (each GPU holds experts / ep of the expert weights and
  gradients; its expert optimizer state is sharded over ep x edp, which stays the same);
- more pipeline stages (weights, gradients, optimizer state and most activations shrink by 1/pp);
- more GPUs: more dp shards the distributed optimizer's state, so only when it is on or unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshsim.scenarios.schema import Scenario


def memory_fixes(settings: Mapping[str, Any]) -> list[str]:
    """The suggestions, in the order above. `settings`: a results config echo (tp, pp, sp, recompute,
    micro_batch, gpus_per_node, ep, dist_opt_instances when above 1), with `distributed_optimizer`, `fsdp` and
    `experts` (model.moe.experts) when the caller knows them."""
    tp, pp = int(settings.get("tp", 1) or 1), int(settings.get("pp", 1) or 1)
    recompute, dist_opt = settings.get("recompute", "none"), settings.get("distributed_optimizer")
    fixes = {"none": ["activation recompute (parallel.recompute: selective, or full)"],
             "selective": ["full activation recompute (parallel.recompute: full; it is selective)"]}.get(recompute, [])
    if tp > 1 and not settings.get("sp"):
        fixes.append("sequence parallelism (parallel.sp: true)")
    if dist_opt is False:
        fixes.append("the distributed optimizer (parallel.distributed_optimizer: true)")
    instances = int(settings.get("dist_opt_instances", 1) or 1)
    if instances > 1:
        fixes.append(f"fewer distributed-optimizer instances (parallel.dist_opt_instances, now {instances}: each "
                     "holds a whole copy of the optimizer state)")
    if dist_opt is True and settings.get("fsdp") is False and pp == 1 and instances == 1:
        fixes.append("FSDP (parallel.fsdp: true shards the weights and gradients over dp too)")
    micro_batch = int(settings.get("micro_batch", 1) or 1)
    if micro_batch > 1:
        fixes.append(f"a smaller micro-batch (parallel.micro_batch, now {micro_batch})")
    per_node = int(settings.get("gpus_per_node", 0) or 0)
    if per_node and tp < per_node:
        fixes.append(f"a larger tp (parallel.tp, now {tp}; up to {per_node} stays inside one node)")
    ep, experts = int(settings.get("ep", 1) or 1), int(settings.get("experts", 0) or 0)
    if ep < experts:
        fixes.append(f"a larger ep (parallel.ep, now {ep}; up to the {experts} experts: it shards the expert "
                     "weights and gradients)")
    fixes.append(f"more pipeline stages (parallel.pp, now {pp})")
    if dist_opt is not False:
        fixes.append("more GPUs (a larger dp shards the distributed optimizer's state)")
    return fixes


def scenario_settings(scenario: Scenario) -> dict[str, Any]:
    """What memory_fixes needs from a scenario beyond a result's config echo."""
    p, moe = scenario.parallel, scenario.model.moe
    return {"distributed_optimizer": p.distributed_optimizer, "fsdp": p.fsdp,
            "experts": moe.experts if moe is not None else 0}


def fixes_sentence(settings: Mapping[str, Any]) -> str:
    """'Try A, B or C.' from memory_fixes."""
    fixes = memory_fixes(settings)
    listed = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + " or " + fixes[-1]
    return f"Try {listed}."
