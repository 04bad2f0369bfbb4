"""Other tools' names for a scenario's enumerated values, so that a refused value's fix names meshsim's one.

People write scenarios from Megatron-LM flags, Megatron-Bridge recipes and their performance tables, and
PyTorch; the same setting has other names there ("FP8-CS" is Megatron-LM's --fp8-recipe tensorwise, the
DeepEP dispatcher is --moe-token-dispatcher-type flex with --moe-flex-dispatcher-backend deepep). The
schema keeps one name per value; this table only improves the message when another name is refused.
MEGATRON_KEYS does the same for keys: a Megatron-LM argument name written as a key is refused with the
field that sets it (`megatron_key_fix`).

OTHER_NAMES: field name (the last part of its path: `fp8` covers run.fp8 and sweep.fp8) -> lower-cased
other name -> (meshsim's value, what else to set or why, "" when nothing). Every value named here is one
the field accepts (tests/test_scenario_value_names.py checks them against the schema).
"""

from __future__ import annotations

_TENSORWISE = "FP8 with per-tensor current scaling: Megatron-Bridge's FP8-CS, Megatron-LM's --fp8-recipe tensorwise"
_MXFP8 = "Megatron-Bridge's FP8-MX, Megatron-LM's --fp8-recipe mxfp8"
_FLEX = "Megatron-LM's --moe-token-dispatcher-type flex"
_YAML_OFF = "YAML reads an unquoted off as false: quote it"

OTHER_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "fp8": {name: ("tensorwise", _TENSORWISE) for name in ("current", "cs", "fp8-cs", "fp8_cs", "current_scaling")}
    | {name: ("mxfp8", _MXFP8) for name in ("mx", "fp8-mx", "fp8_mx")}
    | {"delayed_scaling": ("delayed", "Megatron-LM's --fp8-recipe delayed"),
       "fp4": ("nvfp4", "NVFP4, Megatron-LM's --fp4-recipe nvfp4"),
       "block": ("blockwise", "DeepSeek-style 1x128 / 128x128 scaling, Megatron-LM's --fp8-recipe blockwise"),
       "none": ("off", ""), "false": ("off", _YAML_OFF), "bf16": ("off", "the 16-bit recipe is run.fp8: 'off'")},
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
    "recompute": {"off": ("none", ""), "no": ("none", ""), "false": ("none", "YAML reads an unquoted off or no as false")},
    "cp_comm": {"all_gather": ("allgather", ""), "all-gather": ("allgather", ""), "a2a_p2p": ("a2a+p2p", "")},
}


# Megatron-LM's argument names (megatron/training/arguments.py; dashes or underscores, as in its YAML configs
# and Megatron-Bridge recipes) -> the scenario field that sets the same thing
MEGATRON_KEYS: dict[str, str] = {
    "num_layers": "model.layers", "hidden_size": "model.hidden", "num_attention_heads": "model.heads",
    "num_query_groups": "model.kv_heads", "ffn_hidden_size": "model.ffn_hidden", "seq_length": "model.seq_len",
    "vocab_size": "model.vocab", "kv_channels": "model.head_dim", "swiglu": "model.mlp",
    "normalization": "model.norm", "qk_layernorm": "model.qk_norm", "mtp_num_layers": "model.mtp_layers",
    "make_vocab_size_divisible_by": "model.vocab_divisible_by",
    "num_experts": "model.moe.experts", "moe_router_topk": "model.moe.top_k",
    "moe_ffn_hidden_size": "model.moe.ffn_hidden", "moe_shared_expert_intermediate_size": "model.moe.shared_ffn_hidden",
    "moe_router_score_function": "model.moe.router", "moe_router_num_groups": "model.moe.router_groups",
    "moe_router_group_topk": "model.moe.router_group_topk", "moe_expert_capacity_factor": "model.moe.capacity_factor",
    "moe_layer_freq": "model.moe.every", "q_lora_rank": "model.mla.q_lora_rank",
    "kv_lora_rank": "model.mla.kv_lora_rank",
    "tensor_model_parallel_size": "parallel.tp", "sequence_parallel": "parallel.sp",
    "pipeline_model_parallel_size": "parallel.pp", "virtual_pipeline_model_parallel_size": "parallel.vp",
    "context_parallel_size": "parallel.cp",
    "cp_comm_type": "parallel.cp_comm", "expert_model_parallel_size": "parallel.ep",
    "expert_tensor_parallel_size": "parallel.etp", "data_parallel_size": "parallel.dp",
    "micro_batch_size": "parallel.micro_batch", "global_batch_size": "parallel.global_batch",
    "recompute_granularity": "parallel.recompute", "recompute_modules": "parallel.recompute_modules",
    "use_distributed_optimizer": "parallel.distributed_optimizer", "overlap_grad_reduce": "parallel.dp_overlap",
    "overlap_param_gather": "parallel.overlap_param_gather", "tp_comm_overlap": "parallel.tp_comm_overlap",
    "moe_token_dispatcher_type": "parallel.moe_dispatcher", "moe_flex_dispatcher_backend": "parallel.moe_flex_backend",
    "overlap_moe_expert_parallel_comm": "parallel.moe_ep_overlap", "delay_wgrad_compute": "parallel.delay_wgrad_compute",
    "pipeline_model_parallel_layout": "parallel.pipeline_layout",
    "decoder_first_pipeline_num_layers": "parallel.first_stage_layers",
    "decoder_last_pipeline_num_layers": "parallel.last_stage_layers",
    "account_for_embedding_in_pipeline_split": "parallel.account_for_embedding_in_split",
    "account_for_loss_in_pipeline_split": "parallel.account_for_loss_in_split",
    "fp8_recipe": "run.fp8", "fp8_format": "run.fp8_format", "fp8_param_gather": "run.fp8_param_gather",
    "deterministic_mode": "run.deterministic", "gradient_accumulation_fusion": "run.grad_accumulation_fusion",
}


def megatron_key_fix(key: str) -> str | None:
    """'write it as FIELD (Megatron-LM's --flag)' when `key` is a Megatron-LM argument name, else None."""
    flag = str(key).strip().lstrip("-").replace("-", "_").lower()
    field = MEGATRON_KEYS.get(flag)
    if field is None:
        return None
    return f"write it as {field} (Megatron-LM's --{flag.replace('_', '-')}; docs/scenarios.md gives its values)"


def other_name(field: str, value: object) -> tuple[str, str] | None:
    """(meshsim's value, why) when `value` is another tool's name for a value of `field`, else None.
    `field`: a dotted path, list indices included (sweep.fp8[1]), or a bare field name."""
    if isinstance(value, bool):  # YAML 1.1 reads unquoted off / no / on / yes as booleans
        value = str(value)
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
