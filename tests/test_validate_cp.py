"""Context-parallel attention for real (one spawn of 4 gloo processes for every check in this file): the KV
ring (p2p, GQA) and the all-to-all (a2a) with causal load balancing, also with MLA's shapes (V narrower than
Q and K), equal the single-process attention in output and dQ, dK, dV on every rank, forward and backward;
their messages equal the simulator's schedule; the negative controls (chunks not load-balanced) fail."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from meshsim.validate.launch.launch import launch  # noqa: E402
from meshsim.validate.numerics.cp_check import CpVariant, call_diffs, expected_calls, payload  # noqa: E402

pytestmark = pytest.mark.slow
# MLA's shapes: V (and the output) narrower than Q and K, every head its own KV head (head_dim 16, v 8)
PASSING = [CpVariant("p2p-gqa", "p2p", 4), CpVariant("a2a", "a2a", 4, kv_heads=4),
           CpVariant("p2p-mla", "p2p", 4, kv_heads=4, v_head_dim=8), CpVariant("a2a-mla", "a2a", 4, kv_heads=4,
                                                                              v_head_dim=8)]
FAULTY = [CpVariant("p2p-wrong_chunks", "p2p", 4, fault="wrong_chunks"),
          CpVariant("a2a-wrong_chunks", "a2a", 4, kv_heads=4, fault="wrong_chunks")]
VARIANTS = PASSING + FAULTY


@pytest.fixture(scope="module")
def per_rank():
    return launch("cp_numerics", payload(VARIANTS), 4, timeout_s=120.0)


def test_ring_and_a2a_match_the_reference_on_every_rank(per_rank):
    for rank, results in enumerate(per_rank):
        for v in PASSING:
            assert results[v.name]["errors"] == [], (rank, v.name)


def test_wrong_chunk_order_fails(per_rank):
    for v in FAULTY:
        assert any(per_rank[r][v.name]["errors"] for r in range(4)), v.name


def test_messages_equal_the_schedule(per_rank):
    for v in PASSING:
        want = expected_calls(v)
        assert want, v.name
        for rank in range(4):
            assert call_diffs(per_rank[rank][v.name]["calls"], want) == [], (rank, v.name)


def test_ring_message_order_and_sizes(per_rank):
    """cp 4, GQA 4/2, b 2, 16 local tokens, d 16: K + V = 2 x 2 x 2 x 16 x 16 = 2,048 elements per shift;
    3 forward shifts, then KV, KV + dKV twice, dKV."""
    calls = per_rank[0]["p2p-gqa"]["calls"]
    assert [(c["name"].split(".", 2)[2], c["numel"]) for c in calls] == [
        ("fwd.cp_ring_c0", 2048), ("fwd.cp_ring_c1", 2048), ("fwd.cp_ring_c2", 2048),
        ("bwd.cp_ring_c0", 2048), ("bwd.cp_ring_c1", 4096), ("bwd.cp_ring_c2", 4096), ("bwd.cp_ring_c3", 2048)]


def test_an_mla_ring_shift_carries_both_widths(per_rank):
    """p2p-mla: 16 local tokens x b 2 x 4 heads x (K 16 + V 8) = 3,072 elements per forward shift, what the
    schedule's MLA model sends (cp_ops.Widths), against 2 x 16 x 16 x 4 = 4,096 at one width."""
    calls = per_rank[0]["p2p-mla"]["calls"]
    assert [c["numel"] for c in calls if ".fwd." in c["name"]] == [3072] * 3


def test_an_mla_variant_needs_a_kv_head_per_head():
    """The schedule's MLA model has one KV head per head: a GQA variant with MLA's widths is refused, not
    compared with a schedule of other shapes."""
    with pytest.raises(ValueError, match="kv_heads = heads"):
        expected_calls(CpVariant("gqa-mla", "p2p", 4, kv_heads=2, v_head_dim=8))
