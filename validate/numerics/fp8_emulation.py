"""FP8 numerics emulated on CPU with torch's float8 dtypes: quantize, scale and dequantize around each FP8
GEMM, amax bookkeeping per recipe, against a 16-bit-free (float64) reference.

The simulator's rules (sim/schedule/fp8_rules.py) say which GEMMs run in FP8 and with which recipe; this
module runs those GEMMs' numerics for real on small tensors:
- `quantize(x, fmt, recipe, state)` -> (FP8 codes as float, scale per element): scale s = fp8_max / amax /
  2^margin (Transformer Engine's scale, common/recipe and `_default_sf_compute`); values are clamped to
  +-fp8_max (TE saturates) and cast with `.to(torch.float8_e4m3fn / float8_e5m2)`; dequantized = code / s.
  Per recipe the amax is that of the whole tensor now (tensorwise), of the amax history (delayed:
  most_recent or max over the last fp8_amax_history_len steps, TE's initial scale 1.0 before any
  history), of each 1 x 128 block with a power-of-2 scale (blockwise, TE's default power_2_scale), or of
  each 32-value block with an E8M0 scale 2^ceil(log2(amax / fp8_max)) (mxfp8: TE
  common/util/ptx_arch_spec.cuh `float_to_e8m0(amax * max_norm_rcp)`, rounded up by cvt.rp, so the
  block's largest value never saturates; the OCP MX spec's floor(log2 amax) - emax can).
  nvfp4 (`nvfp4_round_trip`): two levels as TE's NVFP4 quantizer (common/cast/nvfp4): a per-tensor fp32
  encode scale S = 6 x 448 / amax (fp4_max x fp8_max), a per-16-value block decode scale
  amax_block / 6 x S stored in E4M3 (weights too: TE's 16 x 16 weight blocks are not emulated), values
  x / (block scale / S) rounded to
  the nearest E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6, signed) and saturated at 6. The format knob does not
  apply (E2M1 everywhere); stochastic rounding and the Hadamard transform are not emulated.
- `Fp8Linear`: y = deq(q(x)) @ deq(q(w)); backward dY quantized in the gradient format (E5M2 under
  hybrid, E4M3 under e4m3): dX = deq(q(dY)) @ deq(q(w))^T, dW = deq(q(x))^T @ deq(q(dY)).
- `check_fp8_mlp(recipe, fmt, ...)` runs a two-linear MLP (the fc1 / fc2 of a layer) for `steps` steps in
  FP8 and in float64 from the same weights and inputs and returns the worst relative error of the output
  and of every gradient; FP8_TOLERANCE bounds it. `scale_error` multiplies every dequantization by a wrong
  factor: the negative control, which must fail.

NVFP4_TOLERANCE: E2M1 keeps 1 mantissa bit (relative spacing 2^-1 between 4 and 6, rounding error <= 1/4
per value), so the same dot-product argument allows ~4x FP8's worst-element error; 0.35 leaves margin over
what the two-linear MLP measures (0.26) and still catches the wrong scale (a dequantization x2 of both
operands: ~0.75).
FP8_TOLERANCE: E4M3 keeps 3 mantissa bits (relative spacing 2^-3, rounding error <= 2^-4 per value),
E5M2 2 bits (<= 2^-3); a dot product of n such values has a relative error ~ 2^-4 / sqrt(n) on average
and below ~2^-4 in the worst element, and a backward GEMM combines two quantized operands: 0.15 of the
largest reference value leaves margin over that and still catches a wrong scale by 2x (an error of 0.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from meshsim.scenarios.schema import RunConfig

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
BLOCK = {"blockwise": 128, "mxfp8": 32}
FP8_TOLERANCE = 0.15
NVFP4_TOLERANCE = 0.35
FP4_MAX, NVFP4_BLOCK = 6.0, 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def tolerance(recipe: str) -> float:
    """The emulation's bound for `recipe`: NVFP4_TOLERANCE for nvfp4, else FP8_TOLERANCE."""
    return NVFP4_TOLERANCE if recipe == "nvfp4" else FP8_TOLERANCE


def fp8_max(fmt: str) -> float:
    return float(torch.finfo(FORMATS[fmt]).max)


@dataclass
class AmaxHistory:
    """Delayed scaling's per-tensor state: the last `length` amaxes, newest first (TE amax_history)."""

    length: int = 1
    algo: str = "most_recent"
    values: list[float] = field(default_factory=list)

    def amax(self) -> float | None:
        if not self.values:
            return None
        return self.values[0] if self.algo == "most_recent" else max(self.values)

    def record(self, amax: float) -> None:
        self.values = ([amax] + self.values)[: self.length]


def _pow2_floor(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.floor(torch.log2(x)))


def block_scales(x: torch.Tensor, fmt: str, recipe: str, margin: int) -> torch.Tensor:
    """Per-element scales of the blockwise / MXFP8 recipes along the last dimension."""
    block = BLOCK[recipe]
    rows, cols = x.shape
    pad = (-cols) % block
    blocks = torch.nn.functional.pad(x.abs(), (0, pad)).reshape(rows, -1, block).amax(dim=-1)
    blocks = blocks.clamp_min(torch.finfo(torch.float32).tiny)
    if recipe == "mxfp8":  # E8M0 = 2^ceil(log2(amax / fp8_max)): TE float_to_e8m0 rounds up (cvt.rp)
        scale = 1.0 / torch.exp2(torch.ceil(torch.log2(blocks / fp8_max(fmt))))
    else:  # power-of-2 scale not above fp8_max / amax
        scale = _pow2_floor(fp8_max(fmt) / blocks / 2.0**margin)
    return scale.repeat_interleave(block, dim=-1)[:, :cols]


def tensor_scale(x: torch.Tensor, fmt: str, recipe: str, margin: int, history: AmaxHistory | None) -> float:
    """One scale for the tensor: from its own amax (tensorwise) or the history (delayed)."""
    if recipe == "delayed":
        amax = history.amax() if history is not None else None
        if history is not None:
            history.record(float(x.abs().max()))
        if amax is None:
            return 1.0  # TE's initial scale, before any amax is recorded
    else:
        amax = float(x.abs().max())
    return fp8_max(fmt) / max(amax, torch.finfo(torch.float32).tiny) / 2.0**margin


def _e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """|v| (already scaled into [0, 6]) to the nearest E2M1 magnitude, saturating at 6."""
    grid = torch.tensor(E2M1_VALUES, dtype=v.dtype)
    mids = (grid[1:] + grid[:-1]) / 2
    return grid[torch.bucketize(v.clamp(0, FP4_MAX), mids)]


def nvfp4_round_trip(x2: torch.Tensor, scale_error: float = 1.0) -> torch.Tensor:
    """[rows, cols] -> deq(q(x)) under NVFP4's two-level scaling (module docstring), blocks of 16 along the
    last dimension."""
    tiny = torch.finfo(torch.float32).tiny
    encode = FP4_MAX * fp8_max("e4m3") / x2.abs().max().clamp_min(tiny)
    rows, cols = x2.shape
    pad = (-cols) % NVFP4_BLOCK
    blocks = torch.nn.functional.pad(x2.abs(), (0, pad)).reshape(rows, -1, NVFP4_BLOCK).amax(dim=-1)
    stored = (blocks / FP4_MAX * encode).clamp(max=fp8_max("e4m3")).to(torch.float8_e4m3fn).to(torch.float64)
    decode = (stored / encode).repeat_interleave(NVFP4_BLOCK, dim=-1)[:, :cols].clamp_min(tiny)
    x64 = x2.to(torch.float64)
    codes = torch.sign(x64) * _e2m1_round(x64.abs() / decode)
    return codes * decode / scale_error


def quantize(x: torch.Tensor, fmt: str, recipe: str, margin: int = 0, history: AmaxHistory | None = None,
             scale_error: float = 1.0) -> torch.Tensor:
    """x -> its FP8 round trip deq(q(x)) under `recipe` (module docstring); scale_error != 1 corrupts the
    dequantization scale (negative control)."""
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    if recipe == "nvfp4":
        return nvfp4_round_trip(x2, scale_error).reshape(x.shape)
    if recipe in BLOCK:
        scale = block_scales(x2, fmt, recipe, margin)
    else:
        scale = torch.tensor(tensor_scale(x2, fmt, recipe, margin, history))
    limit = fp8_max(fmt)
    codes = (x2 * scale).clamp(-limit, limit).to(FORMATS[fmt]).to(torch.float64)
    return (codes / (scale.to(torch.float64) * scale_error)).reshape(x.shape)


@dataclass
class Fp8Config:
    recipe: str = "delayed"
    fmt: str = "hybrid"  # hybrid: E4M3 forward, E5M2 gradients; e4m3 everywhere
    margin: int = 0
    history_len: int = 1
    algo: str = "most_recent"
    scale_error: float = 1.0

    @property
    def fwd_fmt(self) -> str:
        return "e4m3"

    @property
    def bwd_fmt(self) -> str:
        return "e5m2" if self.fmt == "hybrid" else "e4m3"


class _Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, cfg, histories):
        qx = quantize(x, cfg.fwd_fmt, cfg.recipe, cfg.margin, histories["x"], cfg.scale_error)
        qw = quantize(w, cfg.fwd_fmt, cfg.recipe, cfg.margin, histories["w"], cfg.scale_error)
        ctx.save_for_backward(qx, qw)
        ctx.cfg, ctx.histories = cfg, histories
        return qx @ qw

    @staticmethod
    def backward(ctx, dy):
        qx, qw = ctx.saved_tensors
        cfg = ctx.cfg
        qdy = quantize(dy, cfg.bwd_fmt, cfg.recipe, cfg.margin, ctx.histories["dy"], cfg.scale_error)
        return qdy @ qw.T, qx.reshape(-1, qx.shape[-1]).T @ qdy.reshape(-1, qdy.shape[-1]), None, None


class Fp8Linear:
    """y = x @ w with FP8 operands (one TE linear without bias); per-tensor amax histories for delayed."""

    def __init__(self, w: torch.Tensor, cfg: Fp8Config):
        self.w, self.cfg = w, cfg
        self.histories = {k: AmaxHistory(cfg.history_len, cfg.algo) for k in ("x", "w", "dy")}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8Matmul.apply(x, self.w, self.cfg, self.histories)


def _mlp(x, w1, w2, linear1=None, linear2=None):
    h = linear1(x) if linear1 else x @ w1
    h = torch.nn.functional.gelu(h)
    return linear2(h) if linear2 else h @ w2


def check_fp8_mlp(recipe: str, fmt: str = "hybrid", *, steps: int = 3, tokens: int = 64, hidden: int = 128,
                  ffn: int = 256, history_len: int = 4, algo: str = "max", margin: int = 0,
                  scale_error: float = 1.0, seed: int = 0) -> float:
    """Worst relative error (max |fp8 - ref| / max |ref| over output, dX, dW1, dW2) of `steps` FP8 steps of a
    two-linear MLP against float64 (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.randn(hidden, ffn, generator=gen, dtype=torch.float64) / math.sqrt(hidden)
    w2 = torch.randn(ffn, hidden, generator=gen, dtype=torch.float64) / math.sqrt(ffn)
    cfg = Fp8Config(recipe, fmt, margin=margin, history_len=history_len, algo=algo, scale_error=scale_error)
    worst = 0.0
    lin1, lin2 = Fp8Linear(w1.requires_grad_(), cfg), Fp8Linear(w2.requires_grad_(), cfg)
    for _ in range(steps):
        x = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
        dy = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
        got, want = [], []
        for linears, out in (((lin1, lin2), got), ((None, None), want)):
            xi = x.clone().requires_grad_()
            w1.grad = w2.grad = None
            y = _mlp(xi, w1, w2, *linears)
            y.backward(dy)
            out += [y.detach(), xi.grad, w1.grad.clone(), w2.grad.clone()]
        worst = max(worst, *(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, want, strict=True)))
    return worst


# every FP8 knob of the run section (named fp8*, and the amax-reduction scope), so a new one cannot be missed
FP8_RUN_FIELDS = frozenset({f for f in RunConfig.model_fields if f.startswith("fp8")} | {"tp_only_amax_reduction"})
CONTROL_SCALE_ERROR = 2.0  # the negative control's wrong dequantization scale


def without_fp8(scenario):
    """The scenario with every FP8 run field at its default: what `meshsim validate --check` runs for real
    on gloo (its TP/SP stack is 16-bit; FP8 is checked by check_fp8_run)."""
    run = scenario.run
    return scenario.model_copy(update={"run": type(run)(**run.model_dump(exclude=set(FP8_RUN_FIELDS)))})


def check_fp8_run(run) -> tuple[bool, list[str]]:
    """The scenario's recipe, format, amax history, algorithm and margin (`run`: scenario.run) emulated
    (check_fp8_mlp) within FP8_TOLERANCE, and the negative control (scale off by CONTROL_SCALE_ERROR)
    outside it: (ok, report lines)."""
    recipe, fmt = run.fp8, run.fp8_format
    kw = dict(history_len=run.fp8_amax_history_len, algo=run.fp8_amax_compute_algo, margin=run.fp8_margin)
    err = check_fp8_mlp(recipe, fmt, **kw)
    bad = check_fp8_mlp(recipe, fmt, **kw, scale_error=CONTROL_SCALE_ERROR)
    bound = tolerance(recipe)
    ok = err <= bound < bad
    what = "NVFP4 (E2M1, E4M3 block scales)" if recipe == "nvfp4" else f"FP8 {recipe} ({fmt})"
    return ok, [f"{what} emulated on CPU (torch float8): worst relative error {err:.3f} vs float64, "
                f"tolerance {bound} -> {'ok' if err <= bound else 'FAIL'}",
                f"negative control (dequantization scale x{CONTROL_SCALE_ERROR:g}): {bad:.3f} -> "
                f"{'fails, as it must' if bad > bound else 'PASSES: the check cannot see a wrong scale'}"]
