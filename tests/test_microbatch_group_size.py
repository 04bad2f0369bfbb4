"""The interleaved schedule with parallel.microbatch_group_size N != pp (Megatron's
--microbatch-group-size-per-virtual-pipeline-stage): every N Megatron accepts builds a step that runs,
in Megatron's order, and every N it refuses is one line, exit 2.

The expected orders come from a transcription of Megatron-LM d98e8a64dd
megatron/core/pipeline_parallel/schedules.py written here independently of sim/schedule/pipeline.py:
get_schedule_table (L989-1016), get_pp_rank_microbatches' warm-up count (L929-986), the warm-up /
steady / cool-down loops (L1573-2070) and recv_tensor_from_previous_stage (L1285-1332), whose leading
stage receives what the ending stage sent p - 1 entries earlier (the mechanism main lacked: with N != p
stage 0 waited for a tensor the last stage had not yet sent, a deadlock).
"""

from __future__ import annotations

import itertools

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.cli.main import main
from meshsim.sim.engine import events as engine
from meshsim.sim.results.simulate import simulate, simulate_steady
from meshsim.sim.schedule import pipeline
from meshsim.sim.schedule.ops import P2P
from meshsim.sim.schedule.pipeline import Combined, Comm, Compute, PipelineShape, stage_order
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

DL3 = """name: dl
model: {layers: 8, hidden: 1024, heads: 8, seq_len: 1024, vocab: 32000}
hardware: {gpu: h100-sxm}
topology: {preset: dgx-h100, nodes: 1}
parallel: {tp: 1, pp: 2, vp: 2, gpus: 2, global_batch: 8, p2p_overlap: false, microbatch_group_size: 4}
"""
DL4 = """name: dl
model: {layers: 8, hidden: 1024, heads: 8, seq_len: 1024, vocab: 32000}
hardware: {gpu: h100-sxm}
topology: {preset: dgx-h100, nodes: 1}
parallel: {tp: 1, pp: 4, vp: 2, gpus: 4, global_batch: 16, microbatch_group_size: 6}
"""


# ----- Megatron, transcribed ------------------------------------------------------------------------
def megatron_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """get_schedule_table: (microbatch_id, model_chunk_id) per virtual micro-batch id."""
    table = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        table.extend((mb, c) for c in range(v) for mb in range(lo, hi))
    return table


def megatron_accepts(p: int, m: int, n: int) -> bool:
    """The ValueError (N outside [p, M]) and RuntimeError (0 < M mod N < p) of L1160-1180."""
    return p <= n <= m and not 0 < m % n < p


def megatron_stage(p: int, r: int, m: int, v: int, n: int, combined: bool = False):
    """(computes, receives) of stage r: computes as 'F3.c1' / 'B0.c0' in order; receives as
    {direction: [chunk received, ...]} in the order Megatron posts them."""
    table = megatron_table(m, v, n)
    total = len(table)
    warm = min(2 * (p - r - 1) + (v - 1) * n + combined, total)

    def chunk(k: int, forward: bool) -> int:
        c = table[k % total][1]
        return c if forward else v - 1 - c

    def recv_from_previous(k: int, forward: bool) -> tuple[bool, int]:
        leading = r == 0 if forward else r == p - 1
        last_chunk = v - 1 if forward else 0
        if not leading:
            return True, chunk(k + 1, forward)
        recv = True
        if k < p - 1:
            recv, nxt = False, chunk(k + 1, forward)
        else:
            nxt = chunk(k - (p - 1), forward)
        if nxt == last_chunk:
            recv = False
        return recv, nxt + (1 if forward else -1)

    computes = [f"F{table[k][0]}.c{table[k][1]}" for k in range(total)]
    order = computes[:warm]
    bwd = [f"B{table[k][0]}.c{v - 1 - table[k][1]}" for k in range(total)]
    for k in range(total - warm):
        order += [computes[warm + k], bwd[k]]
    order += bwd[total - warm:]
    recvs: dict[str, list[int]] = {"fwd": [0] if r != 0 else [], "bwd": []}
    for k in range(total):
        ok, c = recv_from_previous(k, True)
        if ok and k != total - 1:
            recvs["fwd"].append(c)
        if k == warm - 1 and r != p - 1:  # the first gradient, received as the warm-up ends (or after it)
            recvs["bwd"].append(v - 1)
    for k in range(total):
        ok, c = recv_from_previous(k, False)
        if ok and k != total - 1:
            recvs["bwd"].append(c)
    return order, recvs


def accepted_cases(pps=(2, 3, 4), vps=(2, 3), extra=(0, 1, 2, 3)):
    """(p, v, m, n) with n != p somewhere: for each p, group sizes p..2p+1 and m = a few sizes around
    multiples of n, kept only where Megatron accepts them."""
    out = set()
    for p, v in itertools.product(pps, vps):
        for n in range(p, 2 * p + 2):
            for m in {n, 2 * n, *(2 * n + e for e in extra), *(n + p + e for e in extra)}:
                if megatron_accepts(p, m, n):
                    out.add((p, v, m, n))
    return sorted(out)


# ----- the schedule, as data --------------------------------------------------------------------------
def meshsim_stage(shape: PipelineShape, r: int):
    computes, recvs, seen, early = [], {"fwd": [], "bwd": []}, set(), []
    steps = stage_order(shape, r)
    flat = []
    for s in steps:
        flat += [s.f, Comm(s.posts[0].transfers if s.posts else ()), s.b, *s.posts[1:]] if isinstance(s, Combined) else [s]
    for s in flat:
        if isinstance(s, Compute):
            computes.append(f"{s.kind}{s.micro_batch}.c{s.chunk}")
            key = ("fwd" if s.kind == "F" else "bwd", s.micro_batch, s.chunk)
            vq = s.chunk * shape.p + r
            first = vq == 0 if s.kind == "F" else vq == shape.p * shape.v - 1
            if not first and key not in seen:
                early.append(key)
        else:
            for t in s.transfers:
                if not t.send:
                    recvs[t.direction].append(t.chunk)
                    seen.add((t.direction, t.micro_batch, t.chunk))
    return computes, recvs, early


@pytest.mark.parametrize("overlap", [False, True])
def test_every_accepted_group_size_follows_megatrons_table_and_receives(overlap):
    """Per stage: the F/B order is Megatron's for that N, the receives name Megatron's chunks in Megatron's
    order (the leading stage's ahead-of-use receives included), and no compute runs before its input
    is received."""
    cases = accepted_cases(pps=(2, 3, 4, 5), vps=(2, 3, 4))
    assert sum(n != p for p, _, _, n in cases) > 100
    for p, v, m, n in cases:
        shape = PipelineShape(p, v, m, n, overlap)
        for r in range(p):
            order, recvs = megatron_stage(p, r, m, v, n)
            computes, got, early = meshsim_stage(shape, r)
            assert computes == order, (p, v, m, n, r)
            assert got == recvs, (p, v, m, n, r)
            assert early == [], (p, v, m, n, r)


def test_the_combined_1f1b_follows_the_same_rule():
    for p, v, m, n in accepted_cases(pps=(3, 4), vps=(2, 3)):
        shape = PipelineShape(p, v, m, n, True, combined=True)
        for r in range(p):
            order, recvs = megatron_stage(p, r, m, v, n, combined=True)
            computes, got, early = meshsim_stage(shape, r)
            assert (computes, got, early) == (order, recvs, []), (p, v, m, n, r)


def test_the_leading_stage_receives_ahead_of_use_with_n_above_p():
    """p 2, v 2, N 4, m 4 without overlap: stage 0 receives (0.c1) right after F1.c0, two entries before it
    runs F0.c1 (Megatron's fwd_recv_buffer of N - p + 1 = 3 slots); main asked for it after F3.c0."""
    steps = pipeline.describe(stage_order(PipelineShape(2, 2, 4, 4, False), 0), 2)
    assert steps[:8] == ["F0.c0", "send_fwd(0.c0)", "F1.c0", "send_fwd(1.c0)+recv_fwd(0.c1)",
                         "F2.c0", "send_fwd(2.c0)+recv_fwd(1.c1)", "F3.c0", "send_fwd(3.c0)+recv_fwd(2.c1)"]


def test_with_n_equal_p_the_receives_are_the_next_entrys_input():
    """N = p (the default): the leading stage's rule names table[k + 1], so schedules without the option
    are unchanged (golden figures stand)."""
    for p, v in itertools.product((2, 3, 4, 8), (2, 3, 4)):
        for m in (p, 2 * p, 3 * p):
            table = pipeline.schedule_table(m, v, p)
            for r, direction in ((0, "fwd"), (p - 1, "bwd")):
                tab = table if direction == "fwd" else [(mb, v - 1 - c) for mb, c in table]
                for k in range(len(tab) - 1):
                    got = pipeline.received_after(PipelineShape(p, v, m, p, False), r, direction, tab, k)
                    first_chunk = 0 if direction == "fwd" else v - 1
                    assert got == (None if tab[k + 1][1] == first_chunk else tab[k + 1])


# ----- the step runs ----------------------------------------------------------------------------------
def rs_of(p: int, v: int, m: int, n: int, overlap: bool):
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": p, "parallel.tp": 1, "parallel.sp": False, "parallel.dp": "auto",
            "model.layers": p * v, "parallel.pp": p, "parallel.vp": v, "parallel.p2p_overlap": overlap,
            "parallel.microbatch_group_size": n, "parallel.global_batch": m * 2, "parallel.micro_batch": 2}
    return resolve(with_overrides(scenario, over, source), source)


def engine_cases():
    cases = []
    for p, v, m, n in accepted_cases(extra=(0, 1)):
        for overlap in (False, True):
            if overlap and p == 2:
                continue  # meshsim (and Megatron) refuse overlapped interleaving at pp 2
            if n != p or m == 2 * p:
                cases.append((p, v, m, n, overlap))
    return cases


@pytest.mark.parametrize(("p", "v", "m", "n", "overlap"), engine_cases())
def test_the_step_runs_every_op_on_every_stage(p, v, m, n, overlap):
    """The engine runs every op of every stage (it raises 'deadlock' otherwise), every transfer meets its
    peer once, and the compute ops run in Megatron's order."""
    rs = rs_of(p, v, m, n, overlap)
    schedules = build_stage_schedules(rs)

    def compute_s(op, rank):
        return 1e-3 if op.phase == "bwd" else 5e-4

    def free(*_):
        return 0.0, 0.0, {}

    log = engine.run(schedules, tuple(range(p)), compute_s, free, rs.group, stage_of=rs.stage_of, p2p=free,
                     engine="python")
    assert len(log.events) == sum(len(s.ops) for s in schedules)
    posts: dict[tuple, list[bool]] = {}
    for s in schedules:
        for op in s.ops:
            for t in op.work.transfers if isinstance(op.work, P2P) else ():
                src, dst = (s.stage, t.peer_stage) if t.send else (t.peer_stage, s.stage)
                posts.setdefault((src, dst, t.direction, t.micro_batch, t.sender_vstage), []).append(t.send)
    assert all(sorted(x) == [False, True] for x in posts.values())
    assert len(posts) == 2 * (p * v - 1) * m
    for s in schedules:  # each block's first layer op, in the order the stage ran them
        by_rank = log.by_rank()[s.stage]
        firsts = {}
        for op in s.ops:
            if op.layer is not None and op.phase in ("fwd", "bwd"):
                firsts.setdefault((op.phase, op.micro_batch, op.layer), by_rank[op.id].start_s)
        chunks = {layer: c for c, layers in enumerate(s.meta["layers"]) for layer in layers}
        ran = {}
        for (phase, mb, layer), start in firsts.items():
            key = f"{'F' if phase == 'fwd' else 'B'}{mb}.c{chunks[layer]}"
            ran[key] = min(ran.get(key, start), start)
        order, _ = megatron_stage(p, s.stage, m, v, n)
        assert sorted(ran, key=ran.get) == order


# ----- the reproducers, the CLI ---------------------------------------------------------------------
@pytest.mark.parametrize("text", [DL3, DL4], ids=["dl3", "dl4"])
@pytest.mark.parametrize("engine_name", ["python", "compiled"])
def test_the_reproducers_run(text, engine_name, tmp_path, capsys):
    path = tmp_path / "dl.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--outputs", "none", "--engine", engine_name]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("sets", "value", "fragment"), [
    (["parallel.microbatch_group_size=3"], "3", "pp <= microbatch_group_size <= micro-batches"),
    (["parallel.microbatch_group_size=17"], "17", "pp <= microbatch_group_size <= micro-batches"),
    (["parallel.microbatch_group_size=7"], "7", "16 mod microbatch_group_size 7 = 2"),
    (["parallel.microbatch_group_size=6", "parallel.global_batch=14"], "6", "14 mod microbatch_group_size 6 = 2"),
])
def test_group_sizes_megatron_refuses_are_one_line_exit_2(sets, value, fragment, tmp_path, capsys):
    path = tmp_path / "dl.yaml"
    path.write_text(DL4)
    argv = ["run", str(path), "--outputs", "none"] + [x for s in sets for x in ("--set", s)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: {path}: parallel.microbatch_group_size = {value} is invalid"), err
    assert fragment in err and "Megatron-LM's interleaved schedule" in err and "Fix: " in err


def test_the_accepted_sizes_named_by_the_fix_all_run(tmp_path, capsys):
    """The refusal's fix lists the sizes that work; the checks accept exactly Megatron's set."""
    path = tmp_path / "dl.yaml"
    path.write_text(DL4)
    for n in range(1, 20):
        argv = ["run", str(path), "--outputs", "none", "--set", f"parallel.microbatch_group_size={n}"]
        assert main(argv) == (0 if megatron_accepts(4, 16, n) else 2), n
        capsys.readouterr()


def test_an_engine_deadlock_is_one_line_naming_an_internal_error(tmp_path, capsys, monkeypatch):
    """Negative control: main's receive rule (always the next entry's input) brought back deadlocks the
    step; `meshsim run` and `meshsim sweep` report it as one line, exit 1, no traceback."""
    def next_entry(shape, r, direction, table, k):
        return table[k + 1] if 0 <= k < len(table) - 1 else None

    monkeypatch.setattr(pipeline, "received_after", next_entry)
    path = tmp_path / "dl.yaml"
    path.write_text(DL3)
    for argv in (["run", str(path), "--outputs", "none", "--engine", "python"],
                 ["sweep", str(path), "--tp", "1", "--out", str(tmp_path / "sweep"), "--jobs", "1", "--engine", "python",
                  "--no-progress"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith("error: internal error (a meshsim bug") and "deadlock" in err, err


# ----- steady state ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "m", "overlap"), [(6, 60, False), (8, 64, True)])
def test_extrapolation_equals_the_whole_step_with_n_above_p(n, m, overlap):
    """pp 4, v 2, N 6 (blocking) / N 8 (overlapped): the period is one group of N; the extrapolated step
    is proven and equals --full."""
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": 4, "parallel.tp": 1, "parallel.sp": False, "parallel.dp": "auto", "model.layers": 8,
            "parallel.pp": 4, "parallel.vp": 2, "parallel.microbatch_group_size": n, "parallel.p2p_overlap": overlap,
            "parallel.global_batch": m * 2, "parallel.micro_batch": 2}
    rs = resolve(with_overrides(scenario, over, source), source)
    assert rs.micro_batches == m
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    full = simulate(rs, full=True)
    assert ex.steady_state.path == "extrapolated" and ex.steady_state.unit == n
    assert full.steady_state.path == "full"
    assert ex.step_time_s == pytest.approx(full.step_time_s, rel=1e-9, abs=0)
    for key, value in full.breakdown_s.items():
        assert ex.breakdown_s[key] == pytest.approx(value, rel=0, abs=1e-9 * full.step_time_s)
    for key, value in full.critical_path_share.items():
        assert ex.critical_path_share[key] == pytest.approx(value, rel=0, abs=1e-9)
    assert ex.ops_per_rank == full.ops_per_rank and ex.memory_gb == full.memory_gb
