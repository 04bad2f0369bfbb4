"""What FSDP changed, in a sweep over `--fsdp`: one sentence from the records' numbers.

For the sweet spot and its twin that differs only in `fsdp`: the memory per GPU with and without it (FSDP
shards weights and gradients over dp, sim/cost/fsdp_memory.py), whether that is what lets the layout fit,
the speed difference, and the share of the critical path DP communication holds with it (its per-block
gathers and reduce-scatters, sim/schedule/fsdp_ops.py) against without.
"""

from __future__ import annotations

from meshsim.sim.core.fmt import fmt_pct
from meshsim.sim.sweep.explain_terms import fmt_gb, ok
from meshsim.sim.sweep.record import SweepRecord


def fsdp_sentence(on: SweepRecord, off: SweepRecord) -> str | None:
    """`on` / `off`: the same configuration with and without fsdp."""
    if not (ok(on) and ok(off)):
        return None
    mem_on, mem_off = on.result.memory_gb, off.result.memory_gb
    speed = on.result.tokens_per_s / off.result.tokens_per_s - 1.0
    dp_on, dp_off = (r.result.critical_path_share.get("dp_comm", 0.0) for r in (on, off))
    fit = " and makes it fit" if mem_on.fits and not mem_off.fits else ""
    return (f"At tp={on.point.tp}, fsdp=on holds {fmt_gb(mem_on.total)} GiB per GPU against {fmt_gb(mem_off.total)}"
            f"{fit}, at {fmt_pct(abs(speed))} {'more' if speed >= 0 else 'fewer'} tokens/s; DP communication is "
            f"{fmt_pct(dp_on)} of its critical path (vs {fmt_pct(dp_off)}).")
