"""What distributed-optimizer instances changed, in a sweep over `--dist-opt-instances`: one sentence.

For the sweet spot and its twin that differs only in the number of instances: the memory per GPU of each
(every instance holds a whole copy of the optimizer states, sim/cost/state_memory.py), whether the fewer
instances would not fit, the speed difference, and the share of the critical path DP communication holds in
each (the reduce-scatter inside an instance and the all-reduce of its shard across them,
sim/schedule/dp_ops.py).
"""

from __future__ import annotations

from meshsim.sim.core.fmt import fmt_pct
from meshsim.sim.sweep.explain_terms import fmt_gb, ok
from meshsim.sim.sweep.record import SweepRecord


def instances_sentence(best: SweepRecord, other: SweepRecord) -> str | None:
    """`best` / `other`: the same configuration with different parallel.dist_opt_instances."""
    if not (ok(best) and ok(other)):
        return None
    n, m = best.point.dist_opt_instances, other.point.dist_opt_instances
    mem, mem_other = best.result.memory_gb, other.result.memory_gb
    speed = best.result.tokens_per_s / other.result.tokens_per_s - 1.0
    dp, dp_other = (r.result.critical_path_share.get("dp_comm", 0.0) for r in (best, other))
    fit = f" (with {m} it does not fit)" if mem.fits and not mem_other.fits else ""
    held = "instances hold" if n > 1 else "instance holds"
    return (f"At tp={best.point.tp}, {n} optimizer {held} {fmt_gb(mem.total)} GiB per "
            f"GPU against {fmt_gb(mem_other.total)} with {m}{fit}, at {fmt_pct(abs(speed))} "
            f"{'more' if speed >= 0 else 'fewer'} tokens/s; DP communication is {fmt_pct(dp)} of its critical path "
            f"(vs {fmt_pct(dp_other)}).")
