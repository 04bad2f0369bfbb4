"""What `meshsim validate` and `meshsim calibrate` share: their backend and process-count checks, reading
a torchrun run's results.json back (--from-results), the default output folder, the payload written for
torchrun / SLURM (--dump-payload), and SIGTERM / Ctrl-C handling. torch is imported inside functions only
(the meshsim[validate] extra), so `meshsim --help` does not load it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

from meshsim.sim.core.errors import FilePath, UserError
from meshsim.sim.core.interrupt import Interrupted, signals_raise
from meshsim.sim.core.outfiles import check_output_file, output_folder_name
from meshsim.sim.core.text import echo_plain
from meshsim.sim.core.userio import dumps_finite, load_json

DEFAULT_CALIBRATION_SCENARIO = "tiny-2gpu"
MAX_LOCAL_NPROC = 64  # processes spawned on this machine (more: torchrun / SLURM, docs/validate.md)
MAX_REPEATS = 1_000  # timed steps of a cross-check
DEFAULT_OUT_ROOT = Path("meshsim-out")


def backend_of(backend: str | None, local: bool = True) -> str:
    """The backend; `local` (processes spawned here) also checks that CUDA devices exist for nccl."""
    import torch  # meshsim[validate] extra: optional, heavy

    if backend is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise UserError("--backend", backend, "use gloo (CPU) or nccl (CUDA GPUs)")
    if local and backend == "nccl" and torch.cuda.device_count() == 0:
        raise UserError("--backend", backend, "use --backend gloo on a machine without CUDA GPUs",
                        problem="No CUDA device is visible")
    return backend


def nproc_of(nproc: int, backend: str, local: bool = True) -> int:
    if nproc < 1:
        raise UserError("--nproc", nproc, "use 1 or more processes")
    if local and nproc > MAX_LOCAL_NPROC:
        raise UserError("--nproc", nproc, f"use at most {MAX_LOCAL_NPROC} local processes; for more launch with "
                        "torchrun (--dump-payload, docs/validate.md)")
    if local and backend == "nccl":
        import torch  # meshsim[validate] extra: optional, heavy

        if nproc > torch.cuda.device_count():
            raise UserError("--nproc", nproc, f"use at most {torch.cuda.device_count()} (one process per GPU); "
                            "for more GPUs launch with torchrun (docs/validate.md)")
    return nproc


def check_gloo_backend(backend: str | None) -> None:
    """--check runs the numerics model on CPU tensors with gloo, on any machine and any nproc; an explicit
    --backend nccl is refused rather than silently ignored."""
    if backend is None or backend == "gloo":
        return
    backend_of(backend, local=False)  # an unknown name gets the usual message
    raise UserError("--backend", backend, "drop --backend (or give gloo): --check always runs on CPU with gloo",
                    problem="--check does not use NCCL")


def results_backend(per_rank: list, backend: str | None, nproc: int) -> str:
    """The backend the workers measured on (timing and calibrate results carry it; older results fall back
    to --backend or the default), so the parent rebuilds the shrunk schedule the workers ran.
    A different --backend, or an --nproc other than the results' rank count, is refused."""
    if len(per_rank) != nproc:
        raise UserError("--nproc", nproc, f"use --nproc {len(per_rank)}, the number of ranks in the results")
    measured = per_rank[0].get("backend") if per_rank and isinstance(per_rank[0], dict) else None
    if measured is None:
        return backend_of(backend, local=False)
    if backend is not None and backend != measured:
        raise UserError("--backend", backend, f"drop --backend: the results were measured with {measured}",
                        problem="The results were measured with another backend")
    return measured


RESULTS_FIX = "give the results.json that rank 0 of `python -m meshsim.validate.launch.launch ... --out DIR` wrote into DIR"


def read_results(path: Path) -> list:
    if not path.is_file():
        raise UserError("--from-results", FilePath(path), RESULTS_FIX, problem="No such file")
    data = load_json(path, field="--from-results", fix=RESULTS_FIX)
    if not isinstance(data, list) or not data or not all(isinstance(entry, dict | list) for entry in data):
        raise UserError("--from-results", FilePath(path), RESULTS_FIX,
                        problem="Expected a list with one entry (an object, or a list for --check) per rank")
    return data


@contextlib.contextmanager
def reading_results(path: Path | None) -> Iterator[None]:
    """Turn a malformed --from-results file (a rank's entry missing a key, a string where a list of
    timings belongs, ranks of another payload) into one UserError naming it; no-op without a file."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        if path is None:
            raise
        detail = f"{type(exc).__name__}: {exc}"[:120]
        raise UserError("--from-results", FilePath(path), RESULTS_FIX + " for this scenario and --nproc",
                        problem=f"Not the results of this payload ({detail})") from None


def default_out(name: str, suffix: str = "") -> Path:
    """meshsim-out/<the scenario name as one safe folder name><suffix>: never a path outside meshsim-out/."""
    return DEFAULT_OUT_ROOT / output_folder_name(name, suffix)


def write_payload(path: Path, task: str, payload: dict, nproc: int, backend: str) -> None:
    """Write the payload with the backend it was shrunk for; the torchrun worker runs on that backend
    (validate/launch/launch.py payload_backend), so the results match the schedule rebuilt from them."""
    check_output_file("--dump-payload", path)
    path.write_text(dumps_finite({**payload, "backend": backend}))
    echo_plain(f"payload: {path} (backend {backend})\nrun it on {nproc} processes, e.g.\n  torchrun "
               f"--nproc-per-node {nproc} -m meshsim.validate.launch.launch {task} {path} --out RESULTS_DIR\nthen "
               "repeat this command with --from-results RESULTS_DIR/results.json (docs/validate.md: "
               "multi-node, SLURM)")


def interruptible(command):
    """The command with SIGTERM / Ctrl-C turned into one line and exit 128 + signal (sim/core/interrupt.py):
    the launcher's `finally` stops the workers and removes its temporary folder on the way out."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            with signals_raise():
                return command(*args, **kwargs)
        except Interrupted as stop:
            raise Interrupted(stop.signum, f"meshsim {command.__name__.removesuffix('_command')} stopped its "
                              "workers and removed its temporary folder; nothing was written") from None

    return run
