"""meshsim sweep: axes, product, skip logic, resume, sweet spot, explanation, plots, backends.

The first half works on result dicts built here (every expected number is computed in the test from the
inputs); the second half runs real configurations through simulate() on small built-in scenarios.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict

import pytest

from meshsim.sim.core.errors import UserError
from meshsim.sim.results.error_band import ErrorBand, load_bands
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.sweep import explain as ex
from meshsim.sim.sweep.axes import (
    SweepAxes,
    SweepPoint,
    configurations,
    parse_int_list,
    parse_recompute,
    parse_switch,
)
from meshsim.sim.sweep.record import SweepRecord, run_point
from meshsim.sim.sweep.runner import JSONL_NAME, read_records, run_sweep
from meshsim.sim.sweep.table import table_rows

SHARES = {"compute": 0.8, "tp_comm": 0.1, "dp_comm": 0.06, "waiting": 0.04}


def rec(tp, sp=False, *, tokens, mem, cap=80.0, per_node=8, shares=None, act=10.0, step=1.0, mb=1,
        overlap=False, recompute="none", compute_s=0.8, exposed_s=0.1, tp_comm_s=0.2, collectives=()):
    """A sweep record with a hand-made StepResult; mem, cap and act in GiB (stored in GB, as results are)."""
    point = SweepPoint(tp, sp, mb, overlap, recompute)
    mem, cap, act = (v * 2**30 / 1e9 for v in (mem, cap, act))
    result = {
        "scenario": "hand-made", "layer_fwd_ms": 1.0, "layer_bwd_ms": 2.0, "tp": tp, "sp": sp, "dp": 64 // tp, "gpus_per_node": per_node, "crosses_nodes": tp > per_node,
        "tokens_per_s": tokens, "mfu": 0.4, "tflops_per_gpu": 400.0, "step_time_s": step,
        "memory_gb": {"weights": 1.0, "grads": 1.0, "optimizer": 1.0, "activations": act, "total": mem,
                      "capacity": cap, "fits": mem <= cap},
        "breakdown_s": {"compute_busy": compute_s, "tp_comm_busy": tp_comm_s, "dp_comm_busy": 0.05,
                        "exposed_comm": exposed_s, "nothing_running": 0.0, "compute_waiting": step - compute_s},
        "critical_path_share": dict(shares or SHARES), "collectives": list(collectives),
    }
    return SweepRecord.from_json({"key": point.key, "config": asdict(point), "scenario_digest": "",
                                  "status": "ok", "result": result})


def skipped(tp, sp=False, reason="parallel.tp = 3: does not divide heads"):
    point = SweepPoint(tp, sp, 1, False, "none")
    return SweepRecord.skipped(point, "", reason)


# ----- axes ---------------------------------------------------------------------------------------
def test_axis_parsing():
    assert parse_int_list("tp", "1, 2,4,2") == (1, 2, 4)
    assert parse_switch("sp", "both") == (False, True)
    assert parse_switch("sp", "ON") == (True,)
    assert parse_recompute("none,full") == ("none", "full")


@pytest.mark.parametrize("call", [lambda: parse_int_list("tp", "3x"), lambda: parse_int_list("tp", "0,2"),
                                  lambda: parse_switch("sp", "maybe"), lambda: parse_recompute("most")])
def test_bad_axis_values_raise_user_error(call):
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value) and "Fix:" in str(err.value)


def test_product_is_complete_and_keys_unique():
    axes = SweepAxes(tp=(1, 2, 4), sp=(False, True), micro_batch=(1, 2), tp_comm_overlap=(False,),
                     recompute=("none", "full"))
    points = configurations(axes)
    assert len(points) == (1 + 2 * 2) * 2 * 1 * 2  # tp 1 runs sp off only (Megatron turns SP off there)
    assert len({p.key for p in points}) == len(points)
    assert points[0] == SweepPoint(1, False, 1, False, "none")
    assert points[0].overrides()["parallel.dp"] == "auto"
    assert not any(p.sp for p in points if p.tp == 1) and sum(p.sp for p in points) == 2 * 2 * 2


def test_sp_on_at_tp_1_runs_as_sp_off_instead_of_being_skipped():
    """Megatron disables sequence parallelism at tp = 1 (arguments.py): a sweep of a scenario with sp on
    runs its tp = 1 points as sp off; a scenario file with sp on and tp 1 is still refused (named fix)."""
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides
    from meshsim.sim.sweep.axes import sweep_axes

    scenario, source = load_scenario("llama3-8b-h100-fp8")
    points = configurations(sweep_axes(scenario, {"tp": "1,2", "sp": "on", "fp8": "off"}))
    assert [(p.tp, p.sp) for p in points] == [(1, False), (2, True)]
    with pytest.raises(UserError, match="parallel.sp"):
        resolve(with_overrides(scenario, {"parallel.tp": 1, "parallel.cp": 1}, source), source)


# ----- sweet spot and explanation -----------------------------------------------------------------
def test_sweet_spot_is_fastest_that_fits():
    records = [rec(2, tokens=2000.0, mem=96.04), rec(4, tokens=1500.0, mem=70.0), rec(8, tokens=1400.0, mem=50.0)]
    assert ex.sweet_spot(records) is records[1]
    assert ex.sweet_spot([records[0], skipped(3)]) is None


def test_does_not_fit_sentence_numbers_come_from_results():
    records = [rec(2, tokens=2000.0, mem=96.04, act=41.26), rec(4, tokens=1500.0, mem=70.0)]
    text = " ".join(ex.explain(records))
    assert "tp=2 does not fit: 96 GiB of 80 GiB per GPU (activations 41.3 GiB)" in text
    assert f"it would otherwise give {100 * (2000 / 1500 - 1):.0f}% more tokens/s" in text


def test_crossing_nvlink_domain_sentence():
    cross = {"compute": 0.3, "tp_comm": 0.58, "dp_comm": 0.02, "waiting": 0.1}
    records = [rec(8, tokens=1500.0, mem=60.0), rec(16, tokens=1000.0, mem=40.0, shares=cross)]
    text = " ".join(ex.explain(records))
    expected = (f"tp=16 spans {16 // 8} nodes (8 GPUs per NVLink domain): its TP collectives run over "
                f"InfiniBand and are 58% of the critical path (vs {100 * SHARES['tp_comm']:.0f}% at tp=8); "
                f"{100 * (1 - 1000 / 1500):.0f}% fewer tokens/s")
    assert expected in text


def test_crossing_config_explained_even_when_not_adjacent():
    records = [rec(4, tokens=1600.0, mem=70.0), rec(8, tokens=1500.0, mem=60.0),
               rec(16, tokens=900.0, mem=40.0), rec(32, tokens=500.0, mem=30.0)]
    text = " ".join(ex.explain(records))
    assert "tp=16 spans 2 nodes" in text and "tp=8:" in text


def test_no_fit_names_smallest_overflow():
    records = [rec(2, tokens=2000.0, mem=120.0), rec(4, tokens=1500.0, mem=85.5), skipped(3)]
    sentences = ex.explain(records)
    assert sentences[0].startswith("No configuration fits in 80 GiB per GPU; the smallest overflow is tp=4: "
                                   f"85.5 GiB ({85.5 - 80:.1f} GiB over)")
    assert not any("does not divide heads" in s for s in sentences)  # skipped ones: one line each, beside the table


def test_sp_sentence_reports_activation_saving():
    ar = {"op": "all_reduce", "group": "tp", "ranks": 8, "nbytes": 10**9, "count": 4}
    ag = {"op": "all_gather", "group": "tp", "ranks": 8, "nbytes": 10**9, "count": 6}
    records = [rec(8, False, tokens=1400.0, mem=70.0, act=30.0, tp_comm_s=0.25, collectives=[ar]),
               rec(8, True, tokens=1500.0, mem=55.0, act=15.5, tp_comm_s=0.26, collectives=[ag])]
    text = " ".join(ex.explain(records))
    off_gb, on_gb = 4 * 2 * 7 / 8, 6 * 7 / 8  # 1e9-byte units; shown in GiB
    off_gib, on_gib = off_gb * 1e9 / 2**30, on_gb * 1e9 / 2**30
    assert (f"each GPU sends {on_gib:.2f} GiB in TP collectives per step vs {off_gib:.2f} GiB with sp=off "
            f"({100 * (on_gb / off_gb - 1):+.0f}%)") in text
    assert f"sp=on saves {30.0 - 15.5:.1f} GiB of activations per GPU (30 -> 15.5 GiB)" in text
    assert "TP communication time 260 ms vs 250 ms" in text


def test_tp_wire_volume_follows_bus_convention():
    mb = 2**20
    collectives = [
        CollectiveRow("all_reduce", "tp", 8, 64 * mb, count=4),
        CollectiveRow("all_gather", "tp", 8, 64 * mb, count=2),
        CollectiveRow("all_reduce", "dp", 4, 512 * mb, count=1)]
    expected = (2 * 7 / 8 * 64 * mb * 4 + 7 / 8 * 64 * mb * 2) / 1e9
    assert ex.tp_wire_gb(collectives) == pytest.approx(expected, rel=1e-12)


def test_slower_neighbour_names_the_component_that_grew():
    records = [rec(2, tokens=1200.0, mem=70.0, compute_s=0.7, exposed_s=0.5),
               rec(4, tokens=1500.0, mem=60.0, compute_s=0.75, exposed_s=0.1)]
    text = " ".join(ex.explain(records))
    assert "tp=2: 20% fewer tokens/s with GEMM shards 2x larger; its exposed communication is 400 ms longer" in text


def test_winner_sentence():
    records = [rec(4, tokens=1_234_567.0, mem=62.34, step=2.5), rec(8, tokens=1000.0, mem=50.0), skipped(3)]
    first = ex.explain(records)[0]
    assert first.startswith("The sweet spot is tp=4: 1.23M tokens/s, MFU 40%, step 2.5 s, 62.3 of 80 GiB per GPU")
    assert "fastest of the 2 configurations that fit (2 ran, 1 skipped)" in first


# ----- plots and report ---------------------------------------------------------------------------
def test_report_page_is_self_contained_with_all_figures(tmp_path):
    from meshsim.sim.sweep.report_page import figures, write_report

    records = [rec(2, tokens=2000.0, mem=96.0), rec(4, tokens=1500.0, mem=70.0), rec(8, True, tokens=1400.0, mem=50.0)]
    path = write_report(records, ex.explain(records), "test sweep", tmp_path)
    page = path.read_text()
    assert page.count('class="plotly-graph-div"') == 3
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1  # the library embedded exactly once
    assert "The sweet spot is tp=4" in page and "<table>" in page
    throughput = figures(records)[0]
    stars = [t for t in throughput.data if t.name == "sweet spot"]
    assert stars and all(list(t.x) == [4] for t in stars)
    assert list(stars[0].y) == [1500.0]


# ----- JSON-lines resume --------------------------------------------------------------------------
calls_seen: list[str] = []


def fake_runner(scenario, source, point, digest="", files=None):
    calls_seen.append(point.key)
    return dataclasses.replace(rec(point.tp, point.sp, tokens=1000.0 * point.tp, mem=10.0), scenario_digest=digest)


@pytest.fixture
def tiny():
    from meshsim.scenarios.load import load_scenario

    return load_scenario("tiny-2gpu")


def test_resume_after_truncated_line_reruns_only_missing(tmp_path, tiny):
    scenario, source = tiny
    points = configurations(SweepAxes((1, 2, 4, 8), (False,), (1,), (False,), ("none",)))
    calls_seen.clear()
    full = run_sweep(scenario, source, points, out_dir=tmp_path, progress=False, runner=fake_runner)
    assert len(calls_seen) == 4
    log = tmp_path / JSONL_NAME
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # killed mid-write
    calls_seen.clear()
    resumed = run_sweep(scenario, source, points, out_dir=tmp_path, progress=False, runner=fake_runner)
    assert calls_seen == [points[2].key, points[3].key]
    assert resumed == full
    records, problems = read_records(log)
    assert list(records) == [p.key for p in points]
    assert len(problems) == 1 and problems[0].startswith("line 3: not JSON")  # kept, reported, skipped


def test_partial_sweep_then_full_and_scenario_change(tmp_path, tiny):
    from meshsim.scenarios.load import with_overrides

    scenario, source = tiny
    points = configurations(SweepAxes((1, 2, 4), (False,), (1,), (False,), ("none",)))
    calls_seen.clear()
    run_sweep(scenario, source, points[:1], out_dir=tmp_path, progress=False, runner=fake_runner)
    run_sweep(scenario, source, points, out_dir=tmp_path, progress=False, runner=fake_runner)
    assert calls_seen == [p.key for p in points]
    changed = with_overrides(scenario, {"model.layers": 3}, source)
    calls_seen.clear()
    run_sweep(changed, source, points, out_dir=tmp_path, progress=False, runner=fake_runner)
    assert len(calls_seen) == 3  # other scenario: nothing reused
    from meshsim.sim.sweep.axes import scenario_digest

    for sc in (scenario, changed):  # both scenarios' records stay in the store
        records, problems = read_records(tmp_path / JSONL_NAME, scenario_digest(sc, source))
        assert len(records) == 3 and not problems


# ----- end to end through simulate() --------------------------------------------------------------
SMALL = {"parallel.gpus": 8, "parallel.global_batch": 16}  # tiny-2gpu spread over a whole DGX H100


@pytest.fixture(scope="module")
def small():
    from meshsim.scenarios.load import load_scenario, with_overrides

    scenario, source = load_scenario("tiny-2gpu")
    return with_overrides(scenario, SMALL, source), source


def _one_by_one(scenario, source, point):
    from meshsim.scenarios.load import resolve, with_overrides
    from meshsim.sim.results.simulate import simulate

    return simulate(resolve(with_overrides(scenario, point.overrides(), source), source)).to_dict()


@pytest.fixture(scope="module")
def small_sweep(small):
    from meshsim.sim.sweep.axes import sweep_axes

    scenario, source = small
    points = configurations(sweep_axes(scenario, {"tp": "1,2,4,8", "sp": "both", "micro_batch": "1,2"}))
    return points, run_sweep(scenario, source, points, progress=False)


def test_sweep_best_is_argmax_of_individual_runs(small, small_sweep):
    scenario, source = small
    points, records = small_sweep
    by_key = {r.key: r for r in records}
    ran = {p.key: _one_by_one(scenario, source, p) for p in points if by_key[p.key].ok}
    assert len(ran) >= 6
    for key, res in ran.items():
        assert by_key[key].result.tokens_per_s == pytest.approx(res["tokens_per_s"], rel=1e-12)
    fitting = {k: r for k, r in ran.items() if r["memory_gb"]["fits"]}
    assert ex.sweet_spot(records).key == max(fitting, key=lambda k: fitting[k]["tokens_per_s"])


def test_invalid_configurations_are_skipped_with_reason(small_sweep):
    _, records = small_sweep
    reasons = {r.key: r.reason for r in records if not r.ok}
    tp8 = [k for k in reasons if k.startswith("tp=8,")]
    assert len(tp8) == 4 and all("model.heads = 4" in reasons[k] for k in tp8)  # tp does not divide heads
    keys = {r.key for r in records}  # tp 1 runs sp off only, as Megatron turns SP off there
    assert "tp=1,sp=on,mb=1,overlap=off,recompute=none" not in keys
    assert "tp=1,sp=off,mb=1,overlap=off,recompute=none" in keys


def test_fastest_that_does_not_fit_is_never_the_sweet_spot(small, small_sweep):
    from meshsim.scenarios.load import with_overrides

    scenario, source = small
    points, records = small_sweep
    ran = [r for r in records if r.ok]
    fastest = max(ran, key=lambda r: r.result.tokens_per_s)
    need = fastest.result.memory_gb.total
    smaller = [r for r in ran if r.result.memory_gb.total < need]
    assert smaller, "the fastest configuration also uses the least memory: no case to construct"
    cap = (need + max(r.result.memory_gb.total for r in smaller)) / 2
    tight = with_overrides(scenario, {"hardware.mem_gb": cap}, source)
    records2 = run_sweep(tight, source, points, progress=False)
    best = ex.sweet_spot(records2)
    assert best.key != fastest.key
    fitting = [r for r in records2 if r.ok and r.result.memory_gb.total <= cap]
    assert best.key == max(fitting, key=lambda r: r.result.tokens_per_s).key
    slow = {r.key: r for r in records2}[fastest.key]
    assert not slow.result.memory_gb.fits


def test_tp_beyond_one_node_is_reported_as_crossing_nvlink_domain():
    from meshsim.scenarios.load import load_scenario, with_overrides
    from meshsim.sim.sweep.axes import sweep_axes

    scenario, source = load_scenario("llama3-8b-h200")
    scenario = with_overrides(scenario, {"model.layers": 2, "topology.nodes": 2, "parallel.global_batch": 16,
                                         "model.seq_len": 2048}, source)
    points = configurations(sweep_axes(scenario, {"tp": "8,16", "sp": "on"}))
    records = run_sweep(scenario, source, points, progress=False)
    tp16 = records[1].result
    assert tp16["crosses_nodes"] and not records[0].result["crosses_nodes"]
    text = " ".join(ex.explain(records))
    share = ex.fmt_pct(tp16["critical_path_share"]["tp_comm"])
    if ex.sweet_spot(records) is records[0]:
        assert f"tp=16 spans 2 nodes (8 GPUs per NVLink domain): its TP collectives run over InfiniBand and are {share}" in text
    else:
        assert "Its TP groups span 2 nodes and talk over InfiniBand" in text


def test_process_pool_gives_identical_records(small, small_sweep):
    scenario, source = small
    points, records = small_sweep
    pooled = run_sweep(scenario, source, points[:6], jobs=2, progress=False)
    assert pooled == records[:6]


def test_ray_backend_equals_local(small, small_sweep):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'meshsim[ray]')")
    scenario, source = small
    points, records = small_sweep
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_sweep(scenario, source, points[:6], ray_address="local", progress=False)
    finally:
        ray.shutdown()
    assert remote == records[:6]


def test_cli_sweep_writes_json_report_and_resumes(tmp_path, capsys):
    from meshsim.sim.cli.main import main

    args = ["sweep", "tiny-2gpu", "--tp", "1,2,3", "--sp", "both", "--jobs", "1", "--no-progress", "--out",
            str(tmp_path)]
    assert main([*args, "--json", str(tmp_path / "s.json")]) == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    assert set(doc) == {"version", "configurations", "skipped", "sweet_spot", "explanation"}
    skipped = [s["key"] for s in doc["skipped"]]
    assert skipped and all(k.startswith("tp=3,") for k in skipped)  # 3 does not divide the 2 GPUs
    assert doc["sweet_spot"]["key"] in {c["key"] for c in doc["configurations"]}
    assert (tmp_path / "report.html").is_file()
    before = (tmp_path / JSONL_NAME).read_text()
    assert main(args) == 0  # everything is resumed: nothing appended
    assert (tmp_path / JSONL_NAME).read_text() == before


@pytest.mark.parametrize("flag,value", [("--tp", "3x"), ("--sp", "maybe"), ("--recompute", "most"),
                                        ("--micro-batch", "0")])
def test_cli_bad_axis_value_exits_2_with_one_line(flag, value, capsys):
    from meshsim.sim.cli.main import main

    assert main(["sweep", "tiny-2gpu", flag, value, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and value in err


def test_skipped_neighbour_is_passed_over_for_the_next_valid_tp():
    records = [rec(2, tokens=1000.0, mem=60.0), skipped(3), rec(4, tokens=1500.0, mem=60.0)]
    sentences = ex.explain(records)
    assert any(s.startswith("tp=2: ") for s in sentences)
    assert sum("does not divide heads" in s for s in sentences) == 0  # listed once, beside the table


def test_formatting_helpers():
    # memory held in GB (1e9 B) is shown in GiB (2^30 B): 80 GiB = 85.899 GB
    gib = 2**30 / 1e9
    assert [ex.fmt_gb(v * gib) for v in (96.04, 12.35, 1.024, 5.5, 80.0)] == ["96", "12.3", "1.02", "5.5", "80"]
    assert [ex.fmt_s(v) for v in (4.26281, 0.0123, 0.000685, 2.5e-6)] == ["4.263 s", "12.3 ms", "685 us", "2.5 us"]


def interrupted_after_two(scenario, source, point, digest="", files=None):
    """The real runner, but the third configuration 'kills' the sweep."""

    calls_seen.append(point.key)
    if len(calls_seen) == 3:
        raise KeyboardInterrupt
    return run_point(scenario, source, point, digest, files)


def counting_runner(scenario, source, point, digest="", files=None):

    calls_seen.append(point.key)
    return run_point(scenario, source, point, digest, files)


def test_interrupted_real_sweep_resumes_to_the_same_table(tmp_path, small, small_sweep):
    scenario, source = small
    points, records = small_sweep
    calls_seen.clear()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(scenario, source, points, out_dir=tmp_path, progress=False, runner=interrupted_after_two)
    assert len((tmp_path / JSONL_NAME).read_text().splitlines()) == 2
    calls_seen.clear()
    resumed = run_sweep(scenario, source, points, out_dir=tmp_path, progress=False, runner=counting_runner)
    assert calls_seen == [p.key for p in points[2:]]
    assert resumed == records
    assert table_rows(resumed) == table_rows(records)


def test_digest_ignores_swept_fields_but_not_the_model(tiny):
    from meshsim.scenarios.load import with_overrides
    from meshsim.sim.sweep.axes import scenario_digest

    scenario, source = tiny
    same = with_overrides(scenario, {"parallel.tp": 1, "parallel.sp": True, "parallel.dp": 2}, source)
    assert scenario_digest(same) == scenario_digest(scenario)
    assert scenario_digest(with_overrides(scenario, {"parallel.global_batch": 8}, source)) != scenario_digest(scenario)


def test_sweep_record_round_trips_through_json_with_its_version(tiny):
    scenario, source = tiny
    point = SweepPoint(2, True, 1, False, "none")
    record = run_point(scenario, source, point, "d1")
    line = json.loads(json.dumps(record.to_json()))
    assert line["version"] == 1 and "critical_path" not in line["result"]
    back = SweepRecord.from_json(line)
    assert back == record and back.result.tokens_per_s == record.result.tokens_per_s
    skipped_ = SweepRecord.from_json(SweepRecord.skipped(point, "d1", "why").to_json())
    assert not skipped_.ok and skipped_.reason == "why"
    with pytest.raises((ValueError, KeyError, TypeError)):
        SweepRecord.from_json({**line, "key": "tp=3,sp=on,mb=1,overlap=off,recompute=none"})


def test_configurations_closer_than_the_model_error_are_not_ranked():
    """tp=4 within the band of tp=8 is called a tie; tp=2 far below it is not named in that sentence;
    with no configuration that close, no such sentence (negative control). The band is the sweet spot's
    group's (band_of), else the default group's from the generated band file."""
    band = ErrorBand("dense", "iteration-time", 0.08, 0.2, 12)
    close = (1 - band.mape / 2) * 100.0
    records = [rec(2, tokens=50.0, mem=40), rec(4, tokens=close, mem=40), rec(8, tokens=100.0, mem=40)]
    sentence = next(s for s in ex.explain(records, lambda r: band) if "within the model's error" in s)
    assert sentence.startswith("tp=8 and tp=4 are within the model's error (±8.0% (max 20.0%): the dense group")
    assert "tp=2" not in sentence
    far = [rec(2, tokens=50.0, mem=40), rec(8, tokens=100.0, mem=40)]
    assert not any("within the model's error" in s for s in ex.explain(far, lambda r: band))
    wide = ErrorBand("dense", "iteration-time", 0.6, 0.9, 12)  # a band of 60% ties tp=2 too
    assert "tp=2" in next(s for s in ex.explain(records, lambda r: wide) if "within the model's error" in s)
    default = load_bands()["dense"]
    just_inside = [rec(4, tokens=(1 - default.mape / 2) * 100.0, mem=40), rec(8, tokens=100.0, mem=40)]
    assert any(default.sentence() in s for s in ex.explain(just_inside))
