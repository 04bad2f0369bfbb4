"""FP8 ops inside a layer template: the quantize kernels before each FP8 GEMM, tensorwise's TP amax
all-reduce, the FP8 all-gathers under SP and the transposes after them (rules and sources in
sim/schedule/fp8_rules.py). Every function is a no-op (returns its deps) when the layer is 16-bit, so
16-bit schedules are unchanged op for op.

Op keys: "<gemm>_" + FP8_QUANT for a quantize kernel ("fwd.qkv_fp8_quant", "bwd.fc2_fp8_quant"),
+ FP8_AMAX for tensorwise's amax pass and + FP8_AMAX + ALL_REDUCE for its TP reduction, + FP8_TRANSPOSE
for the transpose after a gather (sim/schedule/op_keys.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.fp8_rules import (
    AMAX,
    AMAX_BYTES,
    ATTENTION_LINEARS,
    MLA_LINEARS,
    amax_reduce_bytes,
    amax_update_work,
    delayed_fp8_gemms,
    fp8_tensor_bytes,
    quantize_works,
    transpose_work,
)
from meshsim.sim.schedule.ops import Collective
from meshsim.sim.schedule.shapes import LayerDims

Deps = tuple[int | str, ...]


def quantize(tpl: Any, phase: str, d: LayerDims, key: str, elements: int, sharded: bool, deps: Deps,
             columnwise: bool = True) -> Deps:
    """Quantize a 16-bit tensor of `elements` values on this rank before FP8 GEMM `key`; returns the deps of
    its consumers. `sharded`: the tensor is sequence-sharded and all-gathered next (SP), so tensorwise
    all-reduces its amax over tp first and the tensor-scaled recipes write the rowwise copy only.
    `columnwise`: the backward needs the transposed copy too (wgrad in FP8)."""
    plan = d.fp8
    if not plan.on:
        return deps
    copies = 1 if (sharded and plan.tensor_scaled) or not columnwise or plan.transpose_free else 2
    works = quantize_works(elements, copies, plan)
    x = deps
    if plan.amax_pass and sharded and d.tp > 1:
        x = (tpl.add(phase, f"{key}_{K.FP8_AMAX}", works[0], x),)
        amax = Collective("all_reduce", "tp", AMAX_BYTES, K.FP8_AMAX)
        x = (tpl.add(phase, f"{key}_{K.FP8_AMAX}{K.ALL_REDUCE}", amax, x),)
        works = works[1:]
    for w in works:
        suffix = K.FP8_AMAX if w.kernel == AMAX else K.FP8_QUANT
        x = (tpl.add(phase, f"{key}_{suffix}", w, x),)
    return x


def fp8_gather(d: LayerDims, coll: Collective | None, both_copies: bool = False) -> Collective | None:
    """An SP all-gather of an FP8-quantized tensor moves 1 byte per value plus scales instead of 2 bytes;
    `both_copies`: the rowwise and the columnwise copy travel (blockwise / MXFP8 dY, which dgrad and wgrad
    both need and which cannot be transposed after the gather)."""
    if coll is None or not d.fp8.on or coll.op != "all_gather":
        return coll
    copies = 2 if both_copies and not d.fp8.tensor_scaled and d.fp8.wgrad else 1
    return replace(coll, nbytes=copies * fp8_tensor_bytes(coll.nbytes // d.dtype_bytes, d.fp8.recipe))


def transpose_after_gather(tpl: Any, d: LayerDims, key: str, elements: int, deps: Deps) -> Deps:
    """Tensor-scaled recipes gather rowwise FP8 only: wgrad needs the gathered tensor transposed again."""
    if not (d.fp8.on and d.fp8.tensor_scaled and d.fp8.wgrad and d.sp) or d.fp8.transpose_free:
        return deps
    return (tpl.add("bwd", f"{key}_{K.FP8_TRANSPOSE}", transpose_work(elements), deps),)


def delayed_amax_gemms(model: Any, ep: int, fp8_layers: Sequence[int]) -> int:
    """FP8 GEMMs of the delayed-scaling region (fp8_rules.delayed_fp8_gemms) over the decoder layers
    `fp8_layers` (those not kept in 16 bit) of `model` (scenarios.schema.Model) with `ep`-way experts."""
    moe, mla = model.moe, model.mla
    attention = ATTENTION_LINEARS if mla is None else MLA_LINEARS + (1 if mla.q_lora_rank else 0)
    moe_layers = sum(1 for layer in fp8_layers if moe is not None and moe.is_moe_layer(layer))
    local = moe.experts // ep if moe is not None else 0
    shared = moe is not None and moe.shared_ffn_hidden is not None
    return delayed_fp8_gemms(attention, len(fp8_layers) - moe_layers, moe_layers, local, shared)


def amax_reduce_ops(tpl: Any, fp8_gemms: int, backward: bool, history_len: int, group: str | None) -> int:
    """Delayed scaling, once per micro-batch and pass: the region's amaxes all-reduced (MAX) over the amax
    group (None: a group of one rank, which TE skips), then the fused history / scale update; returns the
    update op, which its consumers wait for (the reduction is synchronous: async_op=False). The external
    input is "in" forward (the last layer's output) and "gin" backward (the first layer's input gradient)."""
    phase, ext = ("bwd", "gin") if backward else ("fwd", "in")
    deps: Deps = (ext,)
    if group is not None:
        coll = Collective("all_reduce", group, amax_reduce_bytes(fp8_gemms, backward), K.FP8_AMAX_REDUCE)
        deps = (tpl.add(phase, K.FP8_AMAX_REDUCE, coll, deps),)
    return tpl.add(phase, K.FP8_AMAX_UPDATE, amax_update_work(fp8_gemms, backward, history_len), deps)
