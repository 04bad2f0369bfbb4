"""meshsim search: on generated small spaces its winner is the exhaustive sweep's (step equal to 1e-12),
what it prunes is provably slower, its counts add up, it resumes from the sweep store, and bad --fix /
--space are one-line errors with exit status 2."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshsim.sim.search.screen_pool as screen_pool
import meshsim.sim.search.workers as workers_module
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.api import search as api_search
from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import UserError
from meshsim.sim.search.bound import lower_bound
from meshsim.sim.search.bound_types import PriceCache
from meshsim.sim.search.branch import search
from meshsim.sim.search.cheap_bound import cheap_bound, stage_passes
from meshsim.sim.search.screen import Candidate, Variants, screen
from meshsim.sim.search.space import build_space, layouts, parse_assignment
from meshsim.sim.sweep.explain_terms import sweet_spot
from meshsim.sim.sweep.record import run_point

FIXED = {"fsdp": (False,), "cp": (1,), "embedding_in_split": (False,), "loss_in_split": (False,)}
MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def small(gpus: int = 8, moe: bool = False, **extra):
    """tiny-2gpu (2 layers, hidden 256) on `gpus` GPUs of a DGX H100, global batch 16."""
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": gpus, "parallel.global_batch": 16, "model.layers": 4, "model.seq_len": 256, **(MOE if moe else {}), **extra}
    return with_overrides(scenario, over, source), source


def exhaustive(scenario, source, fixed, opened):
    """Every layout of the space simulated (the sweep's run_point), the sweet spot's record."""
    variants = Variants(scenario, source)
    records = []
    for layout in layouts(scenario, build_space(scenario, fixed, opened)):
        try:
            base = variants(layout)
        except Exception:  # a variant the schema refuses: refused in search too
            continue
        records.append(run_point(base, source, layout.point))
    return sweet_spot(records), records


SPACES = st.fixed_dictionaries({
    "tp": st.sampled_from(["1,2", "2,4", "1,4,8"]),
    "pp": st.sampled_from(["1", "1,2", "2,4"]),
    "vp": st.sampled_from(["1", "1,2"]),
    "micro_batch": st.sampled_from(["1", "1,2", "2"]),
    "recompute": st.sampled_from(["none", "none,full", "selective,full"]),
    "tp_comm_overlap": st.sampled_from(["off", "both"]),
    "cp": st.sampled_from(["1", "1,2"]),
    "fsdp": st.sampled_from(["off", "both"]),
    "fp8": st.sampled_from(["off", "off,tensorwise"]),
    "embedding_in_split": st.sampled_from(["off", "both"]),
})


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(space=SPACES, moe=st.booleans(), host_us=st.sampled_from([None, 200.0]))
def test_search_finds_the_exhaustive_sweeps_winner(space, moe, host_us):
    extra = {"hardware.compute.host_dispatch_us": host_us} if host_us else {"run.cuda_graphs": True}
    scenario, source = small(moe=moe, **extra)
    opened = dict(parse_assignment("--space", f"{k}={v}", False) for k, v in space.items())
    if moe:
        opened |= dict([parse_assignment("--space", "ep=2,4", False), parse_assignment("--space", "etp=1", False)])
    fixed = {"dist_opt_instances": (1,), "loss_in_split": (False,)}
    result = search(scenario, source, fixed=fixed, opened=opened)
    best, records = exhaustive(scenario, source, fixed, opened)
    assert (result.winner is None) == (best is None)
    if best is None:
        return
    assert result.proven
    assert result.winner.step_s == pytest.approx(best.result.step_time_s, rel=1e-12, abs=0)
    assert len([r for r in records if r.fits]) == len([e for e in result.entries if e.record is None or e.record.fits])
    for e in result.entries:  # what was pruned: its bound is at least the winner's step
        if e.record is None:
            assert e.bound.step_s >= result.winner.step_s
        else:
            assert e.bound.step_s <= e.step_s


@pytest.fixture(scope="module")
def plain():
    """The search of small() over FIXED, in one process and without a store: several tests read the same
    search (each asserts its own facts about it), so it runs once per file."""
    scenario, source = small()
    return search(scenario, source, fixed=FIXED)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The same search with a store (out_dir): the result and the folder it wrote, which each test copies
    before writing to it (copy_store)."""
    scenario, source = small()
    out = tmp_path_factory.mktemp("search-store")
    return search(scenario, source, fixed=FIXED, out_dir=out), out


def copy_store(stored, tmp_path):
    """The stored search's folder, copied into this test's tmp_path (a test's writes stay its own)."""
    shutil.copytree(stored[1], tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_counts_add_up_and_the_winner_is_proven(plain):
    result = plain
    assert result.searched == result.refused_total + result.out_of_memory + len(result.entries)
    assert len(result.simulated) + result.pruned == len(result.entries)
    assert result.proven and result.stop_reason.startswith("the next bound")
    assert result.pruned > 0  # negative control: a bound that never prunes would simulate everything
    bounds = [e.bound.step_s for e in result.entries]
    assert bounds == sorted(bounds)


def test_within_error_lists_every_simulated_layout_inside_the_band(plain):
    result = plain
    limit = result.winner.step_s * (1 + result.band.mape)
    inside = {e.key for e in result.simulated if e.step_s is not None and e.step_s <= limit} - {result.winner.key}
    assert {e.key for e in result.within_error} == inside
    assert all(e.bound.step_s >= limit or e.record is not None for e in result.entries)


def test_resumes_from_the_sweep_store(stored, tmp_path, monkeypatch):
    scenario, source = small()
    first = stored[0]
    copy_store(stored, tmp_path)
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[2])
        return run_point(*args, **kwargs)

    again = search(scenario, source, fixed=FIXED, out_dir=tmp_path, runner=counting)
    assert calls == [] and again.winner.key == first.winner.key and again.winner.step_s == first.winner.step_s


def test_api_search_takes_command_line_text():
    scenario, source = small()
    result = api_search(scenario, source, fix={"tp": "2", "fsdp": "off", "cp": "1"}, space={"pp": "1,2"})
    assert {e.layout.point.tp for e in result.entries} == {2}
    assert result.winner is not None and result.proven


def test_cli_search_writes_report_and_json(tmp_path, capsys):
    code = main(["search", "tiny-2gpu", "--gpus", "4", "--fix", "fsdp=off", "--fix", "cp=1", "--space", "pp=1,2",
                 "--jobs", "1", "--no-progress", "--out", str(tmp_path), "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    prose = " ".join(out.split())  # rich wraps prose at the console's width (COLUMNS differs under xdist)
    assert "is the fastest layout of the space under meshsim's model" in prose and "pruned by the bound" in prose
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["proven_optimal"] and doc["searched"] == sum(doc["refused"].values()) + doc["out_of_memory"] + len(
        doc["layouts"])
    assert "Lower bound against the simulated step" in (tmp_path / "report.html").read_text()


BAD = {
    "--fix without =": (["--fix", "tp"], "--fix"),
    "--fix with two values": (["--fix", "tp=2,4"], "give one value with --fix"),
    "--fix unknown axis": (["--fix", "tpp=2"], "did you mean tp?"),
    "--space bad integer": (["--space", "tp=two"], "'two' is not a positive integer"),
    "--space bad recompute": (["--space", "recompute=some"], "recompute"),
    "--space bad switch": (["--space", "sp=maybe"], "on, off or both"),
    "--space bad cp_comm": (["--space", "cp_comm=ring"], "p2p"),
    "--fix and --space on one axis": (["--fix", "tp=2", "--space", "tp=2,4"], "not both"),
    "--space bad recompute module": (["--space", "recompute_modules=attn+mlp"], "'attn' is not a module"),
    "--space bad dispatcher": (["--space", "dispatcher=deepep"], "not a moe dispatcher"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_fix_and_space_are_one_line_errors(case, capsys):
    args, needle = BAD[case]
    code = main(["search", "tiny-2gpu", "--no-progress", *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], err
    assert needle in lines[0], lines[0]


def test_a_rerun_reads_the_bounds_back_and_does_not_bound_again(stored, tmp_path, monkeypatch):
    scenario, source = small()
    first = stored[0]
    copy_store(stored, tmp_path)
    assert first.bounds_reused == 0 and (tmp_path / "bounds.jsonl").exists()
    with (tmp_path / "bounds.jsonl").open("a") as fh:  # a killed writer's half line: skipped, not fatal
        fh.write('{"version": 2, "digest": "')

    def refuse(*args, **kwargs):
        raise AssertionError("bounded again")

    monkeypatch.setattr(screen_pool, "cheap_bound", refuse)
    monkeypatch.setattr(workers_module, "lower_bound", refuse)
    again = search(scenario, source, fixed=FIXED, out_dir=tmp_path)
    assert again.bounds_reused == len(first.entries) + first.refined
    assert [(e.key, e.bound.step_s, e.bound.level) for e in again.entries] == \
        [(e.key, e.bound.step_s, e.bound.level) for e in first.entries]
    assert again.winner.key == first.winner.key and again.proven


def test_only_the_layouts_that_reach_the_front_are_refined(plain):
    """The lazy queue: layouts whose cheap bound is already past the best step and its band are never
    refined (negative control: a search that refined everything would have refined == legal)."""
    result = plain
    limit = result.winner.step_s * (1 + result.band.mape)
    assert 0 < result.refined < len(result.entries)
    assert all(e.cheap.step_s >= limit for e in result.entries if e.refined is None)
    assert all(e.refined is not None for e in result.simulated)


@pytest.mark.parametrize("moe", [False, True])
def test_shared_prices_equal_fresh_ones(moe):
    """PriceCache (one coster per mesh, one compute model per recipe, block costs and pass gaps kept by value
    across layouts: cheap_bound.py step 7) gives every layout of a space the same bounds, to the bit, as
    pricing it alone; the space holds layouts that share blocks (recompute, TP overlap, FSDP, EP overlap
    on one mesh), and the cache did share them (negative control)."""
    scenario, source = small(moe=moe)
    opened = {"tp": (1, 2, 4), "pp": (1, 2), "cp": (1, 2), "fsdp": (False, True), "recompute": ("none", "full")} | (
        {"ep": (1, 2, 4), "ep_overlap": (False, True)} if moe else {})
    variants = Variants(scenario, source)
    cache = PriceCache()
    seen = shared = 0
    # every 2nd layout (56 legal: each pair of axis values), or with MoE every 5th of 3,456 (a stride prime to
    # the axes' sizes, 2 and 3: every pair of axis values among the 1,040 legal ones, 210 of them; every 2nd
    # priced 960 and never a legal EP-overlap one, the fastest axis but one)
    ep_overlap = False
    for layout in layouts(scenario, build_space(scenario, FIXED | {"micro_batch": (1,)} | {
            k: v for k, v in opened.items() if k in ("fsdp", "cp")}, opened))[::5 if moe else 2]:
        outcome = screen(layout, variants)
        if not isinstance(outcome, Candidate):
            continue
        ep_overlap = ep_overlap or ("parallel.moe_ep_overlap", True) in layout.variant
        before = len(cache.blocks)
        assert cheap_bound(outcome.rs, cache=cache) == cheap_bound(outcome.rs)
        assert lower_bound(outcome.rs, cache=cache) == lower_bound(outcome.rs)
        needed = sum(len({(id(b[0]), b[1], b[2]) for run in stage for b in run}) for stage in stage_passes(outcome.rs))
        shared += needed - (len(cache.blocks) - before)  # blocks this layout found in the cache
        seen += 1
    assert seen >= 8 and ep_overlap == moe
    assert shared > 0  # layouts found their blocks' costs in the cache


def test_moe_axes_are_searched_with_the_scenario_rules():
    """The dispatcher, EP overlap and recompute-module axes: enumerated in canonical form, legality from the
    scenario checks (a refusal is filed under the rule's field, as for the other axes)."""
    scenario, source = small(moe=True)
    space = build_space(scenario, FIXED | {"micro_batch": (1,), "tp": (1,)},
                        {"ep": (1, 2), "recompute": ("none", "selective", "full"),
                         "recompute_modules": parse_assignment("--space", "recompute_modules=moe_act+mlp,none",
                                                               False)[1]})
    assert space.of("moe_dispatcher") == ("alltoall", "allgather", "flex") and space.of("ep_overlap") == (False, True)
    todo = layouts(scenario, space)
    variant = [dict((k.split(".")[-1], v) for k, v in lay.variant) for lay in todo]
    assert not any(v.get("delay_wgrad_compute") and not v.get("moe_ep_overlap") for v in variant)
    assert all(lay.point.recompute == "selective" or "recompute_modules" not in v for lay, v in zip(todo, variant, strict=True))
    assert any(v.get("recompute_modules") == ("moe_act", "mlp") for v in variant)
    variants = Variants(scenario, source)
    outcomes = [screen(lay, variants) for lay in todo]
    rules = {o.rule for o in outcomes if hasattr(o, "rule")}
    assert "parallel.moe_ep_overlap" in rules  # EP overlap with ep 1, the allgather dispatcher or full recompute
    legal = [o.layout for o in outcomes if isinstance(o, Candidate)]
    assert any(("parallel.moe_ep_overlap", True) in lay.variant for lay in legal)
    assert {dict(lay.variant).get("parallel.moe_dispatcher", "alltoall") for lay in legal} == {"alltoall", "allgather",
                                                                                               "flex"}


def test_screening_in_worker_processes_gives_the_same_search(plain, monkeypatch):
    """screen_pool with 2 forked workers: every count, every cheap bound and the winner as in one process
    (`plain`, jobs=1; which layouts get refined may differ: 2 jobs take 2 layouts from the front at a time)."""
    monkeypatch.setattr(screen_pool, "CHUNK", 8)
    scenario, source = small()
    one = plain
    two = search(scenario, source, fixed=FIXED, jobs=2)
    assert len(one.entries) > 2 * screen_pool.CHUNK  # the pool path ran
    assert (one.searched, one.out_of_memory, one.refused) == (two.searched, two.out_of_memory, two.refused)
    assert sorted((e.key, e.cheap) for e in one.entries) == sorted((e.key, e.cheap) for e in two.entries)
    assert one.winner.key == two.winner.key and one.winner.step_s == two.winner.step_s


def test_default_vp_values_are_those_the_scenario_checks_accept():
    """vp derived per pp from the layer count (space.py vp_values): every vp with which resolving the
    scenario at that pp and a split option searched passes the pipeline rules, and no other; 80 layers at
    pp 4 hold NeMo's Llama 3 70B vp 5 (a power-of-two axis would miss it)."""
    scenario, source = small(gpus=16, **{"model.layers": 12})
    space = build_space(scenario, FIXED | {"micro_batch": (1,)}, {"pp": (1, 2, 3, 4, 6)})
    for pp, derived in space.vp_by_pp:
        accepted = set()
        for vp in range(1, 16):
            try:
                resolve(with_overrides(scenario, {"parallel.pp": pp, "parallel.vp": vp}, source), source)
            except UserError as err:
                if err.field in ("parallel.pp", "parallel.vp"):
                    continue
            accepted.add(vp)
        assert set(derived) == accepted, (pp, derived, accepted)
    assert dict(space.vp_by_pp)[4] == (1, 3) and dict(space.vp_by_pp)[2] == (1,)  # p2p_overlap: vp > 1 needs pp > 2
    assert {lay.point.vp for lay in layouts(scenario, space) if lay.point.pp == 3} == {1, 2, 4}
    big, _ = small(gpus=64, **{"model.layers": 80})
    assert 5 in dict(build_space(big, FIXED, {"pp": (4,)}).vp_by_pp)[4]


def test_ray_simulations_give_the_same_search(tmp_path):
    """--ray: the simulations in flight go through run_sweep's Ray path (sim/search/workers.py); the winner,
    its step and the layouts the proof needs (bound below the winner's step: simulated by any order) are the
    local search's, and the sweep store holds a record of every layout simulated."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'meshsim[ray]')")
    scenario, source = small()
    local = search(scenario, source, fixed=FIXED | {"micro_batch": (1,)}, jobs=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = search(scenario, source, fixed=FIXED | {"micro_batch": (1,)}, jobs=2, ray="local", out_dir=tmp_path)
    finally:
        ray.shutdown()
    assert (remote.winner.key, remote.winner.step_s, remote.proven) == (local.winner.key, local.winner.step_s, True)
    proof = [{e.key for e in r.simulated if e.bound.step_s < r.winner.step_s} for r in (local, remote)]
    assert proof[0] == proof[1] and proof[0]
    assert (tmp_path / "sweep.jsonl").read_text().count("\n") == len(remote.simulated)
