"""validate/ pieces that need no second process: shrink rule, sharding, duality-generated Functions,
cross-entropy, the tp=1 model against the reference, op-count bookkeeping, reductions, executor kernels."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from meshsim.scenarios.load import load_scenario, resolve  # noqa: E402
from meshsim.sim.core.errors import UserError  # noqa: E402
from meshsim.sim.schedule.duality import DUALITY  # noqa: E402
from meshsim.sim.schedule.ops import Attention, Collective, Gemm  # noqa: E402
from meshsim.sim.schedule.shapes import ModelDims  # noqa: E402
from meshsim.validate.calibrate import calibration as calibrate  # noqa: E402
from meshsim.validate.calibrate import sampling  # noqa: E402
from meshsim.validate.crosscheck import crosscheck  # noqa: E402
from meshsim.validate.launch.shrink import NUMERICS, TIMING, shrink, shrink_heads, shrink_layout  # noqa: E402
from meshsim.validate.numerics import opcount  # noqa: E402
from meshsim.validate.numerics.check import make_variant  # noqa: E402
from meshsim.validate.stack.comm import BOUNDARY_FUNCTIONS, comm_tag  # noqa: E402
from meshsim.validate.stack.layers import Mesh, Plan  # noqa: E402
from meshsim.validate.stack.model import dp_buckets, forward, init_full_weights, local_weights, make_batch  # noqa: E402
from meshsim.validate.stack.reference import reference  # noqa: E402
from meshsim.validate.stack.shard import kv_heads, kv_replica_groups, q_heads, shard  # noqa: E402
from meshsim.validate.stack.xent import VocabParallelCrossEntropy  # noqa: E402
from meshsim.validate.timing import measured  # noqa: E402
from meshsim.validate.timing.executor import Device, make_runner  # noqa: E402


def test_shrink_layout_and_heads_follow_the_rule():
    assert shrink_layout(8, 4) == (4, 1)
    assert shrink_layout(2, 4) == (2, 2)
    assert shrink_layout(8, 6) == (2, 3)
    assert shrink_heads(64, 64, 8, 4) == (8, 8)  # MHA stays MHA
    assert shrink_heads(64, 8, 8, 4) == (8, 4)  # kv >= tp: one KV head per rank
    assert shrink_heads(64, 4, 8, 4) == (8, 2)  # kv < tp: each KV head on tp/kv = 2 ranks, as before


def test_shrunk_scenario_sizes_and_it_resolves():
    sc, src = load_scenario("llama3-8b-h200")
    s = shrink(sc, 4, NUMERICS, src)
    tp = math.gcd(sc.parallel.tp, 4)
    assert (s.parallel.tp, s.parallel.dp, s.parallel.gpus) == (tp, 4 // tp, 4)
    assert s.model.heads == 2 * tp and s.model.hidden == 2 * tp * NUMERICS.head_dim
    assert s.model.seq_len == NUMERICS.seq_per_rank * tp and s.model.vocab == NUMERICS.vocab_per_rank * tp
    assert (s.model.layers, s.model.mlp, s.model.dropout) == (2, sc.model.mlp, False)
    rs = resolve(s, src)
    assert (rs.tp, rs.dp, rs.micro_batches) == (tp, 4 // tp, 1)


def test_gqa_shards_replicate_kv_heads_below_tp():
    d = ModelDims(2, 64, 8, 2, 8, 128, "gelu", True, True, 32, 512, 2, False, 4, 1, True, "none")
    assert [list(q_heads(d, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [list(kv_heads(d, r)) for r in range(4)] == [[0], [0], [1], [1]]
    assert kv_replica_groups(d) == [[0, 1], [2, 3]]
    full = torch.arange(2 * 8 * 64, dtype=torch.float32).view(16, 64)  # k: 2 heads x hd 8
    assert torch.equal(shard("layers.0.attn.k.weight", full, d, 3), full[8:16])
    o = torch.zeros(64, 64)
    assert shard("layers.0.attn.o.weight", o, d, 1).shape == (64, 16)
    assert shard("layers.0.attn.o.bias", torch.zeros(64), d, 1).shape == (64,)


def test_boundary_functions_issue_the_table_ops(world1):
    """Each generated Function issues DUALITY's forward op in forward and backward op in backward."""
    names = {id(world1): "tp"}
    for name, b in DUALITY.items():
        x = torch.randn(4, 2, 3, requires_grad=True)
        with opcount.count_collectives(names) as calls:
            with comm_tag("L0", name, "fwd"):
                y = BOUNDARY_FUNCTIONS[name].apply(x, world1, "L0", name)
            with comm_tag(phase="bwd"):
                y.sum().backward()
        expected = [op.value for op in (b.forward, b.backward) if op.value != "identity"]
        assert [c.op for c in calls] == expected, name
        assert torch.equal(x.grad, torch.ones_like(x))  # one rank: every op is the identity on values


def test_vocab_parallel_xent_equals_torch_cross_entropy_on_one_rank():
    logits = torch.randn(5, 3, 11, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (5, 3))
    ours = VocabParallelCrossEntropy.apply(logits, labels, 0, None)
    ref = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none").view(5, 3)
    torch.testing.assert_close(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g_ours, g_ref)


@pytest.mark.parametrize("mlp,recompute", [("gelu", "full"), ("swiglu", "selective")])
def test_single_rank_model_equals_reference(mlp, recompute):
    d = ModelDims(2, 16, 2, 1, 8, 32, mlp, mlp != "swiglu", mlp != "swiglu", 8, 128, 2, False, 1, 1, False, recompute)
    full = init_full_weights(d, 3, torch.float64)
    tokens, labels = make_batch(d, 3)
    ref = reference(full, tokens, labels, d)
    w = local_weights(full, d, 0)
    loss, _ = forward(w, tokens, labels, Plan(d), Mesh(1, 1, 0, 0))
    loss.backward()
    torch.testing.assert_close(loss.detach(), ref.token_losses.mean())
    for n, t in w.items():
        torch.testing.assert_close(t.grad, ref.grads[n], msg=n)


def test_dp_buckets_close_once_they_reach_the_size():
    w = {n: torch.zeros(k) for n, k in (("a", 100), ("b", 300), ("c", 200), ("d", 50))}
    # fp32 grads: d=200 B, c=800 B, b=1200 B, a=400 B; limit 1000 B -> [d, c] (1000), [b] (1200), [a]
    assert dp_buckets(list(w), w, 1000) == [["d", "c"], ["b"], ["a"]]


def test_compare_records_lists_each_difference():
    a = opcount.CallRecord("L0.mb0.fwd.attn_in", "all_reduce", "tp", 2, 64)
    b = opcount.CallRecord("opt.ln_grad", "all_reduce", "tp", 2, 10)
    assert opcount.compare_records([a, b], [a, b]) == []
    diffs = opcount.compare_records([a], [a, b])
    assert diffs == ["opt.ln_grad: all_reduce on tp(2) of 10 elements: counted 0, schedule 1"]
    assert opcount.per_block_counts([a, a, b]) == {"L0.fwd": 2, "opt": 1}


def test_variant_specs_and_bad_modifier():
    sc, src = load_scenario("tiny-2gpu")
    v = make_variant(sc, "sp+swiglu+gqa+full", 2, src)
    assert (v.scenario.parallel.sp, v.scenario.model.mlp, v.scenario.parallel.recompute) == (True, "swiglu", "full")
    assert v.scenario.model.num_kv_heads == 1 < v.scenario.parallel.tp
    assert make_variant(sc, "dp2+tp", 4, src).scenario.parallel.dp == 2
    with pytest.raises(UserError, match="Unknown variant modifier"):
        make_variant(sc, "sp+bogus", 2, src)


def test_reductions_follow_their_documented_statistics():
    # two ranks x three rounds: collectives take the min over ranks per round, compute the mean
    per_rank = [[[1.0, 2.0, 3.0]], [[3.0, 1.0, 5.0]]]
    assert sampling.reduce_samples(per_rank, collective=True) == [pytest.approx((1 + 1 + 3) / 3)]
    assert sampling.reduce_samples(per_rank, collective=False) == [pytest.approx((2 + 1.5 + 4) / 3)]
    a, b = calibrate.fit_line([1.0, 2.0, 3.0], [5.0, 7.0, 9.0])
    assert (a, b) == (pytest.approx(3.0), pytest.approx(2.0))
    assert calibrate.memory_line((1, 2, 3), [5.0, 7.0, 9.0]) == (pytest.approx(3.0), pytest.approx(2.0))
    # noise gave the larger sizes no slower times (a negative slope): the largest size's own rate, t0 = 0
    assert calibrate.memory_line((100, 200, 400), [9.0, 7.0, 8.0]) == (0.0, 8.0 / 400)
    assert calibrate.memory_line((100, 200), [3.0, 3.0]) == (0.0, 3.0 / 200)  # flat: no slope either
    assert calibrate.busbw_factor("all_reduce", 4) == pytest.approx(1.5)
    assert calibrate.busbw_factor("all_gather", 4) == pytest.approx(0.75)


def test_measured_op_times_min_over_ranks_for_collectives():
    sc, src = load_scenario("tiny-2gpu")
    schedule = measured.schedule_of(shrink(sc, 2, NUMERICS, src), src)
    n = len(schedule.ops)
    r0 = {"rank": 0, "timed": [[[0.0, 1.0]] * n, [[0.0, 3.0]] * n], "step_s": [1.0, 2.0]}
    r1 = {"rank": 1, "timed": [[[0.0, 2.0]] * n, [[0.0, 5.0]] * n], "step_s": [3.0, 1.0]}
    means = measured.reduce_op_times(schedule, [r0, r1], measured.statistics.fmean)
    coll = next(op for op in schedule.ops if isinstance(op.work, Collective))
    comp = next(op for op in schedule.ops if not isinstance(op.work, Collective))
    assert means[coll.id] == pytest.approx((1.0 + 3.0) / 2)  # min over ranks per step
    assert means[comp.id] == pytest.approx((1.5 + 4.0) / 2)  # mean over ranks per step
    assert measured.reduce_run(schedule, [r0, r1]).step_s == pytest.approx(2.5)  # median of maxes (3, 2)


def test_crosscheck_arithmetic():
    assert crosscheck.error_pct(11.0, 10.0) == pytest.approx(10.0)
    assert crosscheck.jaccard({"a", "b", "c"}, {"b", "c", "d"}) == pytest.approx(2 / 4)


def test_executor_kernels_have_the_work_shapes():
    dev = Device.for_backend("gloo")
    out = make_runner(Gemm(8, 5, 3, batch=2), dev, {})(False)
    assert out.shape == (2, 8, 5)
    grads = make_runner(Attention(2, 4, 2, 16, 8, True, backward=True), dev, {})(False)
    assert [g.shape for g in grads] == [(2, 4, 16, 8)] * 3
    assert make_runner(Collective("all_reduce", "tp", 1024), dev, {"tp": None})(False) is None


def test_importing_the_cli_does_not_import_torch():
    code = "import sys, meshsim.sim.cli.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert out.stdout.strip() == "False"


def test_bad_backend_is_a_user_error():
    from meshsim.sim.cli.main import main

    assert main(["validate", "tiny-2gpu", "--backend", "mpi"]) == 2
    assert main(["validate", "tiny-2gpu", "--check", "--variants", "sp+nope"]) == 2


def test_gpu_profiles_keep_the_datasheet_peaks_cpu_profiles_replace_them():
    """nccl: measured throughput lives in the tables (MFU and efficiency defaults are per datasheet peak);
    gloo: the CPU is not the scenario's GPU preset, so its measured figures replace the preset's."""
    from meshsim.validate.calibrate.calibration import _device_figures

    gpu = _device_figures("nccl", 790.0, 4300.0)
    assert gpu.peak_tflops is None and gpu.mem_bw_gbps is None
    cpu = _device_figures("gloo", 0.08, 40.0)
    assert (cpu.peak_tflops, cpu.mem_bw_gbps) == (0.08, 40.0)


def test_timing_shrink_keeps_the_pipeline():
    """Every rule keeps pp' = gcd(pp, nproc) stages (the timing executor runs P2P); tp' dp' = nproc / pp'."""
    from meshsim.scenarios.load import load_scenario

    sc, src = load_scenario("llama2-70b-h100-pp4")
    assert sc.parallel.pp == 4
    for rule in (NUMERICS, TIMING):
        shrunk = shrink(sc, 2, rule, src)
        assert (shrunk.parallel.pp, shrunk.parallel.tp * shrunk.parallel.dp) == (2, 1)
        p = shrunk.parallel  # m' = 2 pp' = 4 micro-batches per step
        assert shrunk.model.layers % 2 == 0 and p.global_batch == 4 * p.dp * p.micro_batch
    assert (shrink(sc, 4, TIMING, src).parallel.pp, shrink(sc, 3, TIMING, src).parallel.pp) == (4, 1)
