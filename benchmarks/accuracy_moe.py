"""The `moe-layer` accuracy group: Megatron-LM's MoE layer benchmark (reference/public-measurements-2.md
section 1.5), simulated vs measured. Imported by benchmarks/accuracy.py; the end-to-end MoE runs are the
`moe` step group (benchmarks/accuracy/moe/*.yaml, sim/results/error_band.py; section 1.9's overlap-on run
is one of them, `qwen3-30b-h100-ep16-hybridep-overlap`).

Layer rows (section 1.5, tests/functional_tests/test_cases/common/moe_perf @d98e8a64): ONE MoELayer forward
and backward on 8 H100 (tp 1, ep 8, seq 4096 x micro-batch 1, bf16, GELU experts, no shared expert,
force-balanced routing), per dispatcher. Simulated: the MoE block's ops (sim/schedule/moe_ops.py, without
its norm and residual add, which the benchmark does not time) priced by the compute model and the
collective coster on the real ep group of one DGX H100, in program order on one stream through the engine
(nothing inside the block overlaps), the host ahead of the GPU except after the forward's device-to-host
syncs (sim/schedule/moe_sync.py), where it waits and then issues the following ops one by one. The FP8 rows run the experts' grouped GEMMs in blockwise FP8 with their quantize kernels
(sim/schedule/moe_ops.py) and 16-bit dispatch, as the benchmark does.
The benchmark runs 5 warm-up and 20 timed iterations of the one layer, with a synchronize after each
(moe_perf/__main__.py L36-37, L209-247): a lone kernel sequence, not minutes of training, so its compute is priced
at the burst clock (accuracy_rows.lone_kernel_compute_fn; sim/cost/gemm_ceiling.py).
"""

from __future__ import annotations

from dataclasses import replace

from accuracy_rows import lone_kernel_compute_fn

from meshsim.scenarios.load import resolve, validate_scenario
from meshsim.sim.cost.host_dispatch import HOST_DISPATCH_US, issue_times_s
from meshsim.sim.engine import events as engine
from meshsim.sim.results.costers import CollectiveCoster
from meshsim.sim.schedule.moe_ops import moe_backward, moe_forward
from meshsim.sim.schedule.moe_shapes import moe_dims
from meshsim.sim.schedule.moe_sync import mark_forward_syncs
from meshsim.sim.schedule.ops import Op, Schedule
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.sim.schedule.template import Template

NOT_TIMED = ("ln2", "mlp_res", "ln2_grad_add")  # the benchmark times MoELayer alone

# section 1.5: proxy -> (hidden, moe_ffn, experts, top_k, groups, group_topk, sigmoid)
PROXIES = {"mixtral": (4096, 14336, 8, 2, None, None, False), "deepseek": (7168, 2048, 32, 8, 8, 4, True)}
# (proxy, dispatcher label) -> (fwd ms, bwd ms) as printed in baseline.json
LAYER_MS = {
    ("mixtral", "a2a"): (4.32688798904419, 7.684332823753357),
    ("mixtral", "deepep"): (4.635550403594971, 7.854356813430786),
    ("mixtral", "hybridep"): (4.342604804039001, 7.740782427787781),
    ("deepseek", "a2a"): (7.119169592857361, 10.482670497894286),
    ("deepseek", "deepep"): (5.681718397140503, 9.055137538909912),
    ("deepseek", "hybridep"): (5.390828824043274, 8.795001602172851),
}
LAYER_FP8_MS = {
    ("mixtral", "a2a"): (3.7876319885253906, 6.618246412277221),
    ("mixtral", "deepep"): (4.101150441169739, 6.82720000743866),
    ("mixtral", "hybridep"): (3.7007392168045046, 6.57167682647705),
    ("deepseek", "a2a"): (7.609272027015686, 10.126460886001587),
    ("deepseek", "deepep"): (6.034772801399231, 8.60211353302002),
    ("deepseek", "hybridep"): (5.142886424064637, 7.6874864339828495),
}
DISPATCH = {"a2a": {"moe_dispatcher": "alltoall"}, "deepep": {"moe_dispatcher": "flex", "moe_flex_backend": "deepep"},
            "hybridep": {"moe_dispatcher": "flex", "moe_flex_backend": "hybridep"}}
def layer_scenario(proxy: str, dispatcher: str, fp8: bool = False):
    """The benchmark case as a one-layer scenario; `fp8`: its fp8="hybrid", fp8_recipe="blockwise" cases
    (__main__.py L80-84), dispatch and combine still 16-bit (token_dispatcher.py / fused_a2a.py: the alltoall
    dispatcher moves the model dtype, HybridEP "does not support fp8 dispatch now", DeepEP is called
    without FP8)."""
    h, f, e, k, g, gk, sig = PROXIES[proxy]
    moe = {"experts": e, "top_k": k, "ffn_hidden": f, "router": "sigmoid" if sig else "softmax"}
    if g:
        moe |= {"router_groups": g, "router_group_topk": gk}
    data = {"name": f"moe-layer-{proxy}-{dispatcher}",
            "model": {"layers": 1, "hidden": h, "heads": 8, "seq_len": 4096, "vocab": 1024, "mlp": "gelu",
                      "bias": False, "dropout": False, "moe": moe},
            "topology": {"preset": "dgx-h100"},
            "parallel": {"tp": 1, "ep": 8, "global_batch": 8, **DISPATCH[dispatcher]}}
    if fp8:
        data["run"] = {"fp8": "blockwise", "fp8_format": "hybrid"}
    return resolve(validate_scenario(data, "benchmarks/accuracy_moe.py"), "benchmarks/accuracy_moe.py")


def block_ops(rs, backward: bool) -> tuple[Op, ...]:
    """The MoE block's timed ops in program order, all on one stream (Megatron runs them on the current
    stream: nothing inside the block overlaps), with the forward's host syncs (sim/schedule/moe_sync.py)."""
    d, m, tpl = layer_dims(rs), moe_dims(rs), Template()
    if backward:
        moe_backward(tpl, replace(d, dropout=False), m, ("gin",))
    else:
        moe_forward(tpl, "fwd", d, m, ("in",))
        mark_forward_syncs(tpl, 0, "fwd", m, d.fp8.on)
    kept = [i for i, t in enumerate(tpl.ops) if t.suffix.split(".", 1)[1] not in NOT_TIMED]
    new_id = {old: new for new, old in enumerate(kept)}
    return tuple(Op(new_id[i], t.suffix, "compute", "compute", t.phase, t.work,
                    tuple(new_id[x] for x in t.local_deps if x in new_id), host_calls=t.host_calls,
                    host_wait=None if t.host_wait is None else new_id[t.host_wait])
                 for i, t in ((i, tpl.ops[i]) for i in kept))


def block_time_ms(rs, backward: bool) -> float:
    """The block through the engine on one rank: compute times, collective times on the real groups, and
    the host (sim/cost/host_dispatch.py). The benchmark's dummy 8192 x 8192 GEMM before each iteration puts
    the host ahead of the GPU (its static issue times are all before the block starts: the whole block's
    host time earlier), so only a sync, where the host waits for the GPU, can delay an op."""
    sched = Schedule(block_ops(rs, backward), 1, 1, 1)
    static_s = issue_times_s(sched, HOST_DISPATCH_US * 1e-6)
    lead_s = static_s[-1]
    log = engine.run(sched, (0,), lone_kernel_compute_fn(rs), CollectiveCoster(rs), rs.group,
                     issue_s=[t - lead_s for t in static_s])
    return log.step_time_s * 1e3


def layer_rows(row_type, used: dict[str, tuple[str, ...]]) -> list:
    """One row per (proxy, dispatcher, phase): `row_type` is accuracy_rows.Row; `used` names the fits each
    case was used in (benchmarks/accuracy/fits.yaml)."""
    rows = []
    for precision, table in (("bf16", LAYER_MS), ("fp8", LAYER_FP8_MS)):
        for (proxy, disp), (fwd, bwd) in table.items():
            rs = layer_scenario(proxy, disp, precision == "fp8")
            label = "bf16" if precision == "bf16" else "fp8 blockwise"
            for phase, ms, backward in (("forward", fwd, False), ("backward", bwd, True)):
                name = f"moe-layer-{proxy}-{disp}-{precision}-{phase}"
                rows.append(row_type("moe-layer", name, f"layer {proxy} {disp} {label} {phase} (ep 8, 1 DGX H100)",
                                     ms, block_time_ms(rs, backward), "ms", used_in_fit=used.get(name, ())))
    return rows
