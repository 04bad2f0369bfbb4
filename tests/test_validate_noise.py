"""validate/calibrate/noise.py: the spread of repeated timings, golden on injected samples, and the refusal to write a
calibrated profile from timings that disagree (issue 43: +166% to +465% on a busy machine, no warning)."""

from __future__ import annotations

import json

import pytest

from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import EXIT_USER_ERROR, CommandFailed
from meshsim.validate.calibrate import noise

QUIET, LOAD = (0.1, 2), (3.5, 2)


def test_excess_is_the_mean_over_the_best_repeat():
    assert noise.excess([1.0, 2.0, 3.0]) == pytest.approx(1.0)  # mean 2 over min 1
    assert noise.excess([2.0] * 30) == 0.0
    assert noise.excess([]) == 0.0 and noise.excess([0.0, 0.0]) == 0.0


def test_excess_is_weighed_by_time():
    # a 10 ms work at its best every time and a 10 us work 4x its best on average: 0.3% of the sum, not 300%
    big, small = [10e-3] * 4, [10e-6, 70e-6, 10e-6, 70e-6]
    assert noise.weighted_excess([big, small]) == pytest.approx(30e-6 / 10.01e-3)
    assert noise.weighted_excess([small]) == pytest.approx(3.0)


def test_one_stray_repeat_does_not_make_a_machine_noisy_but_many_do():
    steady = [1.0] * 29 + [5.0]  # one time slice lost in 30 rounds
    assert noise.excess(steady) < 0.2
    busy = [1.0, 2.5, 1.2, 3.0, 1.1, 4.0] * 5  # most rounds stretched by other processes
    assert noise.excess(busy) > 1.0 > noise.MAX_EXCESS


def test_over_ranks_reduces_each_round_as_the_profile_does():
    # per_rank[rank][item][round]: two ranks, two items, two rounds
    rank0 = [[1.0, 2.0], [10.0, 20.0]]
    rank1 = [[3.0, 4.0], [30.0, 40.0]]
    assert noise.over_ranks([rank0, rank1], collective=False) == [[2.0, 3.0], [20.0, 30.0]]
    assert noise.over_ranks([rank0, rank1], collective=True) == [[1.0, 2.0], [10.0, 20.0]]


def _per_rank(compute_rounds, collective_rounds, memory_rounds=None) -> list[dict]:
    """Both ranks alike: three compute works and three collectives following the given rounds."""
    memory_rounds = memory_rounds or [0.01] * len(compute_rounds)  # memory kernels: short, steady
    rank = {"compute": [list(compute_rounds)] * 3, "memory": [list(memory_rounds)] * 4,
            "collectives": [list(collective_rounds)] * 3}
    return [rank, rank]


QUIET_ROUNDS = [1.0, 1.02, 0.99, 1.01, 1.0] * 6  # mean 1.004, best 0.99
BUSY_ROUNDS = [1.0, 2.0, 1.1, 3.0, 1.0] * 6  # mean 1.62, best 1.0


def test_calibration_noise_judges_compute_and_memory_and_reports_collectives():
    found = noise.calibration_noise(_per_rank(BUSY_ROUNDS, QUIET_ROUNDS), LOAD)
    assert found.samples == 30 and found.too_noisy()
    # compute (3 works, mean 1.62 over best 1.0) and memory (4 kernels at 0.01, steady): 3 x 0.62 / 3.04
    assert found.excess == pytest.approx(3 * 0.62 / 3.04)
    assert found.collectives_excess == pytest.approx(1.004 / 0.99 - 1)
    noisy_collectives = noise.calibration_noise(_per_rank(QUIET_ROUNDS, BUSY_ROUNDS), QUIET)
    assert not noisy_collectives.too_noisy()  # negative control: gloo's waiting tail is not judged
    assert noisy_collectives.collectives_excess == pytest.approx(0.62)


def test_refusal_is_one_line_exit_2_naming_excess_load_bound_and_flag():
    busy = noise.calibration_noise(_per_rank([1.0, 3.0, 1.1, 4.0, 1.0] * 6, QUIET_ROUNDS), LOAD)
    with pytest.raises(CommandFailed) as raised:
        noise.refuse_noisy_profile(busy, accept=False)
    message = str(raised.value)
    assert raised.value.exit_code == EXIT_USER_ERROR and "\n" not in message
    assert f"{noise.MAX_EXCESS:.0%}" in message and noise.ACCEPT_FLAG in message
    assert "best of 30 repeats" in message and "load 3.5 per core (2 cores)" in message
    noise.refuse_noisy_profile(busy, accept=True)  # the user insists: no raise
    noise.refuse_noisy_profile(noise.calibration_noise(_per_rank(QUIET_ROUNDS, QUIET_ROUNDS), QUIET), accept=False)


def test_step_noise_warns_only_beyond_the_bound():
    assert noise.noisy_step_warning(noise.step_noise([0.050, 0.051, 0.050, 0.052, 0.050], QUIET)) is None
    warning = noise.noisy_step_warning(noise.step_noise([0.050, 0.120, 0.050, 0.200, 0.060], LOAD))
    assert warning is not None and "5 repeats of timed steps" in warning and f"{noise.MAX_EXCESS:.0%}" in warning


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
    scale = QUIET_ROUNDS if case == "quiet" else [1.0, 3.0, 1.1, 4.0, 1.0] * 6
    results, out = tmp_path / "results.json", tmp_path / "profile.yaml"
    results.write_text(json.dumps(_results(scale)))
    argv = ["calibrate", "tiny-2gpu", "--nproc", "2", "--backend", "gloo", "--from-results", str(results),
            "--out", str(out)] + (["--accept-noise"] if case == "busy-accepted" else [])
    code = main(argv)
    captured = capsys.readouterr()
    if case == "busy":
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert code == EXIT_USER_ERROR and len(lines) == 1 and "Traceback" not in captured.err, captured.err
        assert "not writing a calibrated profile" in lines[0] and "50%" in lines[0] and "--accept-noise" in lines[0]
        assert not out.exists()
        return
    assert code == 0, captured.err
    text = out.read_text()
    assert "timing_noise" in text and "timing noise: mean" in captured.out
    assert ("accepted" in text) == (case == "busy-accepted")


@pytest.mark.parametrize("steps_s, warned", [([0.050, 0.051, 0.050, 0.052, 0.050], False),
                                             ([0.050, 0.120, 0.050, 0.200, 0.060], True)])
def test_crosscheck_report_prints_its_noise_and_warns_beyond_the_bound(steps_s, warned, capsys):
    """The cross-check's printout (validate/printing.py) from the report's "noise" record."""
    from meshsim.sim.core.console import make_console
    from meshsim.validate.printing import _print_noise

    record = noise.step_noise(steps_s, LOAD).as_record()
    _print_noise(make_console(), record)
    out = capsys.readouterr().out
    assert "measurement noise: mean" in out and "5 repeats of timed steps" in out and "bound 50%" in out
    assert ("measured under noise" in out) == warned
