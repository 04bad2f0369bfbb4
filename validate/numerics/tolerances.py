"""How close a parallel run must come to the single-process reference, per dtype (validate/numerics)."""

# (rtol, atol) per dtype: fp32 sums in another order differ by a few ulps of each partial sum (~1e-7
# relative) times the reduction depth; 1e-4 / 1e-5 leaves two orders of margin and still catches a
# missing or doubled term (errors of order 1). bf16 keeps 8 mantissa bits (2^-8 = 0.4%).
TOLERANCES = {"float64": (1e-9, 1e-11), "float32": (1e-4, 1e-5), "bfloat16": (2e-2, 1e-2)}
# bf16: a bf16 reference would share the parallel run's rounding and a fixed atol of 1e-2 exceeds many
# gradients (|grad| ~ 0.02-0.05 at the shrunk sizes: halving one still passed). Instead the reference runs
# in float64 from the same bf16-rounded weights and each tensor must agree within this fraction of its
# largest reference value: ~2^-8 per rounding times the depth of a few layers stays well inside 5%, a
# missing or doubled term (an error of order the value itself) does not.
SCALED_BOUND = {"bfloat16": 5e-2}
