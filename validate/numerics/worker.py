"""Worker side of the numerics check: one variant's step on this rank and its comparisons.

Process groups (validate/stack/groups.py) are created lazily per (tp, dp, pp, kv, ep/etp) in variant order, which is the
same on every rank, as torch.distributed.new_group requires. The model's tensors are on the CPU, so its
groups are gloo groups even when the default backend is NCCL (build_mesh(cpu=True)).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from meshsim.scenarios.schema import Scenario
from meshsim.sim.schedule.pipeline import PipelineShape
from meshsim.sim.schedule.pipeline_layout import pipeline_layout
from meshsim.sim.schedule.shapes import ModelDims
from meshsim.validate.numerics.opcount import count_collectives, count_p2p
from meshsim.validate.numerics.tolerances import SCALED_BOUND, TOLERANCES
from meshsim.validate.stack.comm import comm_tag
from meshsim.validate.stack.groups import build_mesh
from meshsim.validate.stack.layers import Mesh, Plan
from meshsim.validate.stack.model import forward, init_full_weights, local_weights, make_batch, sync_grads
from meshsim.validate.stack.moe_shard import MoeLayout
from meshsim.validate.stack.pipeline import StageRun, stage_params
from meshsim.validate.stack.reference import reference
from meshsim.validate.stack.shard import kv_replica_groups, shard


class Meshes:
    """Mesh (and id(group) -> name) per (tp, dp, pp, kv replica blocks), created on first use."""

    def __init__(self):
        self.cache: dict[tuple, tuple[Mesh, dict[int, str]]] = {}

    def get(self, d: ModelDims, moe: MoeLayout | None = None) -> tuple[Mesh, dict[int, str]]:
        kv_blocks = kv_replica_groups(d)
        experts = (moe.ep, moe.etp) if moe is not None else None
        key = (d.tp, d.dp, d.pp, tuple(map(tuple, kv_blocks)), experts)
        if key not in self.cache:
            self.cache[key] = build_mesh(d.tp, d.dp, kv_blocks, pp=d.pp, cpu=True, experts=experts)
        return self.cache[key]


def _compare(name: str, actual, expected, tol: tuple[float, float], rank: int) -> dict | None:
    """None when equal within tolerance, else {tensor, rank, max_abs_err, max_abs_ref}."""
    if actual is None:
        return {"tensor": name, "rank": rank, "max_abs_err": float("inf"), "max_abs_ref": 0.0,
                "detail": "no gradient"}
    try:
        torch.testing.assert_close(actual, expected, rtol=tol[0], atol=tol[1])
        return None
    except AssertionError as exc:
        err = (actual.double() - expected.double()).abs().max().item() if actual.shape == expected.shape \
            else float("inf")
        return {"tensor": name, "rank": rank, "max_abs_err": err,
                "max_abs_ref": expected.abs().max().item(), "detail": str(exc).splitlines()[0]}


BF16_RESOLUTION = 2.0**-8  # relative spacing of bf16 numbers (8 significand bits)


def _compare_scaled(name: str, actual, expected, bound: float, rank: int, zero_floor: float) -> dict | None:
    """|actual - expected| <= bound * max|expected| elementwise (numerics.SCALED_BOUND), in float64.
    A tensor that is zero in exact arithmetic (its float64 reference below 1e-9: e.g. the K bias's gradient,
    softmax being invariant to a per-row shift) gets the absolute bound `zero_floor` instead: rounding
    noise at the variant's gradient scale."""
    if actual is None:
        return _compare(name, actual, expected, (0.0, 0.0), rank)
    a, e = actual.double(), expected.double()
    if a.shape != e.shape:
        return _compare(name, actual, expected, (0.0, 0.0), rank)
    ref_max = e.abs().max().item()
    err = (a - e).abs().max().item()
    if err <= (bound * ref_max if ref_max > 1e-9 else zero_floor):
        return None
    return {"tensor": name, "rank": rank, "max_abs_err": err, "max_abs_ref": ref_max,
            "detail": f"max |err| {err:.3g} > {bound:g} x max |ref| {ref_max:.3g}"}


def _judge(checks: list[tuple], dtype: torch.dtype, tol) -> list[dict]:
    """Compare every (name, actual, expected): SCALED_BOUND for bf16, else assert_close with `tol`."""
    bound = SCALED_BOUND.get(str(dtype).removeprefix("torch."))
    if bound:
        scale = max((e.abs().max().item() for n, _, e in checks if n.endswith(".grad")), default=0.0)
        found = [_compare_scaled(n, a, e, bound, dist.get_rank(), 2 * BF16_RESOLUTION * scale)
                 for n, a, e in checks]
    else:
        found = [_compare(n, a, e, tol, dist.get_rank()) for n, a, e in checks]
    return [m for m in found if m]


def _reference(full: dict, tokens, labels, d: ModelDims, dtype: torch.dtype, moe: MoeLayout | None = None):
    """The single-process reference (float64 from the same weights under a scaled bound, e.g. bf16)."""
    scaled = SCALED_BOUND.get(str(dtype).removeprefix("torch."))
    return reference({n: t.double() for n, t in full.items()} if scaled else full, tokens, labels, d, moe)


def _setup(scenario: Scenario, meshes: Meshes, seed: int, dtype: torch.dtype):
    """(dims, MoE layout, mesh, group names, full weights, tokens, labels, reference) of one variant."""
    d, moe = ModelDims.from_scenario(scenario), MoeLayout.from_scenario(scenario)
    mesh, names = meshes.get(d, moe)
    full = init_full_weights(d, seed, dtype, moe)
    tokens, labels = make_batch(d, seed)
    return d, moe, mesh, names, full, tokens, labels, _reference(full, tokens, labels, d, dtype, moe)


def run_variant(v: dict, meshes: Meshes, seed: int, dtype: torch.dtype, tol) -> dict:
    scenario = Scenario.model_validate(v["scenario"])
    if scenario.parallel.pp > 1:
        return run_pipeline_variant(v, scenario, meshes, seed, dtype, tol)
    d, moe, mesh, names, full, tokens, labels, ref = _setup(scenario, meshes, seed, dtype)
    w = local_weights(full, d, mesh.tp_rank, moe, mesh.experts)
    cols = d.columns(mesh.dp_rank)
    plan = Plan(d, frozenset(v["faults"]), moe)
    with count_collectives(names) as calls:
        with comm_tag(phase="fwd"):
            loss, logits = forward(w, tokens[:, cols], labels[:, cols], plan, mesh)
        with comm_tag(phase="bwd"):
            loss.backward()
        sync_grads(w, plan, mesh, scenario.parallel.dp_bucket_mib)
    rows = d.vocab // d.tp
    checks = [("loss", loss.detach(), ref.token_losses[:, cols].mean()),
              ("logits", logits.detach(), ref.logits[:, cols, mesh.tp_rank * rows:(mesh.tp_rank + 1) * rows])]
    checks += [(f"{n}.grad", t.grad, shard(n, ref.grads[n], d, mesh.tp_rank, mesh.experts)) for n, t in w.items()]
    return {"variant": v["name"], "rank": dist.get_rank(), "checked": len(checks),
            "mismatches": _judge(checks, dtype, tol), "calls": [c.__dict__ for c in calls]}


def run_pipeline_variant(v: dict, scenario: Scenario, meshes: Meshes, seed: int, dtype: torch.dtype, tol) -> dict:
    """One pipeline stage's step (validate/stack/pipeline.py): every micro-batch's loss and logits on the
    last stage, and the gradient of every parameter the stage holds, against the reference."""
    d, moe, mesh, names, full, tokens, labels, ref = _setup(scenario, meshes, seed, dtype)
    chunks = pipeline_layout(scenario.parallel, d.layers)[mesh.stage]
    local = local_weights(full, d, mesh.tp_rank, moe, mesh.experts)
    w = {n: local[n] for n in stage_params(list(full), chunks, d.tied) if n in local}
    mine = slice(d.columns(mesh.dp_rank).start, d.columns(mesh.dp_rank, d.micro_batches - 1).stop)
    plan = Plan(d, frozenset(v["faults"]), moe)
    run = StageRun(w, plan, mesh, PipelineShape(**v["pipeline"]), chunks, tokens[:, mine], labels[:, mine])
    with count_collectives(names) as calls, count_p2p() as p2p:
        run.run()
        sync_grads(w, plan, mesh, scenario.parallel.dp_bucket_mib)
    rows = slice(mesh.tp_rank * (d.vocab // d.tp), (mesh.tp_rank + 1) * (d.vocab // d.tp))
    checks = []
    for mb, (loss, logits) in sorted(run.losses.items()):
        cols = d.columns(mesh.dp_rank, mb)
        checks += [(f"loss.mb{mb}", loss, ref.token_losses[:, cols].mean()),
                   (f"logits.mb{mb}", logits, ref.logits[:, cols, rows])]
    checks += [(f"{n}.grad", t.grad, shard(n, ref.grads[n], d, mesh.tp_rank, mesh.experts)) for n, t in w.items()]
    return {"variant": v["name"], "rank": dist.get_rank(), "stage": mesh.stage, "checked": len(checks),
            "mismatches": _judge(checks, dtype, tol), "calls": [c.__dict__ for c in calls],
            "p2p": [r.__dict__ for r in p2p]}


def run_variants(payload: dict) -> list[dict]:
    """Every variant of the payload on this rank; an exception is reported, not raised."""
    dtype = getattr(torch, payload["dtype"])
    tol = TOLERANCES[payload["dtype"]]
    meshes, out = Meshes(), []
    for v in payload["variants"]:
        try:
            out.append(run_variant(v, meshes, payload["seed"], dtype, tol))
        except Exception as exc:  # reported per variant; the other ranks hit the same error
            out.append({"variant": v["name"], "rank": dist.get_rank(), "checked": 0, "mismatches": [],
                        "calls": [], "error": f"{type(exc).__name__}: {exc}"})
    return out
