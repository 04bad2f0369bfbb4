"""The compiled trace reader (sim/kineto/_collect.pyx via sim/kineto/fast.py) against the reference
(ijson's yajl2_c + load.py's collector): generated traces aimed at its edges (numbers at the int64 / float /
MAX_TIME_US boundaries, -0, underflow, escapes, non-ASCII and invalid UTF-8, surrogates, repeated keys,
odd types where Kineto writes numbers, nested args, steps, correlation ids, read sizes of a few bytes)
must give the same records, or the same one-line error."""

from __future__ import annotations

import gzip
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.sim.core.errors import UserError
from meshsim.sim.kineto import context, fast, jsonstream, load
from meshsim.sim.kineto.load import _Collector, read_rank
from meshsim.sim.kineto.records import HostOp
from tests.kineto_traces import SIXTEEN_RANK, TWO_RANK

_collect = pytest.importorskip("meshsim.sim.kineto._collect")  # built by setup.py (a C compiler and Cython)
yajl = pytest.importorskip("ijson.backends.yajl2_c")  # the reference parser


class Raw(str):
    """A number written as this exact text."""


class Pairs(list):
    """An object written from (key, value) pairs: keys may repeat."""


def dumps(value, ascii_only: bool, blank: str) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs | dict):
        pairs = value if isinstance(value, Pairs) else list(value.items())
        inner = f",{blank}".join(f"{json.dumps(k, ensure_ascii=ascii_only)}{blank}:{dumps(v, ascii_only, blank)}"
                                 for k, v in pairs)
        return "{" + blank + inner + "}"
    if isinstance(value, list):
        return "[" + f",{blank}".join(dumps(v, ascii_only, blank) for v in value) + blank + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


EDGE_NUMBERS = ["0", "-0", "0.0", "-0.0", "1", "-1", "7", "2.5", "1e18", "1E+18", "-1e18", "1.0000000000000002e18",
                "1000000000000000000", "1000000000000000001", "-999999999999999999", "123456789012345678",
                "-9223372036854775807", "99999999999999999999",
                "9223372036854775807", "-9223372036854775808", "9223372036854775808", "1e-400", "4.9e-324",
                "2.2250738585072014e-308", "1e308", "1e309", "-1e309", "1700000000000000.5", "1.7e15",
                "9007199254740993", "9007199254740992", "0.1", "1e0", "12e-1", "0e5", "-0e-5", "00", "1.", "-",
                ".5", "+1", "1e", "0x10", "NaN", "Infinity"]
number = st.one_of(st.sampled_from(EDGE_NUMBERS).map(Raw), st.integers(-2**64, 2**64),
                   st.floats(allow_nan=False, allow_infinity=False), st.floats(-1e19, 1e19))
text = st.one_of(st.sampled_from(["", "X", "M", "kernel", "cpu_op", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                                  "aten::mm", "ProfilerStep#3", "ProfilerStep#0012", "thread_name", "gloo:all_reduce",
                                  "[0, 1, 2, 3]", "[1234567890]", "a\"b\\c/\n\t\u0001", "\u00e9\u4e2d\U0001F600",
                                  "\ud800", "\udc00x", "\x00", "x" * 600]),
                 st.text(max_size=12))
scalar = st.one_of(number, text, st.booleans(), st.none())
json_value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(text, inner, max_size=4)), max_leaves=12)
dims = st.one_of(st.lists(st.lists(number, max_size=3), max_size=3), json_value)
ARG_KEYS = {"stream": number, "correlation": number, "Input Dims": dims, "Input type": st.lists(text, max_size=3),
            "Collective name": text, "In msg nelems": number, "Out msg nelems": number, "Group size": number,
            "dtype": text, "Process Group Name": text, "Process Group Description": text,
            "Process Group Ranks": st.one_of(text, st.lists(number, max_size=4), json_value),
            "bytes": number, "name": text, "External id": number}


def _optional(fields: dict) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional=fields).flatmap(
        lambda d: st.one_of(st.just(d), st.just(Pairs(list(d.items()) + list(d.items())[:1]))))


args = st.one_of(_optional(ARG_KEYS), json_value)
event = st.one_of(_optional({
    "ph": st.one_of(st.sampled_from(["X", "M", "i", "s"]), scalar),
    "cat": st.one_of(st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation",
                                      "cuda_runtime", "cuda_driver", "ac2g"]), json_value),
    "name": text, "pid": st.one_of(st.integers(0, 3), scalar), "tid": st.one_of(st.integers(0, 3), scalar),
    "ts": number, "dur": number, "args": args}), json_value)
document = st.fixed_dictionaries({
    "head": st.dictionaries(st.sampled_from(["schemaVersion", "deviceProperties", "distributedInfo"]), json_value),
    "events": st.lists(event, max_size=12), "ascii": st.booleans(), "blank": st.sampled_from(["", " ", "\n\t "]),
    "read": st.sampled_from([1, 3, 7, 64, 1 << 20]), "gz": st.booleans()})


def _write(path, doc: dict) -> None:
    body = dumps(Pairs([*doc["head"].items(), ("traceEvents", doc["events"]), ("traceName", "t")]),
                 doc["ascii"], doc["blank"]).encode("utf-8", "surrogatepass")
    path.write_bytes(gzip.compress(body) if doc["gz"] else body)


def _outcome(path, monkeypatch, backend: str, hold: int | None = None):
    monkeypatch.setattr(jsonstream, "DEFAULT_BACKEND", backend)
    try:
        rec = read_rank(path, hold=hold)
    except UserError as err:
        return ("error", str(err))
    host, device = rec.all_records()
    return ("records", repr((rec.info, rec.device_name, rec.sm_count, rec.threads, rec.steps, rec.events_read,
                             rec.kept, rec.cpu_device, host, device)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=document)
def test_compiled_reader_equals_the_reference_on_generated_traces(tmp_path, monkeypatch, doc):
    path = tmp_path / "t.json"
    _write(path, doc)
    monkeypatch.setattr(fast, "READ_BYTES", doc["read"])
    assert _outcome(path, monkeypatch, "compiled") == _outcome(path, monkeypatch, "yajl2_c")


@settings(max_examples=300, deadline=None)
@given(doc=document)
def test_what_the_scanner_accepts_decodes_as_yajl_does(doc):
    """Value level: every event the scanner hands on equals (type and sign included) yajl's."""
    doc["gz"] = False
    body = dumps(Pairs([("traceEvents", doc["events"])]), doc["ascii"], doc["blank"]).encode("utf-8", "surrogatepass")
    mine: list = []
    if not _collect.scan(io.BytesIO(body), mine.append, read_bytes=doc["read"]):
        return
    theirs = list(yajl.items(io.BytesIO(body), "traceEvents.item", use_float=True))
    assert repr(mine) == repr(theirs) and _types(mine) == _types(theirs)


@settings(max_examples=200, deadline=None)
@given(doc=document)
def test_events_kept_to_the_collectors_keys_equal_yajls_restricted(doc):
    """With the collector's keys (load.EVENT_KEYS, ARG_KEYS), each event is yajl's with only those members
    (of args: only ARG_KEYS, a non-object args None), a non-object event None."""
    body = dumps(Pairs([("traceEvents", doc["events"])]), doc["ascii"], doc["blank"]).encode("utf-8", "surrogatepass")
    mine: list = []
    if not _collect.scan(io.BytesIO(body), mine.append, None, None, doc["read"], load.EVENT_KEYS, load.ARG_KEYS):
        return
    theirs = [_restricted(ev) for ev in yajl.items(io.BytesIO(body), "traceEvents.item", use_float=True)]
    assert repr(mine) == repr(theirs) and _types(mine) == _types(theirs)


def _restricted(ev):
    if not isinstance(ev, dict):
        return None
    out = {k: v for k, v in ev.items() if k in load.EVENT_KEYS}
    if "args" in out:
        args = out["args"]
        out["args"] = {k: v for k, v in args.items() if k in load.ARG_KEYS} if isinstance(args, dict) else None
    return out


decimal = st.builds(lambda sign, whole, frac, zeros, exp: f"{sign}{whole}.{frac}{'0' * zeros}{exp}",
                    st.sampled_from(["", "-"]), st.integers(0, 10**19), st.integers(0, 10**19).map(str),
                    st.integers(0, 4), st.one_of(st.just(""), st.integers(-30, 30).map(lambda e: f"e{e}")))


@settings(max_examples=2000, deadline=None)
@given(texts=st.lists(decimal, min_size=1, max_size=20))
def test_numbers_read_as_float_reads_them(texts):
    """The scanner's exact fast path (Clinger: mantissa < 2**53, |exponent| <= 22) and its fallback to
    float() give float(text), bit for bit."""
    mine: list = []
    assert _collect.scan(io.BytesIO(("{\"traceEvents\": [" + ", ".join(texts) + "]}").encode()), mine.append)
    assert [repr(v) for v in mine] == [repr(float(t)) for t in texts]


def _types(value):
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("compiled_add", [True, False])
@pytest.mark.parametrize("trace", [TWO_RANK, SIXTEEN_RANK])
def test_public_traces_take_the_compiled_path_and_agree(trace, monkeypatch, compiled_add):
    monkeypatch.setattr(fast, "COMPILED_ADD", compiled_add)
    calls = []
    real = _collect.scan
    monkeypatch.setattr(_collect, "scan", lambda *a: calls.append(real(*a)) or calls[-1])
    compiled = _outcome(trace, monkeypatch, "compiled")
    assert calls == [True]  # no fallback
    assert compiled == _outcome(trace, monkeypatch, "yajl2_c") and compiled[0] == "records"


@pytest.mark.parametrize("compiled_add", [True, False])
def test_spilled_records_agree(monkeypatch, compiled_add):
    """With records spilled to disk every 1,024 events (the collector's flush), the same records come back."""
    monkeypatch.setattr(fast, "COMPILED_ADD", compiled_add)
    monkeypatch.setattr(load, "FLUSH_RECORDS", 1)
    compiled = _outcome(TWO_RANK, monkeypatch, "compiled", hold=1)
    assert compiled == _outcome(TWO_RANK, monkeypatch, "yajl2_c", hold=1) == _outcome(TWO_RANK, monkeypatch, "yajl2_c")


@pytest.mark.parametrize("body", [
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "\\ud800", "ts": 1, "dur": 1}]}',  # yajl: '?'
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e400, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 12345678901234567890, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1", "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}]} x',
])
def test_what_the_scanner_leaves_is_the_references_answer(tmp_path, monkeypatch, body):
    """Negative controls: each one is outside the compiled subset or refused by the collector (the compiled
    path gives way), and the answer is the reference's."""
    path = tmp_path / "t.json"
    path.write_bytes(body)
    assert not fast.collect(path, _Collector(path), None, lambda p: [])
    assert _outcome(path, monkeypatch, "compiled") == _outcome(path, monkeypatch, "yajl2_c")


def test_compiled_records_are_the_named_tuples_make_builds():
    rows = [(1.0, 2.0, 3, "aten::mm", "cpu_op", -1, ((4, 5),), ("float",), None),
            (0.5, 0.0, 1, "k", "cuda_runtime", 7, (), (), {"Collective name": "allreduce"})]
    mine, theirs = _collect.records(HostOp, rows), list(map(HostOp._make, rows))
    assert mine == theirs and [type(r) for r in mine] == [HostOp, HostOp] and mine[1].corr == 7
    for short in [(1.0,) * 6, (1.0,) * 10]:  # a row of the wrong length: _make's own TypeError
        with pytest.raises(TypeError):
            _collect.records(HostOp, [short])


host_op = st.builds(
    lambda tid, ts, dur, name, cat, corr, dims, args: HostOp(float(ts) / 2, float(dur) / 2, tid, name, cat, corr, dims,
                                                              (), args),
    st.integers(0, 2), st.integers(0, 60), st.integers(0, 20),
    st.sampled_from(["aten::mm", "nccl:all_reduce", "gloo:all_reduce", "L0.mb0.fwd.qkv", "dp.grad", "ProfilerStep#1",
                     "cudaLaunchKernel", "record_param_comms", "x"]),
    st.sampled_from(["cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"]), st.integers(-1, 12),
    st.sampled_from([(), ((4, 4), (4, 4))]), st.sampled_from([None, {}, {"Collective name": "allreduce"}, {"x": 1}]))


@settings(max_examples=500, deadline=None)
@given(ops=st.lists(host_op, max_size=40), corrs=st.sets(st.integers(0, 12)))
def test_compiled_launch_sweep_equals_the_python_one(ops, corrs):
    """context.gpu_launches' sweep (each runtime call's open operators: shape, collective, label), compiled
    against context.sweep_runtime on generated threads (nesting, ties, zero lengths, repeated correlations)."""
    ops = sorted(ops, key=lambda op: (op.tid, op.ts, -op.dur))
    mine = context._compiled_sweep(ops, corrs)
    assert mine == context.sweep_runtime(ops, corrs) and all(type(v) is context.Launch for v in mine.values())
