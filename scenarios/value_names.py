"""Other tools' names for a scenario's enumerated values, so that a refused value's fix names meshsim's one.

People write scenarios from Megatron-LM flags, Megatron-Bridge recipes and their performance tables, and
PyTorch; the same setting has other names there ("FP8-CS" is Megatron-LM's --fp8-recipe tensorwise, the
DeepEP dispatcher is --moe-token-dispatcher-type flex with --moe-flex-dispatcher-backend deepep). The
schema keeps one name per value; this table only improves the message when another name is refused.

OTHER_NAMES: field name (the last part of its path: `fp8` covers run.fp8 and sweep.fp8) -> lower-cased
other name -> (meshsim's value, what else to set or why, "" when nothing). Every value named here is one
the field accepts (tests/test_scenario_value_names.py checks them against the schema).
"""

from __future__ import annotations

_TENSORWISE = "FP8 with per-tensor current scaling: Megatron-Bridge's FP8-CS, Megatron-LM's --fp8-recipe tensorwise"
_MXFP8 = "Megatron-Bridge's FP8-MX, Megatron-LM's --fp8-recipe mxfp8"
_FLEX = "Megatron-LM's --moe-token-dispatcher-type flex"

OTHER_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "fp8": {name: ("tensorwise", _TENSORWISE) for name in ("current", "cs", "fp8-cs", "fp8_cs", "current_scaling")}
    | {name: ("mxfp8", _MXFP8) for name in ("mx", "fp8-mx", "fp8_mx")}
    | {"delayed_scaling": ("delayed", "Megatron-LM's --fp8-recipe delayed"),
       "fp4": ("nvfp4", "NVFP4, Megatron-LM's --fp4-recipe nvfp4"),
       "block": ("blockwise", "DeepSeek-style 1x128 / 128x128 scaling, Megatron-LM's --fp8-recipe blockwise"),
       "none": ("off", ""), "false": ("off", ""), "bf16": ("off", "the 16-bit recipe is run.fp8: off")},
    "moe_dispatcher": {
        "deepep": ("flex", f"{_FLEX} with parallel.moe_flex_backend: deepep"),
        "hybridep": ("flex", f"{_FLEX} with parallel.moe_flex_backend: hybridep"),
        "a2a": ("alltoall", ""), "all_to_all": ("alltoall", ""), "all2all": ("alltoall", ""),
        "all_gather": ("allgather", "")},
    "mlp": {"silu": ("swiglu", "Megatron-LM's --swiglu gates with SiLU"),
            "swish": ("swiglu", "Megatron-LM's --swiglu gates with SiLU"),
            "squared_relu": ("relu2", "Megatron-LM's --squared-relu"),
            "relu_squared": ("relu2", "Megatron-LM's --squared-relu")},
    "attention": {name: ("flash", "a fused attention kernel: Transformer Engine's cuDNN or FlashAttention")
                  for name in ("fused", "cudnn", "fa", "fa2", "fa3", "flash_attention", "flash-attention", "sdpa")}
    | {name: ("unfused", "attention scores materialised in memory") for name in ("local", "eager", "math")},
    "dtype": {"bfloat16": ("bf16", ""), "float16": ("fp16", ""), "half": ("fp16", "")},
    "recompute": {"off": ("none", ""), "no": ("none", ""), "false": ("none", "")},
    "cp_comm": {"all_gather": ("allgather", ""), "all-gather": ("allgather", ""), "a2a_p2p": ("a2a+p2p", "")},
}


def other_name(field: str, value: object) -> tuple[str, str] | None:
    """(meshsim's value, why) when `value` is another tool's name for a value of `field`, else None.
    `field`: a dotted path, list indices included (sweep.fp8[1]), or a bare field name."""
    if not isinstance(value, str):
        return None
    name = field.rsplit(".", 1)[-1].split("[", 1)[0]
    return OTHER_NAMES.get(name, {}).get(value.strip().lower())


def other_name_fix(field: str, value: object) -> str | None:
    """The fix 'set FIELD to 'x' (why)' when `value` is another tool's name for x (other_name), else None."""
    hit = other_name(field, value)
    if hit is None:
        return None
    meant, why = hit
    return f"set {field} to {meant!r}" + (f" ({why})" if why else "")
