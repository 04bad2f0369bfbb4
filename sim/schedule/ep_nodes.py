"""A transformer layer's template split into Megatron-Core's schedule nodes, for parallel.moe_ep_overlap.

Megatron-LM d98e8a64 megatron/core/models/common/model_chunk_schedule_plan.py (TransformerLayerSchedulePlan,
L30-176) and megatron/core/models/gpt/fine_grained_callables.py (L20-273) cut a layer into nodes:
  pre_dispatch (compute stream): attention -> pre-MLP norm -> shared expert -> router -> dispatch preprocess
    (the token counts' all-gather and the permute; moe_layer.py preprocess, L455);
  dispatch (communication stream): token_dispatch, the all-to-alls of the rows and of their probabilities
    (token_dispatcher.py L682-727; the flex dispatcher's fused kernel, L1948);
  mlp (compute stream): routed_experts_compute = dispatch_postprocess (etp all-gathers, sort by expert),
    the experts, combine_preprocess (unsort, etp reduce-scatter) (moe_layer.py L536-569);
  combine (communication stream): token_combine (the all-to-all back) and postprocess (unpermute + shared
    expert output) and the residual add (fine_grained_callables.py L205-252), all on the comm stream.
A dense layer has pre_dispatch = attention and mlp = the MLP block; its dispatch and combine are no-ops.
Backward runs each node's backward on the node's stream; with delay_wgrad_compute (--delay-wgrad-compute)
the weight-gradient GEMMs leave their node for a `*_dw` node issued later on the compute stream: the routed
experts' (the mlp node: MoELayer.backward_dw, moe_layer.py L721, routed_experts=True; a dense layer's MLP,
mlp.py L385) and attention's (attention.py L239) and
the shared expert's (pre_dispatch: _BackwardDWWrapper, models/common/utils.py L379-420). The router's weight
gradient is a plain torch GEMM and stays (it has no backward_dw). A weight gradient another op of its
node consumes stays too (run.tp_grad_reduce_overlap: false makes the input-gradient collective wait for it).

Node of a forward op: pre_dispatch up to the first dispatch collective, dispatch, mlp up to the combine
collective, combine from there (dense: pre_dispatch before "ln2", mlp from it). Backward: everything after
the feed-forward's "ln2_grad_add" is attention (pre_dispatch); before it the shared expert's ops are
pre_dispatch, the rest combine up to the combine collective, mlp up to the dispatch collectives, dispatch,
then pre_dispatch (the backward of the preprocess and the router).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.template import Template

FWD_NODES = ("pre_dispatch", "dispatch", "mlp", "combine")
BWD_NODES = ("combine", "mlp", "mlp_dw", "dispatch", "pre_dispatch", "pre_dispatch_dw")
COMM_NODES = ("dispatch", "combine")  # Megatron runs them on its communication stream (ep_comm here)
DISPATCH_KEYS = (K.MOE_DISPATCH, K.MOE_DISPATCH_PROBS)
NOT_WEIGHT_GRADS = ("router_wgrad", "qk_wgrad", "pv_wgrad")  # unfused attention's GEMMs are not weights'
WGRAD_FOLLOWERS = ("_bias_grad", "_main_grad_add")  # TE computes them with the weight gradient


@dataclass(frozen=True)
class LayerNodes:
    """Template op indices per node, each in template order; `sinks` the ops of a node no other op of
    that node consumes (the node has ended when they have: Megatron records its CUDA event there)."""

    nodes: dict[str, tuple[int, ...]]
    sinks: dict[str, tuple[int, ...]]


def key_of(tpl: Template, i: int) -> str:
    return tpl.ops[i].suffix.split(".", 1)[1]


def _index(tpl: Template, keys: tuple[str, ...], start: int = 0, after: bool = False) -> int | None:
    """First index >= start whose key is in `keys` (`after`: the index after it), else None."""
    for i in range(start, len(tpl.ops)):
        if key_of(tpl, i) in keys:
            return i + 1 if after else i
    return None


def forward_nodes(tpl: Template) -> dict[str, list[int]]:
    n = len(tpl.ops)
    d = _index(tpl, DISPATCH_KEYS)
    if d is None:  # a dense layer
        ffn = _index(tpl, ("ln2",))
        return {"pre_dispatch": list(range(ffn)), "mlp": list(range(ffn, n))}
    d_end = d
    while d_end < n and key_of(tpl, d_end) in DISPATCH_KEYS:
        d_end += 1
    c = _index(tpl, (K.MOE_COMBINE,), d_end)
    return {"pre_dispatch": list(range(d)), "dispatch": list(range(d, d_end)), "mlp": list(range(d_end, c)),
            "combine": list(range(c, n))}


def _moe_backward_node(key: str, i: int, combine_end: int, dispatch: tuple[int, int]) -> str:
    if key.startswith("shared"):
        return "pre_dispatch"
    if i < combine_end:
        return "combine"
    if i < dispatch[0]:
        return "mlp"
    return "dispatch" if i < dispatch[1] else "pre_dispatch"


def backward_nodes(tpl: Template) -> dict[str, list[int]]:
    n = len(tpl.ops)
    attn = _index(tpl, ("ln2_grad_add",), after=True)
    nodes: dict[str, list[int]] = {name: [] for name in ("combine", "mlp", "dispatch", "pre_dispatch")}
    c = _index(tpl, (K.MOE_COMBINE,))
    if c is None or c >= attn:  # a dense layer
        nodes["mlp"], nodes["pre_dispatch"] = list(range(attn)), list(range(attn, n))
        return nodes
    d = _index(tpl, DISPATCH_KEYS, c + 1)
    d_end = d
    while key_of(tpl, d_end) in DISPATCH_KEYS:
        d_end += 1
    for i in range(n):
        node = "pre_dispatch" if i >= attn else _moe_backward_node(key_of(tpl, i), i, c + 1, (d, d_end))
        nodes[node].append(i)
    return nodes


def _is_weight_grad(key: str) -> bool:
    return key.endswith("_wgrad") and key not in NOT_WEIGHT_GRADS


def split_weight_grads(tpl: Template, idxs: list[int]) -> tuple[list[int], list[int]]:
    """(the node's ops without its deferred weight gradients, the deferred ones): the weight-gradient GEMMs
    and the bias / main-grad kernels that follow them, less any another op of the node consumes."""
    dw = {i for i in idxs if _is_weight_grad(key_of(tpl, i))}
    dw |= {i for i in idxs if key_of(tpl, i).endswith(WGRAD_FOLLOWERS) and dw & set(tpl.ops[i].local_deps)}
    needed: set[int] = set()
    for i in reversed(idxs):
        if i not in dw or i in needed:
            needed.update(tpl.ops[i].local_deps)
    dw -= needed
    return [i for i in idxs if i not in dw], [i for i in idxs if i in dw]


def node_sinks(tpl: Template, idxs: tuple[int, ...]) -> tuple[int, ...]:
    inside = set(idxs)
    used = {d for i in idxs for d in tpl.ops[i].local_deps if d in inside}
    return tuple(i for i in idxs if i not in used)


def layer_nodes(tpl: Template, backward: bool, delay_wgrad: bool) -> LayerNodes:
    """The template's ops per node (module docstring)."""
    raw = backward_nodes(tpl) if backward else forward_nodes(tpl)
    if backward:
        for name in ("mlp", "pre_dispatch"):
            raw[name], raw[name + "_dw"] = split_weight_grads(tpl, raw[name]) if delay_wgrad else (raw[name], [])
    nodes = {name: tuple(raw.get(name, ())) for name in (BWD_NODES if backward else FWD_NODES)}
    assert sorted(i for idxs in nodes.values() for i in idxs) == list(range(len(tpl.ops)))
    return LayerNodes(nodes, {name: node_sinks(tpl, idxs) for name, idxs in nodes.items()})
