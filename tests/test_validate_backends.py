"""Backends and timeouts of validate's process groups, and the backend's trip through --dump-payload /
torchrun / --from-results. No GPU needed: torch.distributed's group creation is replaced by a recorder,
so these check what validate asks torch for (the NCCL path itself is exercised only on a GPU node)."""

from __future__ import annotations

import datetime
import json
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from meshsim.sim.cli import launch_args  # noqa: E402
from meshsim.sim.core.errors import UserError  # noqa: E402
from meshsim.validate.calibrate import calibration as calibrate  # noqa: E402
from meshsim.validate.calibrate import sampling  # noqa: E402
from meshsim.validate.launch import launch  # noqa: E402
from meshsim.validate.launch.shrink import GPU_TIMING, NUMERICS, TIMING, shrink  # noqa: E402
from meshsim.validate.printing import print_crosscheck  # noqa: E402
from meshsim.validate.stack import groups  # noqa: E402
from meshsim.validate.timing import worker as timing  # noqa: E402


@pytest.fixture
def fake_world(monkeypatch):
    """A 4-rank world seen from rank 1 whose new_group records (ranks, timeout, backend)."""
    made = []

    def new_group(ranks, timeout=None, backend=None):
        made.append((list(ranks), timeout, backend))
        return object()

    def set_backend(name):
        monkeypatch.setattr(dist, "get_backend", lambda group=None: name)

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(groups, "_timeout", datetime.timedelta(seconds=42))
    set_backend("nccl")
    return made, set_backend


def test_numerics_mesh_uses_gloo_groups_under_nccl_with_the_timeout(fake_world):
    made, _ = fake_world
    mesh, names = groups.build_mesh(2, 2, cpu=True)
    assert [m[0] for m in made] == [[0, 1], [2, 3], [0, 2], [1, 3]]  # every group, same order on every rank
    assert all(t == datetime.timedelta(seconds=42) and backend == "gloo" for _, t, backend in made)
    assert names == {id(mesh.tp_group): "tp", id(mesh.dp_group): "dp"}  # the op-count id() map


def test_timing_mesh_keeps_the_default_backend(fake_world):
    made, _ = fake_world
    groups.build_mesh(2, 2)
    assert made and all(backend is None and timeout == datetime.timedelta(seconds=42)
                        for _, timeout, backend in made)


def test_cpu_mesh_under_gloo_keeps_the_default_backend(fake_world):
    made, set_backend = fake_world
    set_backend("gloo")
    groups.build_mesh(4, 1, [[0, 1], [2, 3]], cpu=True)
    assert [m[0] for m in made] == [[0, 1, 2, 3], [0, 1], [2, 3]]
    assert all(backend is None for _, _, backend in made)


def test_calibration_groups_share_the_helper(fake_world):
    made, _ = fake_world
    mine = calibrate._groups_of(2)
    assert [m[0] for m in made] == [[0, 1], [2, 3]]
    assert all(backend is None and timeout == datetime.timedelta(seconds=42) for _, timeout, backend in made)
    assert mine is not None


def test_init_process_group_records_its_timeout_for_subgroups(monkeypatch):
    seen = {}
    monkeypatch.setattr(groups, "_timeout", None)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(kw))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # leave this test process alone
    monkeypatch.setattr(launch, "pin_to_core", lambda r: None)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launch.init_process_group("gloo", 42.0) == (0, 1)
    assert seen["timeout"] == datetime.timedelta(seconds=42) == groups._timeout


def test_worker_runs_the_payloads_backend():
    assert launch.payload_backend({"backend": "nccl"}, None) == "nccl"
    assert launch.payload_backend({"backend": "gloo"}, "gloo") == "gloo"
    assert launch.payload_backend({}, "gloo") == "gloo"
    with pytest.raises(ValueError, match="payload was made for nccl"):
        launch.payload_backend({"backend": "nccl"}, "gloo")


def test_worker_entry_refuses_a_backend_mismatch(tmp_path, capsys):
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps({"backend": "nccl"}))
    with pytest.raises(SystemExit) as exc:
        launch.main(["selftest", str(payload), "--out", str(tmp_path / "res"), "--backend", "gloo"])
    assert exc.value.code == 2 and "payload was made for nccl" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()  # refused before joining any group


def test_dumped_payload_carries_the_backend_it_was_shrunk_for(tmp_path):
    from meshsim.scenarios.load import load_scenario
    from meshsim.sim.cli.main import main

    path = tmp_path / "cal.json"
    argv = ["calibrate", "tiny-2gpu", "--nproc", "2", "--backend", "nccl", "--dump-payload", str(path)]
    assert main(argv) == 0
    payload = json.loads(path.read_text())
    sc, src = load_scenario("tiny-2gpu")
    assert payload["backend"] == "nccl"
    assert payload["scenario"]["model"]["seq_len"] == shrink(sc, 2, GPU_TIMING, src).model.seq_len
    assert payload["scenario"]["model"]["seq_len"] != shrink(sc, 2, TIMING, src).model.seq_len


def test_check_runs_on_gloo_whatever_the_gpus(tmp_path, monkeypatch):
    from meshsim.sim.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a 1-GPU node
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    path = tmp_path / "num.json"
    assert main(["validate", "tiny-2gpu", "--check", "--nproc", "2", "--dump-payload", str(path)]) == 0
    assert json.loads(path.read_text())["backend"] == "gloo"
    assert main(["validate", "tiny-2gpu", "--check", "--nproc", "2", "--backend", "nccl"]) == 2
    assert main(["validate", "tiny-2gpu", "--check", "--nproc", "0"]) == 2
    assert main(["validate", "tiny-2gpu", "--nproc", "2", "--backend", "nccl"]) == 2  # cross-check: 1 GPU


def test_from_results_takes_the_results_backend():
    rows = [{"rank": 0, "backend": "nccl"}, {"rank": 1, "backend": "nccl"}]
    assert launch_args.results_backend(rows, None, 2) == "nccl"  # even on this CPU-only machine
    with pytest.raises(UserError, match="measured with nccl"):
        launch_args.results_backend(rows, "gloo", 2)
    with pytest.raises(UserError, match="--nproc 2"):
        launch_args.results_backend(rows, None, 4)
    assert launch_args.results_backend([{"rank": 0}], "gloo", 1) == "gloo"  # results from before the key


def _report(numerics_ok, error_pct=5.0) -> dict:
    share = {c: {"simulated": 0.5, "measured": 0.5} for c in ("compute", "tp_comm", "dp_comm", "waiting")}
    return {"scenario": "s", "numerics_ok": numerics_ok, "simulated_step_s": 1.05, "measured_step_s": 1.0,
            "error_pct": error_pct, "simulated_serial_s": 1.2, "error_serial_pct": 20.0,
            "replayed_step_s": 1.0, "timed_step_s": 1.1,
            "categories": {"compute": {"simulated_s": 0.5, "measured_s": 0.5, "error_pct": 0.0}},
            "critical_path_agreement": {"share": share, "jaccard": 1.0, "on_both": 3, "only_simulated": [],
                                        "only_measured": []}}


def test_crosscheck_exit_status_fails_on_numerics():
    assert print_crosscheck(_report(False), None, None) == 1
    assert print_crosscheck(_report(False), None, 50.0) == 1
    assert print_crosscheck(_report(True), None, None) == 0
    assert print_crosscheck(_report(None), None, None) == 0  # numerics not run
    assert print_crosscheck(_report(True, error_pct=60.0), None, 50.0) == 1


@pytest.fixture
def world1():
    """A one-rank gloo group in this process, so the worker tasks really run."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    dist.destroy_process_group()


def test_worker_results_carry_the_backend(world1, monkeypatch):
    from meshsim.scenarios.load import load_scenario

    sc, src = load_scenario("tiny-2gpu")
    payload = {"scenario": shrink(sc, 1, NUMERICS, src).model_dump(mode="json"), "source": src,
               "warmup": 0, "repeats": 1, "numerics": None}
    assert timing.timing_task(payload)["backend"] == "gloo"
    monkeypatch.setattr(sampling, "WARMUP", 0)
    assert calibrate.calibrate_task(payload)["backend"] == "gloo"
