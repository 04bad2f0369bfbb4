"""The Megatron CI gpt3 7B tp1 pp4 rows: what the measured step leaves for the last pipeline stage, and the
angles round three did not try, each printed as a term (a what-if, nothing scored, no constant changed).

    cd benchmarks && ../.venv/bin/python accuracy_ci_pipeline.py

Part 1, the last-stage bound. In Megatron's interleaved 1F1B with 4 micro-batches on pp 4 x vp 8 the step
cannot end before the last stage has done all its work (8 one-layer chunks x 4 micro-batches, plus the
131k-vocabulary head and its fp32 loss for each micro-batch), after the fill that feeds its first chunk and
before the drain of stages 2, 1, 0's last backward chunks. The optimizer's clip-grad norm all-reduce makes
the step one chain (megatron/core/optimizer/clip_grads.py @d98e8a64), so the measured iteration time bounds

    last-stage work <= measured - fill - drain          (fill, drain as meshsim prices them)

The table prints meshsim's last-stage compute, fill and drain per GPU, and the factor the last stage's
compute would need for the measured step: GB200's is about 0.87 while its tp4 twin, with the same
per-GPU FLOPs, is priced right; A100's is above 1.

Part 2, variants on the six CI rows (pp4 / tp4 per GPU, as accuracy_ci_terms.py prints them):
- Megatron's unfused cross-entropy as it runs at d98e8a64 (megatron/core/tensor_parallel/cross_entropy.py,
  VocabParallelCrossEntropy, called by language_module.compute_language_model_loss when
  cross_entropy_loss_fusion is off, which --deterministic-mode requires: megatron/training/determinism.py
  ARG_VALUES_REQUIRED_FOR_DETERMINISM): over the T x V logits, forward `.float()` (read 2 B, write 4 B,
  a fresh tensor), `torch.max` (read 4), in-place subtract (4 + 4), in-place `torch.exp` (4 + 4), `sum`
  (read 4), in-place `div_` (4 + 4); backward in-place `mul_` (4 + 4) and autograd's cast of the
  gradient back to bf16 (read 4, write 2, fresh). 52 B per logit plus 6 B of NaN fill, where
  sim/schedule/head_ops.py's four fused kernels move 28 plus 6. Priced here by replacing head_ops'
  kernel list for the run (the schedule is not this script's to change).
- PyTorch's host dispatch at 3x (60 us per op): a slower host (GB200's Grace) would be felt only where the
  GPU waits on the host.
Each prints pp4 s, tp4 s, their ratio, the measured ratio and the ratio's error, per GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from accuracy_cases import step_cases
from accuracy_rows import what_if_step_s

from meshsim.scenarios.load import resolve, with_overrides
from meshsim.sim.core.units import FP32_BYTES
from meshsim.sim.results.simulate import simulate_with_events
from meshsim.sim.schedule import head_ops
from meshsim.sim.schedule.ops import Elementwise

GPUS = ("a100", "h100", "gb200")


def _cases() -> dict[str, object]:
    return {c.name: c for c in step_cases("dense") if c.name.startswith("ci-gpt3-7b-")}


def last_stage_terms(case) -> dict[str, float]:
    """The last pipeline stage's compute, its fill (time before its first op), the drain after its last op,
    and the step, from one simulated step of `case` (seconds)."""
    scenario = with_overrides(case.scenario, {"hardware.release": case.release}, str(case.path))
    result, log, _ = simulate_with_events(resolve(scenario, str(case.path)))
    last = log.ranks[-1]
    mine = [e for e in log.events if e.rank == last and e.category == "compute"]
    head = sum(e.end_s - e.start_s for e in mine if e.name.startswith("head."))
    return {"step": result.step_time_s, "compute": sum(e.end_s - e.start_s for e in mine), "head": head,
            "fill": min(e.start_s for e in mine), "drain": result.step_time_s - max(e.end_s for e in mine)}


def megatron_xent_kernels(d) -> dict[str, Elementwise]:
    """VocabParallelCrossEntropy's passes over this rank's T x V/t logits (module docstring), grouped into
    head_ops' four kernels. The in-place names (xent_exp, xent_loss: no NaN fill) carry in-place passes;
    the fresh outputs' fills are the fp32 copy (xent_max writes it) and the bf16 gradient (written twice in
    xent_grad's bytes: the fill's pass and the cast's)."""
    lg16, lg32, tok = d.tokens * d.vocab * d.dtype_bytes, d.tokens * d.vocab * FP32_BYTES, d.tokens * FP32_BYTES
    return {
        "xent_max": Elementwise("xent_max", lg16 + lg32, lg32 + tok),  # .float(), then the row max
        "xent_exp": Elementwise("xent_exp", 3 * lg32 + tok, 2 * lg32 + tok),  # -= max, exp in place, sum
        "xent_loss": Elementwise("xent_loss", lg32 + 3 * tok, lg32 + tok),  # div_ in place, loss
        "xent_grad": Elementwise("xent_loss", 2 * lg32 + 2 * tok, lg32 + 2 * lg16),  # mul_ in place, to bf16
    }


@contextlib.contextmanager
def patched_xent() -> Iterator[None]:
    saved = head_ops._xent_kernels
    head_ops._xent_kernels = megatron_xent_kernels
    try:
        yield
    finally:
        head_ops._xent_kernels = saved


VARIANTS = {
    "as modelled": ({}, contextlib.nullcontext),
    "Megatron's unfused cross-entropy passes": ({}, patched_xent),
    "host dispatch 60 us per op": ({"hardware.compute.host_dispatch_us": 60.0}, contextlib.nullcontext),
}


def main() -> None:
    cases = _cases()
    print(f"{'gpu':6s} {'meas s':>7s} {'sim s':>7s} {'last-stage compute':>18s} {'of it head':>10s} "
          f"{'fill':>6s} {'drain':>6s} {'bound':>7s} {'factor':>6s}")
    for gpu in GPUS:
        pp = cases[f"ci-gpt3-7b-tp1-pp4-{gpu}"]
        t = last_stage_terms(pp)
        bound = pp.measured_s - t["fill"] - t["drain"]
        print(f"{gpu:6s} {pp.measured_s:7.3f} {t['step']:7.3f} {t['compute']:18.3f} {t['head']:10.3f} "
              f"{t['fill']:6.3f} {t['drain']:6.3f} {bound:7.3f} {bound / t['compute']:6.3f}")
    print()
    print(f"{'variant':42s} {'gpu':6s} {'pp4 s':>7s} {'err':>6s} {'tp4 s':>7s} {'err':>6s} {'ratio':>6s} "
          f"{'meas':>6s} {'error':>7s}")
    for label, (overrides, context) in VARIANTS.items():
        with context():
            for gpu in GPUS:
                pp, tp = cases[f"ci-gpt3-7b-tp1-pp4-{gpu}"], cases[f"ci-gpt3-7b-tp4-pp1-{gpu}"]
                pp_s, tp_s = what_if_step_s(pp, overrides), what_if_step_s(tp, overrides)
                measured = pp.measured_s / tp.measured_s
                print(f"{label:42s} {gpu:6s} {pp_s:7.3f} {100 * (pp_s / pp.measured_s - 1):+5.1f}% "
                      f"{tp_s:7.3f} {100 * (tp_s / tp.measured_s - 1):+5.1f}% {pp_s / tp_s:6.3f} "
                      f"{measured:6.3f} {100 * (pp_s / tp_s / measured - 1):+6.1f}%")


if __name__ == "__main__":
    main()
