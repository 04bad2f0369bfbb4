"""Hostile traces (issue 43, section 1), each a small generated file run through the exact command a user
would type: exit 2 with one line and no traceback, or a sane success; nothing written through a link.
Every parse-level case runs through both parsers (ijson's yajl2_c and the json-decoder fallback)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import UserError
from meshsim.sim.kineto import classify, jsonstream, jsonstream_py, load, ranks, spill
from meshsim.sim.kineto.load import MAX_NAME_CHARS, load_rank
from meshsim.sim.kineto.ranks import all_summaries, load_ranks, summaries
from tests.kineto_traces import cpu_op, document, one_step

BACKENDS = pytest.mark.parametrize("backend", jsonstream.BACKENDS)


@pytest.fixture(autouse=True)
def _backend(request, monkeypatch):
    backend = request.node.callspec.params.get("backend") if hasattr(request.node, "callspec") else None
    if backend is not None:
        monkeypatch.setattr(jsonstream, "DEFAULT_BACKEND", backend)


def _summary(path, *extra) -> list[str]:
    return ["trace", "summary", str(path), "--no-progress", *extra]


def _one_line_exit_2(capsys, argv, *words) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _with(edit) -> dict:
    """one_step() with `edit(events, doc)` applied."""
    doc = one_step()
    edit(doc["traceEvents"], doc)
    return doc


def _nccl_args(events) -> dict:
    return next(e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"])["args"]


REFUSED = {  # name -> (the trace, words of its one line)
    "nelems text": (_with(lambda ev, d: _nccl_args(ev).update({"In msg nelems": "abc"})), ["In msg nelems", "'abc'"]),
    "nelems list": (_with(lambda ev, d: _nccl_args(ev).update({"In msg nelems": [1]})), ["In msg nelems"]),
    "ranks of 5,000 digits": (_with(lambda ev, d: _nccl_args(ev).update({"Process Group Ranks": "9" * 5000})),
                              ["Process Group Ranks"]),
    "markup in world_size": (_with(lambda ev, d: d["distributedInfo"].update({"world_size": "[/]x"})),
                             ["distributedInfo.world_size", "[/]x"]),
    "pg_size text": (_with(lambda ev, d: d["distributedInfo"].update({"pg_config": [{"pg_size": "x"}]})),
                     ["pg_size"]),
    "ts strings": (_with(lambda ev, d: [e.update({"ts": str(e["ts"]), "dur": str(e["dur"])}) for e in ev]),
                   ["ts is '0.0'"]),
    "negative dur": (_with(lambda ev, d: ev[3].update({"dur": -5})), ["dur is -5"]),
}
PARSE_REFUSED = {  # JSON text -> (the text, words): refused by the parser itself, on both backends
    "40-digit ts": (json.dumps(one_step()).replace('"ts": 5.0', '"ts": ' + "1" * 40), ["integer overflow"]),
    "ts -Infinity": (json.dumps(one_step()).replace('"ts": 5.0', '"ts": -Infinity'), ["Malformed JSON"]),
    "dur NaN": (json.dumps(one_step()).replace('"dur": 100.0', '"dur": NaN'), ["Malformed JSON"]),
    "float overflow": (json.dumps(one_step()).replace('"dur": 100.0', '"dur": 1e999'), ["overflow"]),
    "dims of 10^29": (json.dumps(one_step()).replace("[[64, 32], [32, 16]]", "[" + ", ".join(["1" + "0" * 29] * 12) + "]"),
                      ["integer overflow"]),
    "nested 33 deep": (json.dumps(_with(lambda ev, d: ev[1]["args"].update({"x": json.loads("[" * 29 + "]" * 29)}))),
                       ["Nested more than 32"]),
    "nested 50,000 deep": (json.dumps(one_step()).replace('"args": {"device"', '"deep": ' + "[" * 50_000 + "]" * 50_000
                                                          + ', "args": {"device"', 1), ["Nested more than 32"]),
}


@BACKENDS
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_malformed_fields_are_one_line_exit_2(tmp_path, capsys, case, backend):
    doc, words = REFUSED[case]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    _one_line_exit_2(capsys, _summary(path), str(path), *words)


@BACKENDS
@pytest.mark.parametrize("case", sorted(PARSE_REFUSED))
def test_what_json_refuses_is_one_line_exit_2(tmp_path, capsys, case, backend):
    text, words = PARSE_REFUSED[case]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text.encode()))
    _one_line_exit_2(capsys, _summary(path), str(path), *words)


@BACKENDS
def test_nesting_of_32_is_read_and_33_refused(tmp_path, backend):
    """Negative control at the limit: the top-level object is depth 1, an event 3, its args 4."""
    for extra, refused in ((28, False), (29, True)):
        doc = _with(lambda ev, d, n=extra: ev[1]["args"].update({"x": json.loads("[" * n + "]" * n)}))
        path = tmp_path / f"t{extra}.json"
        path.write_text(json.dumps(doc))
        if refused:
            with pytest.raises(Exception, match="Nested more than 32"):
                load_rank(path)
        else:
            assert load_rank(path).events_read == len(doc["traceEvents"])


@BACKENDS
def test_a_string_beyond_the_value_limit_is_refused(tmp_path, capsys, monkeypatch, backend):
    monkeypatch.setattr(jsonstream, "MAX_VALUE_BYTES", 1 << 20)
    monkeypatch.setattr(jsonstream_py, "MAX_VALUE_BYTES", 1 << 20)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_with(lambda ev, d: ev[3].update({"name": "k" * (3 << 20)}))))
    _one_line_exit_2(capsys, _summary(path), "1 MiB")


SANE = {  # name -> the trace: read, with the odd field ignored or made harmless
    "args a list": _with(lambda ev, d: [e.update({"args": [1, 2]}) for e in ev[:4]]),
    "args a string": _with(lambda ev, d: [e.update({"args": "x"}) for e in ev[:4]]),
    "args null": _with(lambda ev, d: [e.update({"args": None}) for e in ev[:4]]),
    "dims of 1e29 (floats)": _with(lambda ev, d: ev[1]["args"].update({"Input Dims": [[1e29] * 12, [1e29] * 12]})),
    "dims of 1e18 (int64)": _with(lambda ev, d: ev[1]["args"].update({"Input Dims": [[10**18] * 12, [10**18] * 2]})),
    "lone surrogate": _with(lambda ev, d: ev[3].update({"name": "gemm\ud800"})),
    "dims holding objects": _with(lambda ev, d: ev[1]["args"].update({"Input Dims": [{"a": 1}, [[{"b": 2}]]],
                                                                       "Input type": [{"c": 3}]})),
    "names a list and a number": _with(lambda ev, d: (ev[3].update({"name": ["x"]}), ev[1].update({"name": 7}))),
    "cat a list and an object": _with(lambda ev, d: ev.extend([{**ev[3], "cat": ["kernel"]}, {**ev[1], "cat": {}}])),
    "thread_name args a list": _with(lambda ev, d: ev.append({"ph": "M", "name": "thread_name", "tid": 1,
                                                              "args": ["x"]})),
}


def _cpu_trace(dims) -> dict:
    """A gloo run (no GPU activity): an operator and a gloo all-reduce span with odd `Input Dims`."""
    return document([cpu_op("ProfilerStep#1", 0.0, 1000.0, cat="user_annotation"), cpu_op("aten::mm", 1.0, 100.0),
                     cpu_op("gloo:all_reduce", 200.0, 300.0, tid=9, **{"Input Dims": dims, "Input type": [None]})])


for _dims in ([5], [None], [[None]], [{"a": 1}], [["x"]]):
    SANE[f"cpu trace, gloo dims {_dims}"] = _cpu_trace(_dims)


@BACKENDS
@pytest.mark.parametrize("case", sorted(SANE))
def test_odd_but_harmless_fields_are_read(tmp_path, capsys, case, backend):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(SANE[case]))
    out = tmp_path / "s.json"
    assert main(_summary(path, "--json", str(out))) == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["steps"][0]["span_s"] == pytest.approx(1000e-6)


def test_huge_gemm_extents_give_no_shape_not_an_overflow(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(SANE["dims of 1e18 (int64)"]))
    (s,) = summaries(load_ranks([path]))
    assert s.gemms == () and s.count["gemm"] == 1


# ----- outputs: never through a link, a full disk is one line -------------------------------------
def test_json_to_dev_full_is_one_line(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(one_step()))
    _one_line_exit_2(capsys, _summary(path, "--json", "/dev/full"), "/dev/full", "No space left")


def test_json_to_dev_null_is_written(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(one_step()))
    assert main(_summary(path, "--json", "/dev/null")) == 0


def test_a_dangling_json_symlink_is_not_written_through(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(one_step()))
    outside = tmp_path / "outside" / "stolen.json"
    outside.parent.mkdir()
    link = tmp_path / "s.json"
    link.symlink_to(outside)
    _one_line_exit_2(capsys, _summary(path, "--json", str(link)), "symlink")
    assert not outside.exists() and link.is_symlink()


def test_compare_trace_out_through_a_symlinked_folder_is_refused(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(one_step()))
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "cmp").symlink_to(target)
    _one_line_exit_2(capsys, ["compare", "tiny-2gpu", "--trace", str(path), "--out", str(tmp_path / "cmp")],
                     "symlink")
    assert list(target.iterdir()) == []


def test_an_existing_json_is_replaced_whole_and_kept_on_failure(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(one_step()))
    out = tmp_path / "s.json"
    out.write_text("old")
    assert main(_summary(path, "--json", str(out))) == 0
    assert json.loads(out.read_text())["steps"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(_summary(bad, "--json", str(out))) == 2
    assert json.loads(out.read_text())["steps"]  # the earlier result is not lost
    out.chmod(0o640)
    assert main(_summary(path, "--json", str(out))) == 0
    assert out.stat().st_mode & 0o777 == 0o640 and not list(tmp_path.glob(".s.json.*"))  # mode kept, no temp left
    fresh = tmp_path / "fresh.json"
    assert main(_summary(path, "--json", str(fresh))) == 0
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_calibrate_and_compare_refuse_the_same_trace_in_one_line(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(REFUSED["nelems text"][0]))
    _one_line_exit_2(capsys, ["calibrate", "--from-trace", str(path), "--scenario", "tiny-2gpu", "--out",
                              str(tmp_path / "p.yaml")], "In msg nelems")
    _one_line_exit_2(capsys, ["compare", "tiny-2gpu", "--trace", str(path)], "In msg nelems")
    assert not (tmp_path / "p.yaml").exists()


# ----- cost: bounded time and memory --------------------------------------------------------------
OLD_CUDNN_RULE = re.compile(r"cudnn.*(sdpa|flash|fmha|attn|attention)|fused_attn", re.IGNORECASE)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["cudnn", "CUDNN", "sdpa", "Flash", "attn", "fused_attn", "fmha", "x", "\n",
                                 "cud", "nn", "ATTENTION", "_"]), max_size=12).map("".join))
def test_linear_cudnn_rule_equals_the_regex(name):
    assert classify._CudnnAttention.search(name) == (OLD_CUDNN_RULE.search(name) is not None)


def test_a_60_kb_kernel_name_of_cudnn_is_classified(tmp_path):
    name = "cudnn" * 12_000
    classify.kernel_class.cache_clear()
    assert classify.kernel_class(name, "kernel") == "elementwise"
    assert classify.kernel_class(name + "sdpa", "kernel") == "attention.cudnn"


@BACKENDS
def test_distinct_3_mib_names_are_kept_cut(tmp_path, backend):
    doc = one_step()
    doc["traceEvents"] += [cpu_op(f"{i}" + "n" * (3 << 20), 10.0 + i, 1.0, tid=5) for i in range(6)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    rt = load_rank(path)
    assert max(len(op.name) for op in rt.host) == MAX_NAME_CHARS


@BACKENDS
def test_blanks_inside_a_gzip_are_read(tmp_path, capsys, backend):
    text = json.dumps(one_step()).replace('"traceEvents": [', '"traceEvents": [' + " " * (16 << 20), 1)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text.encode(), 9))
    assert main(_summary(path)) == 0


def _steps(n: int) -> dict:
    """n ProfilerSteps of one_step's shape, 1,000 us apart, correlation ids distinct."""
    events = []
    for i in range(n):
        step = copy.deepcopy(one_step(1000.0 * i)["traceEvents"])
        for e in step:
            if e["name"].startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{i}"
            if "correlation" in e.get("args", {}):
                e["args"]["correlation"] += 10 * i
        events += step
    return document(events)


@BACKENDS
@pytest.mark.parametrize("flush", [7, spill.FLUSH_RECORDS])  # records spilled to disk, or all held
def test_max_events_1_reads_the_file_once_and_agrees_with_the_whole(tmp_path, capsys, monkeypatch, backend, flush):
    monkeypatch.setattr(load, "FLUSH_RECORDS", flush)
    monkeypatch.setattr(spill, "FLUSH_RECORDS", flush)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_steps(200)))
    whole = summaries(load_ranks([path]))
    parses = []
    monkeypatch.setattr(ranks, "read_rank", lambda *a, **k: parses.append(a) or load.read_rank(*a, **k))
    _, batched = all_summaries([path], budget=1)
    assert batched == whole and len(parses) == 1
    assert main(_summary(path, "--max-events", "1", "--json", str(tmp_path / "s.json"))) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_split_by_window_equals_filtering_each_window(starts, lengths):
    """The spill split (sim/kineto/spill.py) against the long way: each window filtered from all records."""
    steps = sorted(set(starts))
    windows = []
    for i, a in enumerate(steps):
        windows.append((float(a - lengths[i % len(lengths)]), float(steps[i + 1] if i + 1 < len(steps) else a + 5)))
    records = [(float(t) / 2, 1.0, 0, 0, "k", "kernel", -1, None) for t in range(-30, 100)]
    for route in {spill.route, spill.ROUTE}:  # the Python reference and the compiled one (when built)
        whole = spill.Spill()
        whole.write([], records[:50])
        whole.write([], records[50:])
        parts = _split_with(route, whole, windows)
        for (a, b), part in zip(windows, parts, strict=True):
            got = [r for _, dev in part.chunks() for r in dev]
            assert got == [r for r in records if a <= r[0] <= b]


def _split_with(route, whole, windows):
    default, spill.ROUTE = spill.ROUTE, route
    try:
        return spill.split(whole, windows)
    finally:
        spill.ROUTE = default



def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TEXT = st.text(alphabet='[]{}"\\ a\u00e9', max_size=6)
_JSON = st.recursive(st.none() | st.integers(-5, 5) | _TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=12)


@pytest.mark.parametrize("parser", jsonstream.BACKENDS)
@settings(max_examples=100, deadline=None)
@given(_JSON, st.integers(24, 34), st.integers(1, 40))
def test_nesting_is_refused_exactly_when_too_deep(tmp_path_factory, parser, value, wrap, read):
    """The yajl path's nesting check on raw bytes (strings with brackets, quotes and backslashes, any
    read size), and the fallback's on parsed values, against the depth of the value: refused exactly
    when deeper than 32."""
    for _ in range(wrap):
        value = [value]
    doc = {"a": "[{\\\"", "traceEvents": [value]}
    path = tmp_path_factory.mktemp("guard") / "t.json"
    path.write_text(json.dumps(doc))
    deep = 2 + _depth(value) > 32  # the object (1), traceEvents (2), then the value's own containers
    old = jsonstream.READ_BYTES, jsonstream_py.CHUNK_CHARS
    jsonstream.READ_BYTES = jsonstream_py.CHUNK_CHARS = read
    try:
        events = [item for kind, item in jsonstream.iter_trace(path, backend=parser) if kind == "event"]
        assert not deep and events == [value]
    except UserError as err:
        assert deep and "Nested more than 32" in str(err), err
    finally:
        jsonstream.READ_BYTES, jsonstream_py.CHUNK_CHARS = old
