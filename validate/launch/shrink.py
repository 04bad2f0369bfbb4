"""Shrink a scenario so the real TP/SP step runs on a CPU in seconds, keeping its parallel structure.

The rule (docs/validate.md, "Shrink rule"), for `nproc` processes and a `ShrinkRule` r:
- layout: pp' = gcd(pp, nproc), tp' = gcd(tp, nproc / pp'), dp' = nproc / (tp' pp'), gpus = nproc (every rule:
  the timing executor runs the pipeline's P2P too);
  with pp' > 1 the pipeline fields follow shrink_pipeline (layers a multiple of pp' vp', m' = 2 pp');
- heads' = 2 tp' (two query heads per rank); KV heads keep the scenario's relation to tp:
  multi-head -> kv' = heads'; kv_heads >= tp -> kv' = tp' (one KV head per rank);
  kv_heads < tp -> kv' = max(1, tp' kv / tp) (each KV head replicated on the same fraction of ranks);
- hidden' = heads' x r.head_dim, ffn' = 2 hidden', seq' = r.seq_per_rank x tp', vocab' = r.vocab_per_rank x tp'
  (unpadded: vocab_divisible_by 1), layers' = r.layers, micro_batch' = 2, global_batch' = micro_batch' x dp'
  (one micro-batch per step; pipelines: m' micro-batches);
- dropout off (numerics compare deterministic math), tp_comm_overlap, distributed_optimizer and fsdp off
  (the real model issues none of them), except that the timing rules keep fsdp (with the distributed
  optimizer it needs) when the shrunk layout has no pipeline: the timing run executes the schedule's own
  ops, FSDP's per-block all-gathers and reduce-scatters among them; they keep distributed-optimizer
  instances too, as gcd(instances, dp', edp'), with the distributed optimizer (the reduce-scatters inside an
  instance and the all-reduces across them run for real; the numerics rule drops them: a sum is a sum);
  mlp, GQA-ness, sp, recompute, dtype and the topology are kept
  (topology.nodes grows when the topology has fewer than nproc GPUs); model.head_dim is dropped (hidden'
  / heads' = r.head_dim already); so are multi-latent attention (standard attention runs instead),
  multi-token prediction, parallel.recompute_modules (the variants set recompute) and a pipeline_layout;
  model.activation_clamp is dropped (the real stack does not clamp: it changes which kernels run, not
  what the layout computes);
  model.qk_norm is kept (validate runs it) unless the model has MLA (where it meant MLA's latent norms);
- MoE (model.moe): etp' = gcd(etp, S), ep' = gcd(ep, S / etp') on the S = nproc / pp' ranks of a stage;
  `shrink_moe`: two local experts per ep rank (at least 4 experts), top-2, expert and shared FFN =
  hidden', at most one leading dense layer, group-limited routing (when set) over 2 groups picking 1;
  dropless (capacity factor, padding dropped) with imbalance 1.0, since validate routes for real; the
  alltoall dispatcher (validate runs it; allgather and flex are simulated but not run), no EP overlap;
- context parallelism is dropped (cp' = 1): the whole-model run has no CP attention; TE's ring and
  all-to-all attention run for real in validate/numerics/cp_check.py (task "cp_numerics").

Every size is a multiple of tp', so the shrunk scenario passes scenarios/checks.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from meshsim.scenarios.load import build_scenario_topology
from meshsim.scenarios.schema import MoeConfig, Scenario
from meshsim.sim.core.errors import UserError


@dataclass(frozen=True)
class ShrinkRule:
    """Per-rank sizes of a shrunk model. NUMERICS is tiny (checks run in milliseconds); TIMING makes each
    op take tens of microseconds to milliseconds on a CPU so timing is above Python's per-op overhead."""

    head_dim: int
    seq_per_rank: int
    vocab_per_rank: int
    layers: int = 2
    micro_batch: int = 2
    # the timing run executes the schedule's ops (validate/timing/executor.py), FSDP's per-block gathers and
    # reduce-scatters included; the numerics run's real model has no FSDP
    keeps_fsdp: bool = False
    keeps_instances: bool = False  # distributed-optimizer instances, likewise (the timing run's DP ops)


# vocab_per_rank = 128: Megatron pads the vocabulary to a multiple of 128 tp (sim/schedule/shapes.py, padded_vocab), so the
# real model and the schedule then hold the same table.
NUMERICS = ShrinkRule(head_dim=8, seq_per_rank=8, vocab_per_rank=128)
TIMING = ShrinkRule(head_dim=64, seq_per_rank=128, vocab_per_rank=128, keeps_fsdp=True,
                    keeps_instances=True)
# On GPUs (NCCL): sizes where kernels are past launch-bound (not exercised here: no GPU on this machine)
GPU_TIMING = ShrinkRule(head_dim=128, seq_per_rank=1024, vocab_per_rank=4096, keeps_fsdp=True,
                        keeps_instances=True)


def timing_rule(backend: str) -> ShrinkRule:
    return GPU_TIMING if backend == "nccl" else TIMING


def shrink_layout(tp: int, nproc: int) -> tuple[int, int]:
    """(tp', dp') for nproc processes: tp' = gcd(tp, nproc), dp' = nproc / tp'."""
    if nproc < 1:
        raise UserError("--nproc", nproc, "use --nproc 1 or more")
    tp_new = math.gcd(tp, nproc)
    return tp_new, nproc // tp_new


def shrink_heads(heads: int, kv_heads: int, tp: int, tp_new: int) -> tuple[int, int]:
    """(heads', kv_heads') keeping multi-head / GQA with kv >= tp / GQA with kv < tp (see module doc)."""
    heads_new = 2 * tp_new
    if kv_heads == heads:
        return heads_new, heads_new
    if kv_heads >= tp:
        return heads_new, tp_new
    replicas = tp // kv_heads  # ranks sharing one KV head in the original layout
    kv_new = max(1, tp_new // replicas) if tp_new % replicas == 0 else 1
    return heads_new, kv_new


def _nodes_for(scenario: Scenario, source: str, nproc: int) -> int:
    """topology.nodes, raised when the topology holds fewer than nproc GPUs."""
    try:
        topo = build_scenario_topology(scenario, source)
    except (ImportError, UserError):
        return scenario.topology.nodes
    if topo.num_gpus >= nproc:
        return scenario.topology.nodes
    return math.ceil(nproc / topo.gpus_per_node)


def shrink_pipeline(pp: int, vp: int, overlap: bool, nproc: int, layers: int) -> dict:
    """Pipeline fields of the shrunk scenario: pp' = gcd(pp, nproc); vp kept when pp' > 1; layers' the
    rule's count rounded up to a multiple of pp' vp' (one or more per virtual stage); m' = 2 pp'
    micro-batches (past the warm-up, a multiple of N = pp'); interleaving on two stages without P2P
    overlap (Megatron's rule); uneven and accounted splits and a pipeline_layout dropped."""
    pp_new = math.gcd(pp, nproc)
    vp_new = vp if pp_new > 1 else 1
    chunks = pp_new * vp_new
    return dict(pp=pp_new, vp=vp_new, layers=-(-layers // chunks) * chunks, micro_batches=2 * pp_new if pp_new > 1 else 1,
                p2p_overlap=overlap and not (vp_new > 1 and pp_new <= 2), microbatch_group_size=None,
                first_stage_layers=None, last_stage_layers=None, account_for_embedding_in_split=False,
                account_for_loss_in_split=False, pipeline_layout=None)


MIN_EXPERTS = 4  # top-2 among at least 4 experts, 2 per group under group-limited routing
SHRUNK_TOP_K = 2


def moe_experts(ep: int) -> int:
    """Experts of a shrunk MoE model on ep expert-parallel ranks: two local experts each, at least 4."""
    return max(MIN_EXPERTS, 2 * ep)


def shrink_moe(moe: MoeConfig, ep: int, hidden: int) -> MoeConfig:
    """The shrunk model.moe (module docstring)."""
    grouped = moe.router_groups is not None
    return moe.model_copy(update=dict(
        experts=moe_experts(ep), top_k=SHRUNK_TOP_K, ffn_hidden=hidden,
        shared_ffn_hidden=hidden if moe.shared_ffn_hidden else None, dense_layers=min(moe.dense_layers, 1),
        every=min(moe.every, 2), router_groups=2 if grouped else None, router_group_topk=1 if grouped else None,
        capacity_factor=None, pad_to_capacity=False, imbalance=1.0))


def _expert_fields(m, p, stage: int, hidden: int) -> tuple[dict, dict]:
    """(model, parallel) updates of an MoE scenario (module docstring); none for a dense one."""
    if m.moe is None:
        return {}, {}
    etp = math.gcd(p.etp, stage)
    ep = math.gcd(p.ep, stage // etp)
    return dict(moe=shrink_moe(m.moe, ep, hidden)), dict(
        ep=ep, etp=etp, moe_dispatcher="alltoall", moe_ep_overlap=False, delay_wgrad_compute=False)


def _instances(p, rule: ShrinkRule, tp: int, dp: int, moe_parallel: dict) -> int:
    """The shrunk layout's distributed-optimizer instances: gcd(instances, dp', edp') under a timing rule
    (the experts' edp' = tp' dp' / (etp' ep') must split too), 1 otherwise (module docstring)."""
    if not rule.keeps_instances or p.dist_opt_instances == 1:
        return 1
    n = math.gcd(p.dist_opt_instances, dp)
    if moe_parallel:
        n = math.gcd(n, tp * dp // (moe_parallel["etp"] * moe_parallel["ep"]))
    return n


def shrink(scenario: Scenario, nproc: int, rule: ShrinkRule = NUMERICS, source: str = "") -> Scenario:
    """The shrunk scenario for `nproc` processes (module docstring)."""
    m, p = scenario.model, scenario.parallel
    pipe = shrink_pipeline(p.pp, p.vp, p.p2p_overlap, nproc, rule.layers)
    layers, micro_batches = pipe.pop("layers"), pipe.pop("micro_batches")
    tp, dp = shrink_layout(p.tp, nproc // pipe["pp"])
    heads, kv = shrink_heads(m.heads, m.num_kv_heads, p.tp, tp)
    hidden = heads * rule.head_dim
    moe_model, moe_parallel = _expert_fields(m, p, nproc // pipe["pp"], hidden)
    fsdp = rule.keeps_fsdp and p.fsdp and pipe["pp"] == 1  # FSDP needs the distributed optimizer (rule 17)
    instances = _instances(p, rule, tp, dp, moe_parallel)
    model = m.model_copy(update=dict(
        layers=layers, hidden=hidden, heads=heads, kv_heads=None if kv == heads else kv, head_dim=None,
        ffn_hidden=2 * hidden, seq_len=rule.seq_per_rank * tp, vocab=rule.vocab_per_rank * tp, dropout=False,
        vocab_divisible_by=1,  # no padding: the real stack's vocabulary is exactly vocab_per_rank x tp
        # the real stack runs no MTP depth and standard attention; with MLA, qk_norm meant its latent norms
        mtp_layers=0, mla=None, qk_norm=m.qk_norm and m.mla is None, activation_clamp=None, **moe_model))
    parallel = p.model_copy(update=dict(
        tp=tp, dp=dp, gpus=nproc, sp=p.sp and tp > 1, micro_batch=rule.micro_batch, recompute_modules=None,
        global_batch=rule.micro_batch * dp * micro_batches, tp_comm_overlap=False,
        distributed_optimizer=fsdp or instances > 1, fsdp=fsdp, dist_opt_instances=instances, cp=1,
        cp_comm="p2p", hierarchical_cp=None, **pipe, **moe_parallel))
    topology = scenario.topology.model_copy(update=dict(nodes=_nodes_for(scenario, source, nproc)))
    return scenario.model_copy(update=dict(
        name=f"{scenario.name}-shrunk{nproc}", model=model, parallel=parallel, topology=topology, sweep=None))


def with_changes(scenario: Scenario, **changes: object) -> Scenario:
    """A copy with dotted-free section updates, e.g. with_changes(s, sp=True, mlp="swiglu", kv_heads=1,
    recompute="full", tp=2, dp=2). Keys are looked up in model, then parallel."""
    model = {k: v for k, v in changes.items() if k in type(scenario.model).model_fields}
    parallel = {k: v for k, v in changes.items() if k in type(scenario.parallel).model_fields}
    unknown = set(changes) - set(model) - set(parallel)
    if unknown:
        raise UserError("variant", sorted(unknown), "use model or parallel field names")
    return scenario.model_copy(update=dict(model=scenario.model.model_copy(update=model),
                                           parallel=scenario.parallel.model_copy(update=parallel)))


def without_profile(scenario: Scenario) -> Scenario:
    """The scenario with hardware.profile cleared (calibration writes the profile; it need not exist)."""
    return scenario.model_copy(update=dict(hardware=scenario.hardware.model_copy(update=dict(profile=None))))


def with_profile(scenario: Scenario, path: str) -> Scenario:
    """The scenario costed with the profile at `path` (absolute, so the scenario's source dir is moot)."""
    hardware = scenario.hardware.model_copy(update=dict(profile=str(Path(path).resolve())))
    return scenario.model_copy(update=dict(hardware=hardware))
