"""simulate.gc_frozen: the collector is off inside the block and back as it was after; without `program` the
block's objects go back to the collector, with `program` (the meshsim program, which ends after the block) they stay
frozen, so no collection rescans them on the way out. Results do not depend on the collector."""

from __future__ import annotations

import gc

from meshsim.sim.results.simulate import gc_frozen


def test_gc_frozen_restores_the_collector_and_keeps_the_block_objects_frozen_only_when_asked():
    was = gc.isenabled()
    try:
        with gc_frozen():
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]
        assert gc.isenabled() == was and gc.get_freeze_count() == 0
        with gc_frozen(program=True):
            made = [[i] for i in range(1000)]
        assert gc.isenabled() == was and gc.get_freeze_count() >= len(made)
    finally:
        gc.unfreeze()
