"""parallel.moe_ep_overlap with pp > 1: the interleaved pipeline's combined 1F1B (sim/schedule/pipeline.py
Combined, sim/schedule/pipeline_combined.py): the stage order (one more warm-up forward, steady pairs merged,
P2P posted inside or after), Megatron's issue order inside a merged step of two different chunks, the
all-to-alls of one micro-batch under another's compute on every stage, and the negative control (overlap
off: today's schedule and figure). Steady-state exactness: tests/test_steady_state.py."""

from __future__ import annotations

import pytest
from test_ep_overlap import overlapping, tiny

from meshsim.sim.cost.memory import in_flight_micro_batches
from meshsim.sim.results.simulate import simulate_with_events
from meshsim.sim.schedule.pipeline import Combined, PipelineShape, describe, stage_order
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

PP2 = {"parallel.pp": 2, "parallel.vp": 2, "model.layers": 4, "parallel.p2p_overlap": False, "parallel.ep": 4}
# PP2 without the overlap, as main computes it (re-pinned with the attention rate by GPU, by head width
# (tiny-2gpu's heads are 64 wide), with split-K of the tiny model's small GEMMs, and at the sustained GEMM
# ceiling of a training step, issue 42)
OFF_STEP_S = 0.005172570077355575


def pp2(on: bool):
    """tiny MoE (2 MoE layers of 8 experts, top 2), pp 2 x vp 2 (one layer per chunk), ep 4, 8 micro-batches."""
    return tiny({**PP2, "parallel.moe_ep_overlap": on}, micro_batches=4, gpus=8)


def test_the_steady_pairs_merge_after_one_more_warm_up_forward():
    """pp 2, v 2, 4 micro-batches, blocking P2P: stage 0 warms up with 2 (p - 1) + (v - 1) N + 1 = 5 forwards
    (schedules.py L966-970), then merges F(k) with B(k - 5), each merged step followed by one blocking batch.
    With P2P overlap (p 3) the batches are posted inside the merged step, forward's first."""
    s = PipelineShape(p=2, v=2, m=4, n=2, overlap=False, combined=True)
    assert describe(stage_order(s, 0), 2) == [
        "F0.c0", "send_fwd(0.c0)", "F1.c0", "send_fwd(1.c0)+recv_fwd(0.c1)", "F0.c1", "send_fwd(0.c1)+recv_fwd(1.c1)",
        "F1.c1", "send_fwd(1.c1)", "F2.c0", "send_fwd(2.c0)+recv_bwd(0.c1)",
        "F3.c0+B0.c1", "send_fwd(3.c0)+send_bwd(0.c1)+recv_fwd(2.c1)+recv_bwd(1.c1)",
        "F2.c1+B1.c1", "send_fwd(2.c1)+send_bwd(1.c1)+recv_fwd(3.c1)+recv_bwd(0.c0)",
        "F3.c1+B0.c0", "send_fwd(3.c1)+recv_bwd(1.c0)",
        "B1.c0", "recv_bwd(2.c1)", "B2.c1", "send_bwd(2.c1)+recv_bwd(3.c1)", "B3.c1", "send_bwd(3.c1)+recv_bwd(2.c0)",
        "B2.c0", "recv_bwd(3.c0)", "B3.c0"]
    # the last stage: without the extra forward F0.c1 would be merged with its own backward B0.c1
    s = PipelineShape(p=3, v=2, m=3, n=3, overlap=True, combined=True)
    assert describe(stage_order(s, 2), 2)[7:12] == [
        "F0.c1", "recv_fwd(1.c1)", "F1.c1+B0.c1 [recv_fwd(2.c1)] [send_bwd(0.c1)]", "F2.c1+B1.c1 [send_bwd(1.c1)]",
        "B2.c1"]
    plain = PipelineShape(p=3, v=2, m=3, n=3, overlap=True)
    assert not any(isinstance(step, Combined) for r in range(3) for step in stage_order(plain, r))


def blocks(ops) -> list[tuple]:
    """Runs of consecutive ops of one (block, micro-batch, phase, stream): the issue order, compressed."""
    out: list[tuple] = []
    for op in ops:
        key = (op.name.split(".")[0], op.micro_batch, op.phase, op.stream)
        if not out or out[-1] != key:
            out.append(key)
    return out


def test_a_merged_step_issues_megatrons_order_for_two_different_chunks():
    """Stage 0's F3.c0 + B0.c1: chunk 0 (embedding, layer L0) forward of micro-batch 3 with chunk 1 (layer L2)
    backward of micro-batch 0, in TransformerModelChunkSchedulePlan.run's order (L500-630): the embedding,
    then TransformerLayerSchedulePlan.run (L236-303): b.combine (ep_comm), f.pre_dispatch (its token-count
    all-gather on ep_comm), b.mlp, f.dispatch, b.dispatch, f.mlp, f.combine, b.pre_dispatch; then the
    blocking batch of the step."""
    ops = build_stage_schedules(pp2(True))[0].ops
    first = next(op.id for op in ops if op is not None and op.name.startswith("embed.mb3.fwd"))
    last = next(op.id for op in ops[first:] if op.name.startswith("pp."))
    f, b = ("L0", 3, "fwd"), ("L2", 0, "bwd")
    assert blocks(ops[first:last + 1]) == [
        ("embed", 3, "fwd", "compute"), (*b, "ep_comm"), (*f, "compute"), (*f, "ep_comm"), (*f, "compute"),
        (*b, "compute"), (*f, "ep_comm"), (*b, "ep_comm"), (*f, "compute"), (*f, "ep_comm"), (*b, "compute"),
        ("pp", 3, "fwd", "pp_comm")]
    assert ops[last].name == "pp.send_fwd+send_bwd+recv_fwd+recv_bwd_c0.mb3"


def hidden_all_to_alls(on: bool) -> tuple[float, dict[int, int]]:
    """(step, per stage: forward dispatch all-to-alls that overlap in time a backward compute op of another
    micro-batch on the same rank)."""
    result, log, _ = simulate_with_events(pp2(on))
    hidden = {}
    for sched, rank in zip(build_stage_schedules(pp2(on)), log.ranks, strict=True):
        a2a = [op for op in sched.ops if op.phase == "fwd" and op.name.endswith(".dispatch")]
        comp = [op for op in sched.ops if op.stream == "compute" and op.phase == "bwd"]
        hidden[sched.stage] = sum(any(y.micro_batch != x.micro_batch and overlapping(log, x, y, rank) for y in comp)
                                  for x in a2a)
    return result.step_time_s, hidden


def test_the_all_to_alls_of_one_micro_batch_run_under_anothers_compute_on_every_stage():
    """On: on both stages forward dispatch all-to-alls run under another micro-batch's backward compute and
    the step is shorter; off (negative control): none does, and the step is main's figure to the last bit."""
    on_s, on = hidden_all_to_alls(True)
    off_s, off = hidden_all_to_alls(False)
    assert off == {0: 0, 1: 0} and off_s == OFF_STEP_S
    assert on[0] > 0 and on[1] > 0 and on_s < off_s


def test_one_more_warm_up_forward_holds_one_more_chunk_of_activations():
    on, off = pp2(True), pp2(False)
    for stage in (0, 1):
        assert in_flight_micro_batches(on, stage) - in_flight_micro_batches(off, stage) == pytest.approx(1 / 2)
