"""The Kineto trace reader (sim/kineto/): streaming parse, classes, steps, collectives, HTA's critical path,
and one clear line for every bad input."""

from __future__ import annotations

import gzip
import json

import pytest

from meshsim.sim.core.errors import UserError
from meshsim.sim.kineto import jsonstream, jsonstream_py
from meshsim.sim.kineto.classify import kernel_class
from meshsim.sim.kineto.collectives import normalize_op
from meshsim.sim.kineto.jsonstream import iter_trace
from meshsim.sim.kineto.load import load_rank
from meshsim.sim.kineto.ranks import load_ranks, summaries, windowed
from meshsim.sim.kineto.shapes import GemmShape, gemm_shape
from meshsim.sim.kineto.step_summary import union_us
from tests.kineto_traces import SIXTEEN_RANK, TWO_RANK, document, one_step, write


@pytest.fixture(scope="module")
def two_rank():
    return load_ranks([TWO_RANK])


def _members_and_events(path, backend=None):
    members, events = {}, []
    for kind, item in iter_trace(path, backend=backend):
        if kind == "event":
            events.append(item)
        else:
            members[item[0]] = item[1]
    return members, events


BACKENDS = pytest.mark.parametrize("backend", jsonstream.BACKENDS)


def _head(doc):
    """The members written before traceEvents (the ones iter_trace returns)."""
    keys = list(doc)
    return {k: doc[k] for k in keys[:keys.index("traceEvents")]}


@BACKENDS
@pytest.mark.parametrize("chunk", [3, 17, 4096])
def test_streaming_equals_json_load_at_any_chunk_boundary(tmp_path, monkeypatch, chunk, backend):
    doc = one_step()
    doc["traceEvents"].append({"ph": "i", "name": "n \\\\\\\" {[", "ts": 1.5e3, "args": {"s": "]}\\"}})
    path = write(tmp_path / "t.json", doc)
    monkeypatch.setattr(jsonstream_py, "CHUNK_CHARS", chunk)
    monkeypatch.setattr(jsonstream, "READ_BYTES", chunk)
    members, events = _members_and_events(path, backend)
    assert events == doc["traceEvents"]
    assert members == _head(doc) and "traceName" not in members


@BACKENDS
def test_real_trace_streams_as_json_load_reads_it(monkeypatch, backend):
    monkeypatch.setattr(jsonstream_py, "CHUNK_CHARS", 4096)  # thousands of refills inside events
    monkeypatch.setattr(jsonstream, "READ_BYTES", 4096)
    members, events = _members_and_events(TWO_RANK, backend)
    whole = json.loads(gzip.decompress(TWO_RANK.read_bytes()))
    assert events == whole["traceEvents"] and members["distributedInfo"] == whole["distributedInfo"]


@BACKENDS
@pytest.mark.parametrize("text,problem", [
    ('{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": "X", "ts"', "truncated"),
    ('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "Malformed JSON"),
    ('[1, 2]', "a trace is one JSON object"),
    ('', "truncated"),
    ('{"traceEvents": [{"ph": "X", "ts": 1}]} trailing', "Unexpected text"),
    ('{"schemaVersion": 1}', "No traceEvents"),
])
def test_malformed_or_truncated_files_are_one_user_error(tmp_path, monkeypatch, text, problem, backend):
    monkeypatch.setattr(jsonstream, "DEFAULT_BACKEND", backend)
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_rank(path)
    assert problem in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_truncated_gzip_is_one_user_error(tmp_path):
    data = TWO_RANK.read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="truncated"):
        load_rank(path)


def test_a_trace_without_gpu_events_is_refused(tmp_path):
    path = write(tmp_path / "cpu.json", document([{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                                                  "args": {"name": "python"}}]))
    with pytest.raises(UserError, match="No GPU events"):
        load_rank(path)


def test_clock_skewed_ranks_are_refused(tmp_path):
    write(tmp_path / "rank0.json", one_step(0.0, rank=0))
    write(tmp_path / "rank1.json", one_step(5e6, rank=1))  # rank 1's clock 5 s ahead
    with pytest.raises(UserError, match="Clock-skewed ranks: rank 1"):
        load_ranks([tmp_path])
    write(tmp_path / "rank1.json", one_step(3.0, rank=1))  # negative control: 3 us apart
    assert [d.trace.rank for d in load_ranks([tmp_path])] == [0, 1]


def test_union_and_exposed_communication_closed_form(tmp_path):
    """one_step: compute [5,105] + [300,400], comm [200,700], step [0,1000)."""
    assert union_us([(0, 2), (1, 3), (5, 6)]) == 4
    (s,) = summaries(load_ranks([write(tmp_path / "t.json", one_step())]))
    assert s.span_s == pytest.approx(1000e-6) and s.compute_busy_s == pytest.approx(200e-6)
    assert s.comm_busy_s == pytest.approx(500e-6) and s.exposed_comm_s == pytest.approx(400e-6)
    assert s.idle_s == pytest.approx(400e-6) and s.busy_s["norm"] == pytest.approx(100e-6)
    (row,) = s.collectives
    assert (row.op, row.group, row.nbytes) == ("all_reduce", 2, 4 << 20)
    assert row.busbw_gbps == pytest.approx((4 << 20) / 500e-6 * 1.0 / 1e9)  # 2(n-1)/n = 1 at n = 2
    (gemm,) = s.gemms
    assert gemm.shape == GemmShape(64, 16, 32) and gemm.tflops == pytest.approx(2 * 64 * 16 * 32 / 100e-6 / 1e12)


def test_critical_path_follows_htas_edges(tmp_path):
    """Longest path of one_step: aten::mm start -> its launch (2) -> launch end (1) -> mm end (7) ->
    (dependency, 0) -> the all-reduce's launch -> launch delay (40) -> the NCCL kernel (500) = 550 us."""
    (s,) = summaries(load_ranks([write(tmp_path / "t.json", one_step())]))
    cp = s.critical_path
    assert cp["cpu_bound"] == pytest.approx(10e-6) and cp["gpu_kernel_launch_overhead"] == pytest.approx(40e-6)
    assert cp["gpu_communication_bound"] == pytest.approx(500e-6) and cp["gpu_compute_bound"] == 0.0


def test_two_rank_trace_reads_its_collectives_and_steps(two_rank):
    whole = json.loads(gzip.decompress(TWO_RANK.read_bytes()))
    nccl = [e for e in whole["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    (data,) = two_rank
    assert data.trace.world_size == 2 and data.trace.device_name == "NVIDIA A100-PG509-200"
    assert [s.number for s in data.trace.steps] == [4, 5, 6]
    assert sum(k.coll is not None for k in data.kernels) == len(nccl) == 21
    steps = summaries([data])
    for s in steps:
        assert s.idle_s == pytest.approx(s.span_s - s.all_busy_s) and s.compute_busy_s <= s.all_busy_s <= s.span_s
        assert 0 < sum(s.critical_path.values()) <= s.span_s
    first = next(e for e in nccl if e["args"]["Collective name"] == "allreduce")
    nbytes = first["args"]["In msg nelems"] * 4
    row = next(r for s in steps for r in s.collectives if r.nbytes == nbytes)
    assert row.op == "all_reduce" and row.group == 2 and row.algo == "RING" and row.protocol == "LL"


def test_sixteen_rank_trace_gets_gemm_shapes_from_input_dims():
    (data,) = load_ranks([SIXTEEN_RANK])
    shaped = [k for k in data.kernels if k.gemm is not None]
    assert shaped and all(k.cls == "gemm" for k in shaped)
    op = shaped[0].launch.shape_op
    assert gemm_shape(op.name, op.dims) == shaped[0].gemm
    colls = [k for k in data.kernels if k.coll is not None]
    assert {k.coll.op for k in colls} >= {"all_to_all", "reduce_scatter", "all_gather", "all_reduce"}
    assert all(k.coll.group == 16 and k.coll.assumed_group for k in colls)  # world size: no group recorded


@pytest.mark.parametrize("name,cat,cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "kernel", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT", "kernel", "gemm"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64>>", "kernel", "attention.flash"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "kernel", "attention.cudnn"),
    ("void (anonymous namespace)::softmax_warp_forward<float>", "kernel", "attention.unfused"),
    ("void at::native::vectorized_layer_norm_kernel<float>", "kernel", "norm"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "kernel", "optimizer"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "kernel", "collective"),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memcpy"),
    ("void at::native::vectorized_elementwise_kernel<4, MulFunctor>", "kernel", "elementwise"),
    ("aten::mm", "cpu", "gemm"),
    ("aten::scaled_dot_product_attention", "cpu", "attention.flash"),
])
def test_kernel_classes(name, cat, cls):
    assert kernel_class(name, cat) == cls


@pytest.mark.parametrize("raw,op", [("allreduce", "all_reduce"), ("_reduce_scatter_base", "reduce_scatter"),
                                    ("allgather_into_tensor_coalesced", "all_gather"), ("nccl:all_to_all", "all_to_all"),
                                    ("gloo:broadcast", "broadcast"), ("SendRecv", "sendrecv")])
def test_collective_names(raw, op):
    assert normalize_op(raw) == op


@pytest.mark.parametrize("op,dims,shape", [
    ("aten::mm", ((64, 32), (32, 16)), GemmShape(64, 16, 32)),
    ("aten::addmm", ((16,), (64, 32), (32, 16)), GemmShape(64, 16, 32)),
    ("aten::bmm", ((8, 64, 32), (8, 32, 16)), GemmShape(64, 16, 32, 8)),
    ("aten::matmul", ((4, 64, 32), (32, 16)), GemmShape(256, 16, 32)),
    ("aten::linear", ((4, 64, 32), (16, 32), (16,)), GemmShape(256, 16, 32)),
    ("aten::mm", ((64, 32), (31, 16)), None),
])
def test_gemm_shapes(op, dims, shape):
    assert gemm_shape(op, dims) == shape


def test_reading_in_step_windows_gives_the_whole_files_summaries(two_rank):
    """The bounded-memory path (a first pass for the steps, then one step's window per batch) against
    reading the file whole: the same summaries, step by step."""
    whole = summaries(two_rank)
    batches = list(windowed([TWO_RANK], budget=100))  # ~1 step of events per batch
    assert [only for _, only in batches] == [{4}, {5}, {6}]
    assert all(len(ranks[0].trace.device) < len(two_rank[0].trace.device) for ranks, _ in batches)
    parts = [s for ranks, only in batches for s in summaries(ranks, only=only)]
    assert parts == whole


def test_a_step_is_read_alone_and_an_unknown_one_refused():
    (ranks, only), = list(windowed([TWO_RANK], step=5))
    assert only == {5} and [s.step for s in summaries(ranks, only=only)] == [5]
    with pytest.raises(UserError, match="No such ProfilerStep"):
        list(windowed([TWO_RANK], step=99))
