"""Schedule builder: op structure per layer, collective counts and volumes, FLOPs conservation, deps, DP."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.scenarios.schema import Scenario
from meshsim.sim.cost.memory import params_per_rank
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.dp_ops import bucket_bytes
from meshsim.sim.schedule.elementwise_ops import FUSED_SOFTMAX_MAX_SEQ
from meshsim.sim.schedule.ops import Attention, Collective, Gemm, Schedule
from meshsim.topologies.gpus import GPUS
from meshsim.topologies.model import Topology

GPT = dict(layers=2, hidden=256, heads=8, seq_len=128, vocab=1000, mlp="gelu", dropout=True)
LLAMA70B = dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, mlp="swiglu", seq_len=4096,
                vocab=32000, dropout=False)


def make_rs(model: dict, parallel: dict, *, dp: int = 1, gpu: str = "h100-sxm") -> ResolvedScenario:
    par = {"global_batch": parallel.get("micro_batch", 1) * dp, **parallel}
    s = Scenario.model_validate({"name": "t", "model": model, "topology": {"preset": "dgx-h100"},
                                 "parallel": par})
    tp = s.parallel.tp
    topo = Topology("trivial", gpu, 1, tp * dp, (), ())
    mbs = s.parallel.global_batch // (s.parallel.micro_batch * dp)
    return ResolvedScenario(s, "test", GPUS[gpu], topo, tp * dp, tp, dp, mbs)


def layer_ops(sched: Schedule, layer: int = 1, mb: int = 0, phases=("fwd", "bwd", "recompute")):
    return [op for op in sched.ops if op.layer == layer and op.micro_batch == mb and op.phase in phases]


def colls(ops, phase=None):
    return [op.work for op in ops if isinstance(op.work, Collective) and (phase is None or op.phase == phase)]


def key(op) -> str:
    return op.name.rsplit(".", 1)[1]


# ----- structure ------------------------------------------------------------------------------------
def test_tp_layer_forward_is_the_megatron_sequence():
    """Golden op list of one TP layer's forward, written from the Megatron layer description."""
    sched = build_schedule(make_rs(dict(GPT, attention="unfused"), dict(tp=2, micro_batch=2)))
    names = [op.name for op in layer_ops(sched, 0, 0, ("fwd",))]
    assert names == [f"L0.mb0.fwd.{k}" for k in (
        "ln1", "qkv", "qk", "softmax", "attn_dropout", "pv", "proj", "attn_out", "attn_res",
        "ln2", "fc1", "act", "fc2", "mlp_out", "mlp_res")]


def test_unfused_softmax_is_one_fused_kernel_up_to_its_length_limit():
    """Megatron's FusedScaleMaskSoftmax: scale, mask and softmax in one kernel (2 bytes read, 2 written per
    score); beyond FUSED_SOFTMAX_MAX_SEQ torch's scale+mask and softmax are two kernels."""
    def core(seq):
        sched = build_schedule(make_rs(dict(GPT, attention="unfused", seq_len=seq), dict(tp=2)))
        return {key(op): op.work for op in layer_ops(sched, 0, 0, ("fwd", "bwd"))
                if "softmax" in key(op) or "scale_mask" in key(op)}
    short = core(128)
    assert set(short) == {"softmax"}
    scores_n = 1 * (8 // 2) * 128 * 128  # b x heads/t x s x s
    fwd = [op.work for op in layer_ops(build_schedule(make_rs(dict(GPT, attention="unfused"), dict(tp=2))), 0, 0,
                                        ("fwd",)) if key(op) == "softmax"][0]
    assert (fwd.kernel, fwd.bytes_read, fwd.bytes_written) == ("scale_mask_softmax", 2 * scores_n, 2 * scores_n)
    long = core(FUSED_SOFTMAX_MAX_SEQ * 2)
    assert set(long) == {"softmax", "scale_mask"}


def test_tp_collectives_per_layer():
    sched = build_schedule(make_rs(GPT, dict(tp=4, micro_batch=2)))
    ops = layer_ops(sched)
    assert [(c.op, c.boundary) for c in colls(ops, "fwd")] == [("all_reduce", "g")] * 2
    assert [(c.op, c.boundary) for c in colls(ops, "bwd")] == [("all_reduce", "f")] * 2
    assert all(c.nbytes == 128 * 2 * 256 * 2 for c in colls(ops))  # s b h x 2 bytes


def test_sp_collectives_per_layer_and_layernorm_allreduce():
    rs = make_rs(GPT, dict(tp=4, sp=True, micro_batch=2))
    sched = build_schedule(rs)
    ops = layer_ops(sched)
    fwd = Counter(c.op for c in colls(ops, "fwd"))
    bwd = Counter((c.op, c.boundary) for c in colls(ops, "bwd"))
    assert fwd == {"all_gather": 2, "reduce_scatter": 2}
    assert bwd == {("all_gather", "sp_scatter"): 2, ("reduce_scatter", "sp_gather"): 2,
                   ("all_gather", "sp_regather"): 2}
    # one coalesced all-reduce per step of the SP-partial grads: per layer 2 LayerNorms (weight + bias,
    # 2h each) + 2 row-parallel biases (h each), plus the final LayerNorm (2h); fp32
    h, layers = 256, 2
    ln = [op for op in sched.ops if op.name == "opt.ln_grad"]
    assert len(ln) == 1 and ln[0].work.op == "all_reduce"
    assert ln[0].work.nbytes == (layers * (2 * 2 * h + 2 * h) + 2 * h) * 4


def test_tp_and_sp_move_the_same_forward_bytes():
    """Ring convention: all-reduce of S moves 2(t-1)/t S per rank; all-gather / reduce-scatter of total S
    move (t-1)/t S. SP replaces each all-reduce by a reduce-scatter + all-gather: equal volume."""
    t = 4

    def moved(c: Collective) -> float:
        return (2 if c.op == "all_reduce" else 1) * (t - 1) / t * c.nbytes

    tp = colls(layer_ops(build_schedule(make_rs(GPT, dict(tp=t, micro_batch=2)))), "fwd")
    sp = colls(layer_ops(build_schedule(make_rs(GPT, dict(tp=t, sp=True, micro_batch=2)))), "fwd")
    assert sum(map(moved, tp)) == pytest.approx(sum(map(moved, sp)))
    assert sum(map(moved, tp)) == pytest.approx(2 * 2 * (t - 1) / t * 128 * 2 * 256 * 2)


def test_sp_wgrad_waits_for_the_regather_not_the_dgrad():
    sched = build_schedule(make_rs(GPT, dict(tp=2, sp=True)))
    by_name = {op.name: op for op in sched.ops}
    for col, entry, grad_out in (("qkv", "attn_in", "attn"), ("fc1", "mlp_in", "act")):
        w = by_name[f"L0.mb0.bwd.{col}_wgrad"]
        # wgrad = X^T dY: the re-gathered input X and the output gradient dY; not dgrad nor its collective
        assert set(w.deps) == {by_name[f"L0.mb0.bwd.{entry}_regather"].id, by_name[f"L0.mb0.bwd.{grad_out}"].id}
        assert by_name[f"L0.mb0.bwd.{entry}"].deps == (by_name[f"L0.mb0.bwd.{col}_dgrad"].id,)


def test_ids_are_positions_and_deps_point_backwards():
    sched = build_schedule(make_rs(GPT, dict(tp=2, sp=True, micro_batch=1, global_batch=4,
                                             recompute="full", tp_comm_overlap=True, distributed_optimizer=True),
                                   dp=2))
    for i, op in enumerate(sched.ops):
        assert op.id == i
        assert all(0 <= d < i for d in op.deps), op.name
        want = "compute" if not isinstance(op.work, Collective) else f"{op.work.group}_comm"
        assert op.stream == op.category == want
        assert re.fullmatch(r"(L\d+|embed|head)\.mb\d+\.(fwd|bwd|recompute)\.\w+|dp\.bucket\d+\.\w+|opt\.\w+",
                            op.name), op.name
    assert len({op.name for op in sched.ops}) == len(sched.ops)


def test_cross_entropy_all_reduces():
    sched = build_schedule(make_rs(GPT, dict(tp=2, micro_batch=2)))
    xent = [op.work for op in sched.ops if op.name.startswith("head.mb0.fwd.xent") and
            isinstance(op.work, Collective)]
    assert sorted(c.boundary for c in xent) == ["xent_max", "xent_pred", "xent_sum"]
    assert all(c.op == "all_reduce" and c.nbytes == 2 * 128 * 4 for c in xent)
    logits = next(op.work for op in sched.ops if op.name == "head.mb0.fwd.logits")
    assert logits == Gemm(2 * 128, 1024 // 2, 256)  # vocab 1000 padded to 128 x tp = 1024


# ----- recompute ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("attention, keys", [("flash", {"attn"}),
                                             ("unfused", {"qk", "softmax", "attn_dropout", "pv"})])
def test_selective_recompute_reruns_the_attention_core(attention, keys):
    sched = build_schedule(make_rs(dict(GPT, attention=attention), dict(tp=2, recompute="selective")))
    rec = [op for op in layer_ops(sched) if op.phase == "recompute"]
    assert {key(op) for op in rec} == keys and len(rec) == len(keys)


def test_full_recompute_reruns_the_whole_forward():
    sched = build_schedule(make_rs(GPT, dict(tp=2, sp=True, recompute="full")))
    ops = layer_ops(sched)
    fwd = [(key(op), op.work) for op in ops if op.phase == "fwd"]
    rec = [(key(op), op.work) for op in ops if op.phase == "recompute"]
    assert rec == fwd
    first_bwd = min(op.id for op in ops if op.phase == "bwd")
    assert all(op.id < first_bwd for op in ops if op.phase == "recompute")


# ----- FLOPs conservation ---------------------------------------------------------------------------------
def _layer_flops(sched: Schedule, kind) -> float:
    return sum(op.flops for op in layer_ops(sched, 0) if isinstance(op.work, kind))


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_shards_sum_to_the_unsharded_layer(attention):
    model = dict(GPT, attention=attention)
    full = build_schedule(make_rs(model, dict(tp=1)))
    for t in (2, 4, 8):
        shard = build_schedule(make_rs(model, dict(tp=t)))
        assert t * _layer_flops(shard, Gemm) == pytest.approx(_layer_flops(full, Gemm), rel=1e-12)
        assert t * _layer_flops(shard, Attention) == pytest.approx(_layer_flops(full, Attention), rel=1e-12)


def test_gqa_replicated_kv_is_the_only_extra_work():
    """kv_heads = 2 < t = 8: each rank computes one KV head, so t ranks compute 8 where the model has 2.
    Extra GEMM FLOPs = (t - kv) extra heads x K and V x (fwd + dgrad + wgrad) x 2 T h d."""
    model = dict(GPT, heads=8, kv_heads=2, mlp="swiglu")
    full = build_schedule(make_rs(model, dict(tp=1, micro_batch=2)))
    t, tokens, h, d = 8, 128 * 2, 256, 256 // 8
    shard = build_schedule(make_rs(model, dict(tp=t, micro_batch=2)))
    extra = (t * 1 - 2) * 2 * 3 * 2 * tokens * h * d
    assert t * _layer_flops(shard, Gemm) - _layer_flops(full, Gemm) == pytest.approx(extra, rel=1e-12)


# ----- DP, optimizer, gradients -------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_gradient_producers_cover_every_parameter(tied):
    rs = make_rs(dict(GPT, tied_embeddings=tied), dict(tp=2, sp=True), dp=2)
    assert build_schedule(rs).meta["params_per_rank"] == params_per_rank(rs)


def test_default_bucket_is_megatron_cores_max_of_40m_and_1m_per_dp_rank():
    """Unset dp_bucket_mib: max(40M, 1M x dp) parameters of 4-byte gradients; a stated size wins."""
    assert bucket_bytes(None, 8) == 40_000_000 * 4
    assert bucket_bytes(None, 48) == 48_000_000 * 4  # larger DP: larger buckets
    assert bucket_bytes(0.25, 48) == 256 * 1024


@pytest.mark.parametrize("distopt", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
def test_dp_buckets(distopt, overlap):
    rs = make_rs(GPT, dict(tp=2, micro_batch=1, global_batch=4, distributed_optimizer=distopt,
                           dp_overlap=overlap, dp_bucket_mib=0.25), dp=2)
    sched = build_schedule(rs)
    params = params_per_rank(rs)
    reduce_op = "reduce_scatter" if distopt else "all_reduce"
    red = [op for op in sched.ops if op.name.startswith("dp.") and op.work.op == reduce_op]
    assert len(red) > 1 and all(op.stream == "dp_comm" and op.work.group == "dp" for op in red)
    assert sum(op.work.nbytes for op in red) == params * 4
    assert all(op.work.nbytes >= 0.25 * 2**20 for op in red[:-1])
    last_mb = [op for op in sched.ops if op.micro_batch == 1 and op.phase == "bwd"]
    end = max(op.id for op in last_mb)
    for op in red:
        if overlap:
            assert all(sched.ops[d].micro_batch == 1 and sched.ops[d].phase == "bwd" for d in op.deps)
        else:
            assert op.deps == (end,)
    if overlap:
        assert red[0].deps[-1] < end  # the first bucket is issued during backward
    step = next(op for op in sched.ops if op.name == "opt.step")
    assert step.work.params == (-(-params // 2) if distopt else params)
    assert {op.id for op in red} <= set(step.deps)
    gathers = [op for op in sched.ops if op.name.startswith("dp.") and op.work.op == "all_gather"]
    assert len(gathers) == (len(red) if distopt else 0)
    assert sum(op.work.nbytes for op in gathers) == (params * 2 if distopt else 0)


def test_no_dp_ops_without_dp():
    sched = build_schedule(make_rs(GPT, dict(tp=2)))
    assert not [op for op in sched.ops if op.name.startswith("dp.")]
    assert sched.ops[-1].name == "opt.step"


# ----- tp_comm_overlap -------------------------------------------------------------------------------------
def test_overlap_is_te_userbuffers_ring_exchange_and_pipeline():
    """tp_comm_overlap as Transformer Engine's default userbuffers configuration: the gather before qkv is a
    ring exchange of tp steps (GEMM 0 on the rank's own shard at once, tp - 1 chained one-shard shifts,
    GEMM i on the shard shift i - 1 brought); the reduce-scatter after proj a pipeline of 4 GEMM chunks, each
    chunk's collective a userbuffers quarter; the pipeline and bulk GEMMs leave 16 SMs to the comm kernel."""
    from meshsim.sim.schedule.shapes import UB_COMM_SMS, UB_PIPELINE_SPLITS, USERBUFFERS
    t = 8
    sched = build_schedule(make_rs(GPT, dict(tp=t, sp=True, micro_batch=2, tp_comm_overlap=True)))
    ops = {f"{op.phase}.{key(op)}": op for op in layer_ops(sched, 0, 0, ("fwd", "bwd"))}
    assert sched.meta["chunks"] == t
    gemms = [ops[f"fwd.qkv_c{i}"] for i in range(t)]
    shifts = [ops[f"fwd.attn_in_c{i}"] for i in range(t - 1)]
    assert f"fwd.attn_in_c{t - 1}" not in ops
    gathered = 128 * 2 * 256 * 2
    assert all(c.work.op == "send_recv" and c.work.nbytes == gathered // t for c in shifts)
    assert sum(g.work.m for g in gemms) == 128 * 2
    assert not set(gemms[0].deps) & {c.id for c in shifts}  # the rank's own shard: no wait
    for i in range(1, t):
        assert gemms[i].deps == (shifts[i - 1].id,)
        if i < t - 1:
            assert shifts[i].deps == (shifts[i - 1].id,)
    rs = [ops[f"fwd.attn_out_c{i}"] for i in range(UB_PIPELINE_SPLITS)]
    assert all(r.work.kernel == USERBUFFERS and r.deps == (ops[f"fwd.proj_c{i}"].id,) for i, r in enumerate(rs))
    assert sum(r.work.nbytes for r in rs) == gathered
    assert set(ops["fwd.attn_res"].deps) >= {r.id for r in rs}
    assert {ops[f"fwd.proj_c{i}"].work.comm_sms for i in range(UB_PIPELINE_SPLITS)} == {UB_COMM_SMS}
    assert ops["bwd.qkv_dgrad"].work.comm_sms == ops["bwd.qkv_wgrad"].work.comm_sms == UB_COMM_SMS
    assert gemms[0].work.comm_sms == 0 and ops["bwd.proj_wgrad"].work.comm_sms == 0
    plain = build_schedule(make_rs(GPT, dict(tp=t, sp=True, micro_batch=2)))
    assert {op.work.comm_sms for op in plain.ops if isinstance(op.work, Gemm)} == {0}


@pytest.mark.parametrize("kv_heads, tp, bias", [(2, 8, True), (4, 8, False), (8, 8, False), (8, 4, True)])
def test_replicated_kv_heads_sum_their_gradients_over_the_kv_group(kv_heads, tp, bias):
    """kv_heads < tp: each KV head lives on tp/kv_heads ranks that each back-propagate only their own query
    heads, so one coalesced all-reduce over that KV group sums the K and V gradients
    (layers x 2 x head_dim x (hidden + bias) fp32 values); kv_heads >= tp needs none."""
    model = dict(GPT, heads=8, kv_heads=kv_heads, mlp="gelu" if bias else "swiglu")
    rs = make_rs(model, dict(tp=tp))
    sched = build_schedule(rs)
    kv = [op for op in sched.ops if isinstance(op.work, Collective) and op.work.group == "kv"]
    if kv_heads >= tp:
        assert kv == [] and sched.kv_replicas == 1
        return
    head_dim = GPT["hidden"] // 8
    assert sched.kv_replicas == tp // kv_heads
    assert [(op.name, op.work.op, op.stream) for op in kv] == [("opt.kv_grad", "all_reduce", "tp_comm")]
    assert kv[0].work.nbytes == GPT["layers"] * 2 * head_dim * (GPT["hidden"] + int(bias)) * 4
    assert rs.kv_group(5) == tuple(range(5 // (tp // kv_heads) * (tp // kv_heads),
                                         5 // (tp // kv_heads) * (tp // kv_heads) + tp // kv_heads))
    opt = next(op for op in sched.ops if op.name == "opt.step")
    assert kv[0].id in opt.deps


def test_overlapped_param_gathers_start_the_step_and_gate_their_layers_first_forward_op():
    """Distributed optimizer + dp_overlap (Megatron --overlap-param-gather), steady state: the previous
    step's parameter all-gathers open the step in forward order, and the first forward op of micro-batch 0
    that uses a bucket's parameters waits for that bucket's gather; none trails the optimizer."""
    rs = make_rs(GPT, dict(tp=2, micro_batch=1, global_batch=4, distributed_optimizer=True, dp_overlap=True,
                           dp_bucket_mib=0.25), dp=2)
    sched = build_schedule(rs)
    assert all(op.id == i for i, op in enumerate(sched.ops))
    gathers = [op for op in sched.ops if op.name.startswith("dp.") and op.work.op == "all_gather"]
    n = len(gathers)
    assert n > 1 and [op.id for op in gathers] == list(range(n))  # they open the step
    indices = [int(op.name.split(".")[1].removeprefix("bucket")) for op in gathers]
    assert indices == sorted(indices, reverse=True)  # forward order = reverse of the backward buckets
    assert sum(op.work.nbytes for op in gathers) == params_per_rank(rs) * 2
    step = next(op for op in sched.ops if op.name == "opt.step")
    assert not [op for op in sched.ops if op.id > step.id and op.work.__class__ is Collective
                and op.work.op == "all_gather" and op.work.group == "dp"]
    gated: dict[int, object] = {}  # gather id -> the first op it gates
    for op in sched.ops:
        for d in op.deps:
            if d < n:
                gated.setdefault(d, op)
    assert set(gated) == set(range(n))  # every gather gates something
    for op in gated.values():
        assert op.phase == "fwd" and op.micro_batch == 0
    # the embedding is used first, so the first gather gates the embedding lookup
    assert gated[0].name.startswith("embed.mb0.fwd")


def test_param_gather_overlap_follows_dp_overlap_unless_set():
    """parallel.overlap_param_gather false: the gathers trail the optimizer (exposed) although the gradient
    reduce-scatters still overlap backward; unset, it follows dp_overlap."""
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.schedule.builder import build_schedule

    scenario, source = load_scenario("llama2-70b-h100-tp8")
    short = with_overrides(scenario, {"model.layers": 2, "parallel.global_batch": 16}, source)

    def gathers(overrides):
        s = build_schedule(resolve(with_overrides(short, overrides, source), source))
        step = next(op.id for op in s.ops if op.name == "opt.step")
        return [op.id > step for op in s.ops if op.name.endswith(".all_gather") and op.name.startswith("dp.")]

    assert gathers({}) and not any(gathers({}))  # default: every gather opens the step, before the optimizer
    assert all(gathers({"parallel.overlap_param_gather": False}))  # all trail the optimizer
    assert all(gathers({"parallel.dp_overlap": False}))  # follows dp_overlap when unset
    rs = resolve(with_overrides(short, {"parallel.overlap_param_gather": False}, source), source)
    reduce_deps = [op.deps for op in build_schedule(rs).ops if op.name.endswith(".reduce_scatter")]
    assert len(reduce_deps) > 1 and len(set(reduce_deps)) == len(reduce_deps)  # each waits for its own producers


def test_overlapping_the_param_gather_hides_dp_time_in_the_default_scenario():
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.results.simulate import simulate

    scenario, source = load_scenario("llama2-70b-h100-tp8")
    short = with_overrides(scenario, {"model.layers": 8, "parallel.global_batch": 16}, source)
    on = simulate(resolve(short, source)).to_dict()
    off = simulate(resolve(with_overrides(short, {"parallel.dp_overlap": False}, source), source)).to_dict()
    assert on["breakdown_s"]["dp_comm_busy"] == pytest.approx(off["breakdown_s"]["dp_comm_busy"], rel=1e-9)  # same work
    assert on["step_time_s"] < off["step_time_s"]
    assert on["breakdown_s"]["exposed_comm"] < off["breakdown_s"]["exposed_comm"]


def test_block_input_gradient_is_the_norm_backward_plus_the_residual_gradient():
    """LayerNorm backward reads dy, x (+ fp32 stats) and writes dx; autograd then adds the residual path's
    gradient in its own kernel (read 2, write 1 activation), which is what the layer below waits for."""
    sched = build_schedule(make_rs(GPT, dict(tp=2, micro_batch=2)))
    ops = {key(op): op for op in layer_ops(sched, 0, 0, ("bwd",))}
    n = 128 * 2 * 256 * 2  # s b h x 2 bytes (no SP: every token on each rank)
    ln, add = ops["ln1"], ops["ln1_grad_add"]
    assert (ln.work.bytes_read, ln.work.bytes_written) == (2 * n + 8 * 128 * 2, n)
    assert (add.work.kernel, add.work.bytes_read, add.work.bytes_written) == ("residual_grad_add", 2 * n, n)
    assert ln.id in add.deps and ops["attn_res"].id not in ln.deps  # LN backward needs only its dy
    gin = ops["mlp_res"].deps  # the gradient of the layer output (the dropout backward starts from it)
    assert ops["ln2_grad_add"].deps == (ops["ln2"].id, *gin)  # ... joins the norm's dx at the add
