"""Outputs: results JSON (keys, round trip), Perfetto trace (schema, nesting, flows), plotly timeline."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from meshsim.scenarios.schema import OptimizerConfig, RunConfig
from meshsim.sim.cost.memory import MemoryBreakdown
from meshsim.sim.engine.events import run
from meshsim.sim.outputs.step_report import print_report, write_outputs
from meshsim.sim.outputs.timeline import timeline_figure
from meshsim.sim.outputs.trace import trace_document, trace_events
from meshsim.sim.results.breakdown import BREAKDOWN_KEYS
from meshsim.sim.results.critical_path import critical_ops
from meshsim.sim.results.step_result import CONFIG_KEYS, MEMORY_KEYS, StepResult, build_result
from meshsim.sim.schedule.ops import Collective, Gemm, Op, Schedule

REQUIRED_KEYS = {"scenario", "step_time_s", "layer_fwd_ms", "layer_bwd_ms", "tokens_per_s", "tflops_per_gpu",
                 "mfu", "memory_gb", "breakdown_s", "critical_path", "critical_path_share", "collectives"}
GEMM = Gemm(128, 128, 128)


def step_schedule(layers: int, tp: int = 2) -> Schedule:
    """Per layer: gemm -> TP all-reduce -> gemm, forward then backward, then one DP all-reduce."""
    ops: list[Op] = []
    prev: tuple[int, ...] = ()
    order = [("fwd", layer) for layer in range(layers)] + [("bwd", layer) for layer in reversed(range(layers))]
    for phase, layer in order:
        for kind in ("g1", "ar", "g2"):
            i = len(ops)
            if kind == "ar":
                ops.append(Op(i, f"L{layer}.mb0.{phase}.ar", "tp_comm", "tp_comm", phase,
                              Collective("all_reduce", "tp", 4096), prev, layer, 0))
            else:
                ops.append(Op(i, f"L{layer}.mb0.{phase}.{kind}", "compute", "compute", phase, GEMM, prev, layer, 0))
            prev = (i,)
    ops.append(Op(len(ops), "dp_grad", "dp_comm", "dp_comm", "bwd", Collective("all_reduce", "dp", 8192), prev))
    return Schedule(tuple(ops), tp=tp, dp=2, micro_batches=1)


def fake_rs():
    par = SimpleNamespace(global_batch=8, sp=True, micro_batch=1, recompute="none", tp_comm_overlap=False,
                          recompute_modules=None, fsdp=False, dist_opt_instances=1)
    scenario = SimpleNamespace(parallel=par, model=SimpleNamespace(seq_len=1024, moe=None, mtp_layers=0),
                               topology=SimpleNamespace(preset="x"), run=RunConfig(), optimizer=OptimizerConfig())
    return SimpleNamespace(name="synthetic", source="test", scenario=scenario, gpus=4, tp=2, dp=2, pp=1, vp=1, cp=1,
                           micro_batches=1, stage_size=4, release=SimpleNamespace(name="mbridge-26.08"),
                           gpu=SimpleNamespace(name="h100-sxm", peak_tflops=989.0), datasheet_peak_tflops=989.0,
                           topology=SimpleNamespace(name="x", nodes=1, gpus_per_node=8), crosses_nodes=lambda: False)


MEMORY = MemoryBreakdown(weights_gb=1.0, grads_gb=2.0, optimizer_gb=3.0, activations_gb=4.0, workspace_gb=0.5,
                         total_gb=10.5, capacity_gb=80.0, fits=True)


def simulated(layers: int = 3, ranks=(0,)):
    sched = step_schedule(layers)
    log = run(sched, ranks, lambda op, r: 1e-3 * (1 + r), lambda op, g: (5e-6, 100e-6, {g[0]: 1.0}))
    return build_result(fake_rs(), sched, log, memory=MEMORY, model_flops=1e15), log


def test_results_dict_has_all_keys_and_round_trips():
    result, log = simulated()
    data = json.loads(json.dumps(result.to_dict()))
    assert REQUIRED_KEYS | set(CONFIG_KEYS) <= set(data)
    assert set(data["memory_gb"]) == set(MEMORY_KEYS)
    assert set(data["breakdown_s"]) == set(BREAKDOWN_KEYS)
    assert data["fits"] is True and data["hfu"] == pytest.approx(data["mfu"])  # no recompute: HFU = MFU
    assert set(data["critical_path_share"]) == {"compute", "tp_comm", "dp_comm", "waiting"}
    assert {"name", "category", "rank", "start_us", "dur_us"} <= set(data["critical_path"][0])
    # tokens/s = global_batch x seq_len / step; TFLOP/s per GPU = FLOPs / step / gpus / 1e12
    assert data["tokens_per_s"] == pytest.approx(8 * 1024 / log.step_time_s)
    assert data["tflops_per_gpu"] == pytest.approx(1e15 / log.step_time_s / 4 / 1e12)
    assert data["mfu"] == pytest.approx(data["tflops_per_gpu"] / 989.0)
    again = StepResult.from_dict(data)
    assert again == result and again["tp"] == 2


def test_layer_spans_cover_the_middle_layer():
    result, _ = simulated(layers=3)
    # middle layer 1: g1 1 ms + all-reduce 105 us + g2 1 ms, forward and backward alike
    assert result.layer_fwd_ms == pytest.approx(2.105) and result.layer_bwd_ms == pytest.approx(2.105)


def slices_nest(events: list[dict]) -> bool:
    """Per (pid, tid): sorted by start, each slice ends before the enclosing open slice does."""
    by_thread: dict[tuple, list] = {}
    for ev in events:
        if ev["ph"] == "X":
            start = round(ev["ts"] * 1000)
            by_thread.setdefault((ev["pid"], ev["tid"]), []).append((start, start + round(ev["dur"] * 1000)))
    for spans in by_thread.values():
        stack: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1]:
                return False
            stack.append(end)
    return True


def test_trace_schema_nesting_and_flows(tmp_path):
    result, log = simulated(ranks=(0, 1))  # rank 1 computes slower: rank 0 waits at each all-reduce
    doc = json.loads(json.dumps(trace_document(trace_events(log.events, result.critical_path))))
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    for ev in slices:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= set(ev) and ev["dur"] >= 0
    ops = [e for e in slices if e["name"] != "wait"]
    assert len(ops) == len(log.events)
    for ev in ops:
        assert {"op", "category", "phase", "critical", "stream", "correlation"} <= set(ev["args"])
        assert ev["cat"] == "kernel" and ev["args"]["stream"] == ev["tid"]
    assert any(e["name"] == "wait" for e in slices)
    assert slices_nest(events)
    names = {(e["pid"], e["name"]) for e in events if e["ph"] == "M"}
    assert {(0, "process_name"), (1, "process_name"), (0, "thread_name")} <= names
    crit = critical_ops(result.critical_path)
    assert {(e["pid"], e["args"]["op"]) for e in ops if e["args"]["critical"]} == crit
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f" and e["bp"] == "e"}
    by_key = {(e.rank, e.op_id): e for e in log.events}
    chain = [by_key[(s.rank, s.op_id)] for s in result.critical_path if s.op_id is not None]
    lane_changes = sum((a.rank, a.stream) != (b.rank, b.stream) for a, b in zip(chain, chain[1:], strict=False))
    assert starts == finishes and len(starts) == lane_changes > 0


def test_partially_overlapping_slices_are_detected():
    bad = [{"ph": "X", "ts": 0.0, "dur": 2.0, "pid": 0, "tid": 1}, {"ph": "X", "ts": 1.0, "dur": 2.0, "pid": 0, "tid": 1}]
    assert not slices_nest(bad)


def test_trace_pid_offset_for_merged_runs():
    result, log = simulated()
    merged = trace_events(log.events, pid_offset=0, process_prefix="measured") + \
        trace_events(log.events, result.critical_path, pid_offset=100, process_prefix="sim", flow_id_base=10**6)
    names = {e["args"]["name"] for e in merged if e["name"] == "process_name"}
    assert names == {"measured rank 0", "sim rank 0"}
    assert {e["pid"] for e in merged} == {0, 100}


def test_timeline_uses_a_fixed_number_of_traces():
    small, log_small = simulated(layers=2)
    big, log_big = simulated(layers=40)
    n_small = len(timeline_figure(log_small.events, small.critical_path).data)
    n_big = len(timeline_figure(log_big.events, big.critical_path).data)
    assert n_small == n_big <= 7  # (bars + hover) per category + the critical-path overlay


def test_write_outputs_writes_only_its_files(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result, log = simulated()
    paths = write_outputs(result, log.events, tmp_path)
    assert {p.name for p in paths.values()} == {"results.json", "trace.json", "timeline.html"}
    assert (tmp_path / "keep.txt").read_text() == "mine"
    html = (tmp_path / "timeline.html").read_text()
    assert '<script src="http' not in html and "Plotly.newPlot" in html  # self-contained
    console = Console(record=True, width=160)
    print_report(result, console)
    text = console.export_text()
    assert "MFU" in text and "fits" in text and "top critical-path op types" in text


def test_op_type_strips_indices_only():
    from meshsim.sim.results.critical_path import op_type

    assert op_type("L3.mb0.fwd.fc1_c2") == "fwd.fc1"
    assert op_type("dp.bucket12.reduce_scatter") == "dp.bucket.reduce_scatter"
    assert op_type("head.mb1.fwd.xent_max_ar") == "head.fwd.xent_max_ar"


def test_results_json_text_is_the_dict():
    from meshsim.sim.outputs.step_report import results_json_text

    result, _ = simulated()
    assert json.loads(results_json_text(result, full_critical_path=True)) == json.loads(json.dumps(result.to_dict()))
    summary = json.loads(results_json_text(result))  # the default: the path summarised, not listed op by op
    assert "critical_path" not in summary and summary["critical_path_top"]
    top = summary["critical_path_top"]
    assert sum(t["count"] for t in top) <= len(result.critical_path)
    assert top == sorted(top, key=lambda t: -t["total_s"])


def test_timeline_spec_is_valid_plotly_and_the_page_embeds_it(tmp_path):
    """The plain dict written without plotly is what plotly's own validation makes of it (so plotly.js reads
    it as before); the page holds plotly.js and the figure, with "</" escaped."""
    import json

    from meshsim.sim.outputs.plotly_page import decode_typed_array, figure_json, typed_array
    from meshsim.sim.outputs.timeline import timeline_spec, write_timeline

    result, log = simulated(layers=2)
    spec = timeline_spec(log.events, result.critical_path, "t</script>", result)
    assert json.loads(timeline_figure(log.events, result.critical_path, "t</script>", result).to_json()) == spec
    page = write_timeline(tmp_path / "t.html", log.events, result.critical_path, "t</script>", result).read_text()
    assert figure_json(spec) in page and page.count("</script>") == 3  # plotly config, plotly.js, the figure
    values = [0.5, 2.0, float("nan"), 1e3]
    decoded = decode_typed_array(typed_array(values))
    assert decoded[:2] == [0.5, 2.0] and decoded[2] != decoded[2] and decoded[3] == 1e3


@pytest.mark.parametrize("value", [0, -3, 2**70, 0.1, 1e-7, 1e22, -0.0, float("nan"), float("inf"), True, False, None,
                                   "L0.mb0.fwd", 'a"b\\c\n\u00e9\u2028', [1, 2.5], {"k": 1}])
def test_trace_scalar_text_is_what_json_writes(value):
    """Finite scalars: the text json writes; NaN / Infinity are refused (never written into a trace)."""
    from meshsim.sim.outputs.trace_slices import js

    if isinstance(value, float) and value != value or value == float("inf"):
        with pytest.raises(ValueError):
            js(value)
        return
    assert js(value) == json.dumps(value, separators=(",", ":"))


def test_trace_file_is_the_compact_json_of_trace_events(tmp_path):
    """write_trace writes op slices as text straight from the events; the file must be, byte for byte, the
    compact JSON of the dict events (waits, pipeline bubbles, collective args, steady state, flows)."""
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.outputs.trace import distributed_info, write_trace
    from meshsim.sim.results.simulate import simulate

    synthetic, log = simulated(ranks=(0, 1))
    pipeline = simulate(load_and_resolve("llama2-70b-h100-pp4"))
    kinds: set[str] = set()
    for result, events in ((synthetic, log.events), (pipeline, pipeline.events)):
        kinds |= {e["name"] for e in trace_events(events, result.critical_path, result=result) if e.get("cat") == "wait"}
        text = write_trace(tmp_path / "t.json", events, result.critical_path, result=result).read_text()
        doc = trace_document(trace_events(events, result.critical_path, result=result), distributed_info(result))
        assert text.startswith('{"traceEvents":' + json.dumps(doc["traceEvents"], separators=(",", ":")) + ",")
        assert json.loads(text) == doc
    assert kinds == {"wait", "pipeline bubble"} and pipeline.steady_state.path == "extrapolated"  # both waits
