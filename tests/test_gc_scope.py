"""A run never unfreezes what it did not freeze, and leaves its own objects frozen only in the `meshsim`
program (main(program=True)), which ends right after: gc.unfreeze() thaws every frozen object, so a run
inside a longer-lived process (a test, a notebook, the API, a sweep worker after the CLI froze its imports)
must neither thaw the caller's frozen objects nor leave tens of thousands of its own frozen for good."""

from __future__ import annotations

import gc

from meshsim.sim.cli.main import main
from meshsim.sim.results.simulate import gc_frozen


def tracked(obj: object) -> bool:
    """Whether the collector tracks `obj` in one of its generations (a frozen object is in none)."""
    return any(o is obj for o in gc.get_objects())


def test_gc_frozen_keeps_what_the_caller_froze_frozen():
    was = gc.isenabled()
    try:
        mine = [[i] for i in range(500)]
        gc.freeze()
        before = gc.get_freeze_count()
        assert before >= len(mine) and not tracked(mine)
        with gc_frozen():
            assert not gc.isenabled()
            [[i] for i in range(1000)]
        assert gc.isenabled() == was
        assert not tracked(mine) and gc.get_freeze_count() == before  # the old exit (gc.unfreeze) left 0
    finally:
        gc.unfreeze()
    assert tracked(mine)  # the negative control: unfreezing puts it back


def test_run_from_a_long_lived_process_leaves_no_object_frozen_and_thaws_nothing():
    try:
        mine = [[i] for i in range(500)]
        gc.freeze()
        before = gc.get_freeze_count()
        assert main(["run", "scenarios/library/tiny-2gpu.yaml", "--outputs", "none"]) == 0
        assert gc.isenabled() and not tracked(mine)  # the old gc_frozen(keep=True) entry froze, exit kept
        # frozen objects may be freed by the run (the count drops), never added: the old keep=True froze
        # the run's ~10^4 objects for good
        assert gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def test_the_program_keeps_its_objects_frozen_on_the_way_out():
    try:
        gc.unfreeze()
        with gc_frozen(program=True):
            made = [[i] for i in range(1000)]
        assert gc.get_freeze_count() >= len(made)
    finally:
        gc.unfreeze()
