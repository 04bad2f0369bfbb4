"""Fixtures shared by several test files."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(scope="module")
def world1():
    """A one-rank gloo group in this process, so the dist calls really run (skipped without torch; a group
    another fixture already initialised is reused and left alone)."""
    dist = pytest.importorskip("torch.distributed")
    mine = not dist.is_initialized()
    if mine:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    if mine:
        dist.destroy_process_group()


def pytest_sessionfinish(session):
    """Stop the fork server validate's launcher started in this process (validate/launch/launch.py), and wait
    for it: no process outlives the session, and its workers' CPU time is counted with this process's."""
    import multiprocessing.forkserver as forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()
