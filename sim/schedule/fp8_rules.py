"""FP8 training as Transformer Engine runs it under Megatron-Core: which GEMMs run in FP8, what the
quantize kernels read and write, what crosses the wire in FP8, and the amax bookkeeping per recipe.

Sources (snapshot commits): Transformer Engine d0067d0d (TE), Megatron-LM d98e8a64 (MLM).

Recipes (MLM megatron/core/fp8_utils.py L768-790, `get_fp8_recipe`; TE transformer_engine/common/recipe/
__init__.py): delayed = DelayedScaling (one scale per tensor from an amax history), tensorwise =
Float8CurrentScaling (one scale per tensor from this tensor's own amax), blockwise = Float8BlockScaling
(fp32 scale per 1 x 128 block of activations and gradients, per 128 x 128 block of weights), mxfp8 =
MXFP8BlockScaling (one E8M0 byte per 32 consecutive values, rowwise and columnwise apart), nvfp4 =
NVFP4BlockScaling (Megatron --fp4-format e2m1 --fp4-recipe nvfp4, MLM fp4_utils.py; TE recipe/__init__.py
L489-608): E2M1 values (half a byte) with one E4M3 scale byte per 16 consecutive values (weights: per 16 x 16
block) under one fp32 scale per tensor, so TE first computes the tensor's amax (a pass over the input, fused
with the random Hadamard transform of the columnwise copy: quantizer.cpp NVFP4Quantizer::quantize_impl,
`nvte_hadamard_transform_amax`) and, where the tensor is sequence-sharded, all-reduces it over TP
(`with_amax_reduction`), as tensorwise does; then one kernel writes the rowwise and the columnwise copies
(`nvte_quantize_with_hadamard_transform`), each scaled along its own direction, as MXFP8's. Its GEMMs run at
the FP4 peak (sim/cost/fp8_gemm.py). TE's recipe quantizes no attention by default (fp8_dpa False,
recipe/__init__.py L571-572): with nvfp4 the attention core stays 16-bit unless run.fp8_attention, which TE
runs in FP8 beside the NVFP4 linears (dot_product_attention.py L189-224, NVTE_DPA_FP8_RECIPE). Stochastic rounding of gradients and the Hadamard transform change numerics,
not bytes.
Format (MLM transformer_config.py `fp8`): hybrid = E4M3 activations and weights, E5M2 gradients; e4m3
everywhere. The format changes the numerics (validate/numerics/fp8_emulation.py), not the time.

Which GEMMs: the four TE linears of a layer (qkv and fc1 are LayerNormLinear, proj and fc2 Linear),
forward, dgrad and wgrad (wgrad in 16 bit with run.fp8_wgrad false: MLM passes
override_linear_precision=(False, False, not fp8_wgrad)). The attention core stays 16-bit unless
run.fp8_attention (TE fp8_dpa); the embedding, the output layer (LM head; MXFP8 with run.fp8_output_proj,
Megatron's TELMHeadColumnParallelLinear), norms, softmax and the cross-entropy stay 16-bit. Megatron's --first-last-layers-bf16 keeps the first and last N decoder layers 16-bit
(run.fp8_first_last_layers_bf16: a 16-bit layer kind, sim/schedule/layer_kinds.py).

Quantize kernels (TE module/linear.py `_linear_forward_impl` / backward, L340-440 and L800-1000):
- every FP8 GEMM input that is not already FP8 is quantized: the linear input (forward), the output
  gradient dY (backward). The copies written: rowwise (for the GEMM that consumes it now) plus, when the
  backward needs the tensor, columnwise (the transpose, for wgrad): TE's cast-transpose kernel writes
  both in one pass (read 2 B, write 1 B per copy per element);
- under SP the column-parallel input is quantized on its sequence shard and all-gathered in FP8
  (`gather_along_first_dim(..., quantizer=input_quantizer)`, linear.py L408; the backward re-gather for
  wgrad likewise, L993), and so is the row-parallel layer's dY in backward (module/base.py
  `grad_output_preprocess` L1720-1750: "FP8 with all-gather: ... fused cast + transpose"). For delayed / tensorwise (Float8Quantizer / Float8CurrentScalingQuantizer)
  "All-gather is not supported with FP8 column-wise data": the shard is quantized rowwise only and the
  gathered tensor transposed again for wgrad (an FP8 transpose: read 1 B, write 1 B per element);
  blockwise and MXFP8 quantize both directions on the shard and gather the columnwise copy of the input
  in backward, and both copies of dY (dgrad and wgrad each need their own direction);
- tensorwise computes the tensor's amax in a separate pass before the cast (read 2 B); where the tensor
  is sequence-sharded (SP: the column-parallel input, the row-parallel dY) its amax is all-reduced over
  the TP group first (TE `set_quantizer_amax_reduction_group(..., tp_group if sequence_parallel ...)`);
- delayed scaling records the amax inside the cast kernel and reduces the whole region's amaxes in one
  all-reduce (MAX) when the autocast region ends (TE quantization.py `autocast_exit` ->
  `reduce_and_update_fp8_tensors(forward=True)`, `async_op=False`) over the amax group: tp x dp of the
  stage (MLM parallel_state.get_amax_reduction_group), tp only with run.tp_only_amax_reduction. Megatron
  wraps the whole layer stack in one region for delayed scaling (MLM transformer_block.py L619-629),
  so one forward and one backward reduction per micro-batch; 4 bytes per amax, 3 per FP8 GEMM forward
  (input, weight, output) and 2 backward (grad output, grad input) (TE base.py fp8_meta sizes). The
  history update (fused_amax_and_scale_update_after_reduction) reads and writes the history:
  run.fp8_amax_history_len x amaxes x 4 bytes;
- blockwise / MXFP8 compute their scales in the quantize kernel and write them: 4 B per 128 values
  (blockwise 1 x 128) or 1 B per 32 values (MXFP8) per copy. No amax reduction.
- weights: cast (and transposed) once per step, on the first micro-batch (TE `update_workspace =
  is_first_microbatch`): read 2 B, write 2 x 1 B per parameter, modeled as one kernel per step after the
  optimizer step (op key FP8_WEIGHT_CAST). With run.fp8_param_gather the primary weights are FP8: the
  optimizer writes them from the fp32 master shard (read 4 B, write 1 B per owned parameter) and the
  DP parameter all-gather moves 1 B per linear weight; the transpose is made after the gather.
What stays 16-bit on the wire: reduce-scatters and all-reduces of GEMM outputs (TE's GEMM output is 16-bit).

Blackwell (sm 10.x, 11.x and >= 13.0) runs FP8 GEMMs in any layout (TE pytorch/utils.py L658-663
`is_non_tn_fp8_gemm_supported`; common/gemm/cublaslt_gemm.cu L123-147 uses the rowwise data, transposed
by cuBLAS, where Hopper needs the columnwise copy), so TE's per-tensor quantizers (Float8Quantizer,
Float8CurrentScalingQuantizer: pytorch/csrc/quantizer.cpp L361-375, L544-547, L678-689) write no transpose
there: the delayed and tensorwise recipes write one copy of every tensor and weight, and the transpose
after an SP gather is not made. Blockwise and MXFP8 scale along one direction per copy and keep both.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.sim.schedule.ops import Elementwise

FP8_BYTES = 1
AMAX_BYTES = 4  # fp32 amax per tensor
BLOCKWISE_BLOCK, BLOCKWISE_SCALE_BYTES = 128, 4  # Float8BlockScaling: fp32 scale per 1 x 128 block
MXFP8_BLOCK, MXFP8_SCALE_BYTES = 32, 1  # MXFP8BlockScaling: E8M0 scale per 32 values
NVFP4_BLOCK, NVFP4_SCALE_BYTES = 16, 1  # NVFP4BlockScaling: E4M3 scale per 16 values (E2M1 values, 2 per byte)
NVFP4_WEIGHT_BLOCK = 16 * 16  # weights: one E4M3 scale per 16 x 16 block (2D quantization)
AMAX_PASS_RECIPES = ("tensorwise", "nvfp4")  # a separate amax pass before the cast, all-reduced over TP under SP
AMAX_PER_GEMM_FWD, AMAX_PER_GEMM_BWD = 3, 2  # TE fp8_meta: (input, weight, output), (grad out, grad in)
LINEARS_PER_LAYER = 4  # qkv, proj, fc1, fc2
ATTENTION_LINEARS, MLA_LINEARS, MLP_LINEARS = 2, 4, 2  # qkv + proj; MLA q, kv_down, kv_up, proj (+ q_down); fc1 + fc2
# kernel names (Elementwise.kernel) of the quantize work, defined once
QUANTIZE, CAST_TRANSPOSE, TRANSPOSE, AMAX, AMAX_UPDATE, WEIGHT_CAST = (
    "fp8_quantize", "fp8_cast_transpose", "fp8_transpose", "fp8_amax", "fp8_amax_update", "fp8_weight_cast")


@dataclass(frozen=True)
class Fp8Plan:
    """A layer's FP8 settings (run.fp8...), carried by LayerDims."""

    recipe: str = "off"  # off | delayed | tensorwise | blockwise | mxfp8 | nvfp4
    wgrad: bool = True
    attention: bool = False
    any_layout_gemm: bool = False  # the GPU runs FP8 GEMMs in any layout (non_tn_fp8_gemm)
    output_proj: bool = False  # run.fp8_output_proj: the LM head's GEMMs in FP8 (head_ops.py)

    @property
    def on(self) -> bool:
        return self.recipe != "off"

    @property
    def tensor_scaled(self) -> bool:
        """One scale per tensor (delayed, tensorwise): a sharded gather carries rowwise data only."""
        return self.recipe in ("delayed", "tensorwise")

    @property
    def amax_pass(self) -> bool:
        """The tensor's own amax is computed before the cast (tensorwise, nvfp4's per-tensor scale)."""
        return self.recipe in AMAX_PASS_RECIPES

    @property
    def transpose_free(self) -> bool:
        """Per-tensor scales on a GPU with any-layout FP8 GEMMs: no columnwise copy is ever written."""
        return self.tensor_scaled and self.any_layout_gemm


def non_tn_fp8_gemm(compute_capability: tuple[int, int]) -> bool:
    """TE's is_non_tn_fp8_gemm_supported: sm 10.0-11.x and >= 13.0 run FP8 GEMMs in any layout."""
    return (10, 0) <= compute_capability < (12, 0) or compute_capability >= (13, 0)


def scale_bytes(elements: int, recipe: str) -> int:
    """Scale bytes written with one copy of `elements` quantized values (per-tensor scales: none counted)."""
    if recipe == "blockwise":
        return -(-elements // BLOCKWISE_BLOCK) * BLOCKWISE_SCALE_BYTES
    if recipe == "mxfp8":
        return -(-elements // MXFP8_BLOCK) * MXFP8_SCALE_BYTES
    if recipe == "nvfp4":
        return -(-elements // NVFP4_BLOCK) * NVFP4_SCALE_BYTES
    return 0


def value_bytes(elements: int, recipe: str) -> int:
    """Bytes of `elements` quantized values: 1 each, half a byte under nvfp4 (E2M1, two per byte)."""
    return -(-elements // 2) if recipe == "nvfp4" else elements * FP8_BYTES


def fp8_tensor_bytes(elements: int, recipe: str) -> int:
    """Bytes of one quantized copy of a tensor: its values plus its scales (what an FP8 all-gather moves)."""
    return value_bytes(elements, recipe) + scale_bytes(elements, recipe)


def quantize_works(elements: int, copies: int, plan: Fp8Plan, src_bytes: int = 2) -> tuple[Elementwise, ...]:
    """The kernels that quantize a 16-bit tensor of `elements` values into `copies` FP8 copies (1 rowwise,
    2 rowwise + columnwise): tensorwise and nvfp4 first read it once for its amax."""
    cast = CAST_TRANSPOSE if copies > 1 else QUANTIZE
    q = Elementwise(cast, src_bytes * elements, copies * fp8_tensor_bytes(elements, plan.recipe))
    if plan.amax_pass:
        return (Elementwise(AMAX, src_bytes * elements, AMAX_BYTES), q)
    return (q,)


def transpose_work(elements: int) -> Elementwise:
    """FP8 transpose of a gathered rowwise tensor for wgrad (delayed / tensorwise under SP)."""
    return Elementwise(TRANSPOSE, elements * FP8_BYTES, elements * FP8_BYTES)


def delayed_fp8_gemms(attention_linears: int, dense_layers: int, moe_layers: int, local_experts: int,
                      shared_expert: bool) -> int:
    """FP8 GEMMs with their own delayed-scaling amaxes in a region of decoder layers (TE fp8_meta per GEMM:
    module/base.py L1139, `num_gemms x 3` forward, `x 2` backward). A Linear / LayerNormLinear is one GEMM;
    an expert GroupedLinear is `num_gemms` = local experts GEMMs (grouped_linear.py), each with its own
    quantizers - under DelayedScaling TE takes its per-GEMM path, the grouped-tensor path being unsupported
    (grouped_linear.py L107-108, L132-152). So a layer has its attention linears (2; MLA 4, or 5 with a q
    down-projection) plus fc1 + fc2 (dense) or 2 x local experts (+ 2 for a shared expert, a plain TE MLP)."""
    per_moe = MLP_LINEARS * local_experts + (MLP_LINEARS if shared_expert else 0)
    return (dense_layers + moe_layers) * attention_linears + dense_layers * MLP_LINEARS + moe_layers * per_moe


def amax_reduce_bytes(fp8_gemms: int, backward: bool) -> int:
    """Bytes of delayed scaling's per-pass amax all-reduce over the region's `fp8_gemms` FP8 GEMMs."""
    per_gemm = AMAX_PER_GEMM_BWD if backward else AMAX_PER_GEMM_FWD
    return fp8_gemms * per_gemm * AMAX_BYTES


def amax_update_work(fp8_gemms: int, backward: bool, history_len: int) -> Elementwise:
    """The fused amax-history and scale update after the reduction: reads and writes the history and scales."""
    n = amax_reduce_bytes(fp8_gemms, backward) // AMAX_BYTES
    nbytes = n * (history_len + 1) * AMAX_BYTES
    return Elementwise(AMAX_UPDATE, nbytes, nbytes)


def weight_cast_work(linear_params: int, owned_params: int, param_gather: bool, transpose_free: bool = False,
                     recipe: str = "off") -> Elementwise:
    """Once per step: the linear weights' FP8 rowwise + columnwise copies. Without fp8_param_gather, from the
    16-bit weights (read 2 B, write 2 x 1 B per parameter; nvfp4: 2 x (half a byte + a scale byte per 16 x 16
    block), after an amax pass over the weights); with it, the optimizer casts its fp32 master shard
    (read 4 B, write 1 B per owned parameter) and the gathered weights are transposed (read 1 B, write 1 B).
    `transpose_free` (Fp8Plan.transpose_free): the rowwise copy only, and no transpose after the gather."""
    if param_gather:
        transposed = 0 if transpose_free else linear_params
        return Elementwise(WEIGHT_CAST, 4 * owned_params + transposed, owned_params + transposed)
    if recipe == "nvfp4":
        copy = value_bytes(linear_params, recipe) + -(-linear_params // NVFP4_WEIGHT_BLOCK) * NVFP4_SCALE_BYTES
        return Elementwise(WEIGHT_CAST, 2 * 2 * linear_params, 2 * copy)
    return Elementwise(WEIGHT_CAST, 2 * linear_params, (1 if transpose_free else 2) * linear_params)

