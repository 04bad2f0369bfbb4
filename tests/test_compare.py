"""meshsim compare: side-by-side rows with deltas, merged Perfetto trace (from files or re-simulated)."""

from __future__ import annotations

import json

import pytest

from meshsim.sim.core.errors import UserError
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.results.step_result import StepResult, upgrade_result_dict
from meshsim.sim.sweep.compare import category_rows, compare_files, headline_rows, load_results, merge_traces


def result(name, step, compute, exposed, idle, *, mem=50.0, tp_share=0.2):
    return {"scenario": name, "step_time_s": step, "tokens_per_s": 1e6 / step, "tflops_per_gpu": 300.0 / step,
            "mfu": 0.3 / step, "memory_gb": {"total": mem, "capacity": 80.0, "fits": mem <= 80.0},
            "breakdown_s": {"compute": compute, "tp_comm": 0.3, "dp_comm": 0.1, "exposed_comm": exposed,
                            "idle": idle},
            "critical_path_share": {"compute": 1 - tp_share, "tp_comm": tp_share, "dp_comm": 0.0, "waiting": 0.0}}


def trace(pids, flow_ids, prefix="sim"):
    events = []
    for pid in pids:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{prefix} rank {pid}"}})
        events.append({"name": "gemm", "ph": "X", "ts": 0.0, "dur": 5.0, "pid": pid, "tid": 1})
    for fid in flow_ids:
        events.append({"name": "critical path", "ph": "s", "id": fid, "ts": 0.0, "pid": pids[0], "tid": 1})
        events.append({"name": "critical path", "ph": "f", "bp": "e", "id": fid, "ts": 5.0, "pid": pids[-1], "tid": 1})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def test_rows_and_deltas_from_files_with_the_old_key_names():
    """The fixtures use the keys results had before the breakdown and GB/s renames: still read."""
    a, b = result("x", 2.0, 1.5, 0.4, 0.1), result("y", 2.5, 1.6, 0.8, 0.1, mem=90.0)
    row = {"op": "all_reduce", "group": "tp", "ranks": 8, "nbytes": 1024}
    a["collectives"] = [{**row, "busbw_gbps": 100.0, "algbw_gbps": 50.0}]
    assert upgrade_result_dict(a)["collectives"] == [{**row, "busbw_GBps": 100.0, "algbw_GBps": 50.0}]
    a, b = StepResult.from_dict(a), StepResult.from_dict(b)  # from_dict upgrades old keys itself
    assert a.collectives == (CollectiveRow("all_reduce", "tp", 8, 1024, busbw_gbps=100.0, algbw_gbps=50.0),)
    cats = {r["key"]: r for r in category_rows(a, b)}
    assert cats["busy.compute_busy"]["delta"] == pytest.approx(1.6 - 1.5)
    assert cats["busy.compute_waiting"]["a"] == pytest.approx(2.0 - 1.5)  # step - compute busy
    assert cats["step"]["delta_pct"] == pytest.approx(100 * (2.5 - 2.0) / 2.0)
    assert cats["critical_path.tp_comm"]["a"] == pytest.approx(0.2 * 2.0)
    assert cats["critical_path.tp_comm"]["name"] == "critical path: exposed TP communication"  # for people
    cp = [r for r in category_rows(a, b) if r["key"].startswith("critical_path.")]
    assert sum(r["b"] for r in cp) == pytest.approx(cats["step"]["b"])  # the critical-path rows add up
    head = {r["name"]: r for r in headline_rows(a, b)}
    assert head["tokens/s"]["delta_pct"] == pytest.approx(100 * (1e6 / 2.5 - 1e6 / 2.0) / (1e6 / 2.0))
    assert head["memory per GPU (GiB)"]["delta"] == pytest.approx(40.0 * 1e9 / 2**30)


def test_configuration_difference_comes_first_with_per_gpu_throughput(tmp_path, capsys):
    from rich.console import Console

    from meshsim.sim.sweep.compare import config_rows, print_comparison

    a = {**result("x", 2.0, 1.5, 0.4, 0.1), "gpus": 64, "tp": 8, "dp": 8, "sp": True, "recompute": "none",
         "micro_batch": 1, "topology": "dgx-h100"}
    b = {**a, "gpus": 8, "dp": 1, "tokens_per_s": 0.1e6 / 2.0}
    rows = config_rows(StepResult.from_dict(a), StepResult.from_dict(b))
    assert [r["name"] for r in rows if r["differs"]] == ["dp", "gpus"]  # in the config echo's order
    assert [r["name"] for r in rows[:2]] == ["dp", "gpus"] and not rows[2]["differs"]
    assert {"name": "pp", "a": 1, "b": 1, "differs": False} in rows  # absent pp reads 1
    head = {r["name"]: r for r in headline_rows(StepResult.from_dict(a), StepResult.from_dict(b))}
    assert head["tokens/s"]["delta_pct"] == pytest.approx(-90.0)
    assert head["tokens/s per GPU"]["a"] == pytest.approx(1e6 / 2.0 / 64)
    assert head["tokens/s per GPU"]["delta_pct"] == pytest.approx(100 * (0.1 / 8 - 1 / 64) / (1 / 64))
    for side, res in (("a", a), ("b", b)):
        (tmp_path / side).mkdir()
        (tmp_path / side / "results.json").write_text(json.dumps(res))
        (tmp_path / side / "trace.json").write_text(json.dumps(trace([0], [1])))
    cmp = compare_files(tmp_path / "a" / "results.json", tmp_path / "b" / "results.json", out_dir=tmp_path / "c")
    page = (tmp_path / "c" / "compare.html").read_text()
    assert cmp["page"] == str(tmp_path / "c" / "compare.html") and "<script" not in page
    assert page.index("gpus") < page.index("Headline") and "tokens/s per GPU" in page and "trace.json" in page
    console = Console(width=100, record=True)
    print_comparison(cmp, console)
    text = console.export_text()
    assert text.index("* gpus") < text.index("Headline") and "1e+" not in text


def test_merge_keeps_runs_apart():
    doc = merge_traces(trace([0, 1], [1, 2])["traceEvents"], trace([0, 1], [1])["traceEvents"], "A: x", "B: y")
    events = doc["traceEvents"]
    assert len(events) == (2 * 2 + 2 * 2) + (2 * 2 + 1 * 2)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "A: x sim rank 0", 1: "A: x sim rank 1", 2: "B: y sim rank 0", 3: "B: y sim rank 1"}
    flow_ids = [e["id"] for e in events if e["ph"] == "s"]
    assert len(set(flow_ids)) == 3
    b_gemms = [e for e in events if e.get("name") == "gemm" and e["pid"] >= 2]
    assert len(b_gemms) == 2


def test_compare_files_merges_traces_beside_results(tmp_path):
    for side, res, pids in (("a", result("x", 2.0, 1.5, 0.4, 0.1), [0]), ("b", result("x", 3.0, 2.0, 0.9, 0.1), [0, 1])):
        (tmp_path / side).mkdir()
        (tmp_path / side / "results.json").write_text(json.dumps(res))
        (tmp_path / side / "trace.json").write_text(json.dumps(trace(pids, [1])))
    out = tmp_path / "cmp"
    cmp = compare_files(tmp_path / "a" / "results.json", tmp_path / "b" / "results.json", out_dir=out)
    assert cmp["labels"] == ["A: x (a)", "B: x (b)"]
    merged = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert sorted({e["pid"] for e in merged}) == [0, 1, 2]
    assert json.loads((out / "compare.json").read_text())["categories"][0]["name"] == "critical path: compute"


def test_bad_results_file_is_a_user_error(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("{not json")
    with pytest.raises(UserError, match="Not JSON"):
        load_results(path)
    path.write_text(json.dumps({"step_time_s": 1.0}))
    with pytest.raises(UserError, match="tokens_per_s is missing"):
        load_results(path)


def _run(tmp_path, name, overrides, *, with_trace):
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.outputs.trace import write_trace
    from meshsim.sim.results.simulate import simulate_with_events

    scenario, source = load_scenario("tiny-2gpu")
    res, log, _ = simulate_with_events(resolve(with_overrides(scenario, overrides, source), source))
    out = tmp_path / name
    out.mkdir()
    (out / "results.json").write_text(json.dumps(res.to_dict()))
    if with_trace:
        write_trace(out / "trace.json", log.events, res.critical_path, result=res)
    return out / "results.json", res


def test_compare_real_runs_resimulated_equals_written_traces(tmp_path):
    """A results.json without trace.json is re-simulated; the merged trace equals the one from files."""
    a, res_a = _run(tmp_path, "tp2", {}, with_trace=True)
    b, res_b = _run(tmp_path, "tp2sp", {"parallel.sp": True}, with_trace=True)
    from_files = compare_files(a, b, out_dir=tmp_path / "f")
    (a.parent / "trace.json").unlink()
    (b.parent / "trace.json").unlink()
    replayed = compare_files(a, b, out_dir=tmp_path / "r")
    assert from_files["note"] == replayed["note"] == ""
    assert json.loads((tmp_path / "f" / "trace.json").read_text()) == json.loads((tmp_path / "r" / "trace.json").read_text())
    step = {r["name"]: r for r in replayed["categories"]}["step"]
    assert step["delta"] == pytest.approx(res_b.step_time_s - res_a.step_time_s, rel=1e-12)


def test_compare_cli(tmp_path):
    from meshsim.sim.cli.main import main

    a, _ = _run(tmp_path, "one", {}, with_trace=True)
    assert main(["compare", str(a), str(a), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "trace.json").is_file()
    assert main(["compare", str(a), str(tmp_path / "missing.json")]) == 2


def test_the_configuration_names_every_echoed_setting_that_differs():
    """cp, ep, fp8 and the rest of the config echo (results.ConfigEcho) are compared, not a fixed subset:
    an FP8 MoE run against a BF16 one with cp shows fp8, cp and cp_comm as differences, a key echoed on one
    side only reads '-' on the other, and list / section values print readably."""
    from meshsim.sim.sweep.compare import config_rows
    from meshsim.sim.sweep.compare_page import fmt_value

    a = {**result("x", 2.0, 1.5, 0.4, 0.1), "tp": 1, "dp": 8, "gpus": 8, "cp": 1, "ep": 8, "fp8": "off"}
    b = {**a, "dp": 4, "cp": 2, "cp_comm": "p2p", "fp8": "tensorwise"}
    rows = {r["name"]: r for r in config_rows(StepResult.from_dict(a), StepResult.from_dict(b))}
    assert {k for k, r in rows.items() if r["differs"]} == {"dp", "cp", "cp_comm", "fp8"}
    assert (rows["cp_comm"]["a"], rows["ep"]["differs"]) == (None, False)
    assert fmt_value(["mla_up_proj", "mlp"]) == "mla_up_proj, mlp" and fmt_value({"name": "muon"}) == "name=muon"
    assert fmt_value({"cpu_offload": True}) == "cpu_offload=on" and fmt_value([]) == "-"
