"""validate/noise.py: the spread of repeated timings, golden on injected samples, and the refusal to write a
calibrated profile from timings that disagree (issue 43: +166% to +465% on a busy machine, no warning)."""

from __future__ import annotations

import json

import pytest

from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import EXIT_USER_ERROR, CommandFailed
from meshsim.validate import noise

QUIET, LOAD = (0.1, 2), (3.5, 2)


def test_spread_is_the_decile_range_over_the_median():
    # 1..11: p10 = 2, p90 = 10 (inclusive quantiles), median 6 -> 8/6
    assert noise.spread([float(x) for x in range(1, 12)]) == pytest.approx(8 / 6)
    assert noise.spread([2.0] * 30) == 0.0
    assert noise.spread([1.0]) == 0.0 and noise.spread([]) == 0.0


def test_one_stray_repeat_does_not_make_a_machine_noisy_but_many_do():
    steady = [1.0] * 29 + [5.0]  # one time slice lost in 30 rounds
    assert noise.spread(steady) < 0.2
    busy = [1.0, 2.5, 1.2, 3.0, 1.1, 4.0] * 5  # a third of the rounds stretched by other processes
    assert noise.spread(busy) > 1.0 > noise.MAX_SPREAD


def test_round_totals_reduce_over_ranks_as_the_profile_does():
    # per_rank[rank][item][round]: two ranks, two items, two rounds
    rank0 = [[1.0, 2.0], [10.0, 20.0]]
    rank1 = [[3.0, 4.0], [30.0, 40.0]]
    assert noise.round_totals([rank0, rank1], collective=False) == [22.0, 33.0]  # means: 2 + 20, 3 + 30
    assert noise.round_totals([rank0, rank1], collective=True) == [11.0, 22.0]  # mins: 1 + 10, 2 + 20


def _samples(rounds: list[float], items: int = 3) -> list[list[float]]:
    """items x rounds, each item taking 1/items of the round's total."""
    return [[t / items for t in rounds] for _ in range(items)]


def _per_rank(compute_rounds, collective_rounds, memory_rounds=None) -> list[dict]:
    memory_rounds = memory_rounds or [1.0] * len(compute_rounds)
    rank = {"compute": _samples(compute_rounds), "memory": _samples(memory_rounds, 4),
            "collectives": _samples(collective_rounds)}
    return [rank, rank]


def test_calibration_noise_is_its_noisiest_phase():
    quiet = [1.0, 1.02, 0.99, 1.01, 1.0] * 6
    busy = [1.0, 2.0, 1.1, 3.0, 1.0] * 6
    found = noise.calibration_noise(_per_rank(quiet, busy), LOAD)
    assert found.what == "collectives rounds" and found.samples == 30 and found.too_noisy()
    assert found.spread == pytest.approx(noise.spread(busy))
    calm = noise.calibration_noise(_per_rank(quiet, quiet), QUIET)
    assert calm.spread == pytest.approx(0.03) and not calm.too_noisy()  # negative control


def test_refusal_is_one_line_exit_2_naming_spread_load_bound_and_flag():
    busy = noise.calibration_noise(_per_rank([1.0, 2.0, 1.1, 3.0, 1.0] * 6, [1.0] * 30), LOAD)
    with pytest.raises(CommandFailed) as raised:
        noise.refuse_noisy_profile(busy, accept=False)
    message = str(raised.value)
    assert raised.value.exit_code == EXIT_USER_ERROR and "\n" not in message
    assert f"{noise.MAX_SPREAD:.0%}" in message and noise.ACCEPT_FLAG in message
    assert "over 30 compute rounds" in message and "load 3.5 per core (2 cores)" in message
    noise.refuse_noisy_profile(busy, accept=True)  # the user insists: no raise
    noise.refuse_noisy_profile(noise.calibration_noise(_per_rank([1.0] * 30, [1.0] * 30), QUIET), accept=False)


def test_step_noise_warns_only_beyond_the_bound():
    assert noise.noisy_step_warning(noise.step_noise([0.050, 0.051, 0.050, 0.052, 0.050], QUIET)) is None
    warning = noise.noisy_step_warning(noise.step_noise([0.050, 0.120, 0.050, 0.200, 0.060], LOAD))
    assert warning is not None and "5 timed steps" in warning and f"{noise.MAX_SPREAD:.0%}" in warning


def test_load_per_core_reads_the_os():
    load, cores = noise.load_per_core()
    assert cores >= 1 and (load is None or load >= 0.0)


# ----- end to end: `meshsim calibrate --from-results` with injected timings ------------------------------
def _results(scale_by_round: list[float]) -> list[dict]:
    """Worker results of task "calibrate" for tiny-2gpu on 2 gloo ranks, every item's round k taking
    1 ms x scale_by_round[k] (the shapes of the real payload: one list per compute work, memory size and
    collective point)."""
    pytest.importorskip("torch")
    from meshsim.scenarios.load import load_scenario
    from meshsim.validate.calibrate.calibration import (
        MEM_SIZES,
        calibration_payload,
        collective_points,
        compute_works,
    )
    from meshsim.validate.timing.measured import schedule_of

    sc, source = load_scenario("tiny-2gpu")
    shrunk, _ = calibration_payload(sc, source, 2, "gloo")
    schedule = schedule_of(shrunk, source)
    rounds = [1e-3 * s for s in scale_by_round]
    rank = {"backend": "gloo", "device": "test cpu",
            "compute": [list(rounds) for _ in compute_works(schedule)],
            "memory": [[r * n / MEM_SIZES[0] for r in rounds] for n in MEM_SIZES],
            "collectives": [list(rounds) for _ in collective_points(schedule, 2, gpu=False)]}
    return [{**rank, "rank": 0}, {**rank, "rank": 1}]


@pytest.mark.parametrize("case", ["quiet", "busy", "busy-accepted"])
def test_calibrate_refuses_to_write_a_profile_from_noisy_timings(case, tmp_path, capsys):
    scale = [1.0, 1.01, 0.99, 1.0, 1.02] * 6 if case == "quiet" else [1.0, 2.0, 1.1, 3.5, 1.0] * 6
    results, out = tmp_path / "results.json", tmp_path / "profile.yaml"
    results.write_text(json.dumps(_results(scale)))
    argv = ["calibrate", "tiny-2gpu", "--nproc", "2", "--backend", "gloo", "--from-results", str(results),
            "--out", str(out)] + (["--accept-noise"] if case == "busy-accepted" else [])
    code = main(argv)
    captured = capsys.readouterr()
    if case == "busy":
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert code == EXIT_USER_ERROR and len(lines) == 1 and "Traceback" not in captured.err, captured.err
        assert "not writing a calibrated profile" in lines[0] and "30%" in lines[0] and "--accept-noise" in lines[0]
        assert not out.exists()
        return
    assert code == 0, captured.err
    text = out.read_text()
    assert "timing_noise" in text and "timing noise: spread" in captured.out
    assert ("accepted" in text) == (case == "busy-accepted")
