"""row_fields.ep_op_mask (the MoE all-to-all ops picked from the names' parts, only suffixes that can end such
a name tested whole) against the predicate on every whole name, name.split(".", 2)[-1] in EP_OPS: over
generated prefixes and suffixes aimed at the shortcut's edge (suffixes shorter than an EP op, a split that
falls inside the suffix or the prefix, names with fewer than two dots, near misses such as "xfwd.dispatch"),
through a StampedOps-like name_parts and through plain op records."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.results import breakdown as bd
from meshsim.sim.results import row_fields as rf

_piece = st.sampled_from(("L3.", "mb0.", "L3.mb0.", "", ".", "fwd.", "bwd", "x", "fwd.dispatch", "dispatch",
                          "combine", "bwd.combine", "d.", "fwd.dis", "patch", "xfwd.dispatch", "ine", "L1"))
_text = st.lists(_piece, max_size=4).map("".join)


class _Parts(list):
    """Ops with name_parts, as a StampedOps has them."""

    def __init__(self, prefixes, suffixes):
        super().__init__(SimpleNamespace(name=p + s) for p, s in zip(prefixes, suffixes, strict=True))
        self._parts = (list(prefixes), list(suffixes))

    def name_parts(self):
        return self._parts


@settings(max_examples=500, deadline=None, derandomize=True)
@given(pairs=st.lists(st.tuples(_text, _text), max_size=30))
def test_ep_op_mask_is_the_whole_names_test(pairs):
    want = [(p + s).split(".", 2)[-1] in bd.EP_OPS for p, s in pairs]
    ops = _Parts([p for p, _ in pairs], [s for _, s in pairs])
    assert rf.ep_op_mask(ops).tolist() == want
    records = [SimpleNamespace(name=p + s) for p, s in pairs]
    assert rf.ep_op_mask(records).tolist() == want
