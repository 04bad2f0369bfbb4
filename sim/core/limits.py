"""The documented limits on what meshsim accepts, chosen so that every accepted input finishes in bounded
time and memory. Each is checked where the input is loaded and refused with a one-line UserError.

The table in README.md ("Limits") and docs/scenarios.md ("Limits") lists the same numbers; keep the three
in step. Where a number comes from a measurement it is stated beside it (2-core CPU, Python 3.11):
- 16,384 GPUs (2,048 eight-GPU nodes): llama2-70b on 2,048 DGX H100 nodes simulates in ~20 s; the cost
  of a DP collective grows with the number of concurrent groups it is costed against.
- 10,000 layer passes (layers of one pipeline stage x simulated micro-batches) per simulated rank: the builder emits at most
  ~110 ops per layer pass (TP overlap chunks, full recompute), so at most ~1.1 M ops; the engine runs
  ~30 us per op (340 k ops in ~11 s), i.e. under a minute and ~1 GB.
The library's largest scenario (gpt3-175b-a100-16node) uses 1,536 layer passes and 128 GPUs.
"""

from __future__ import annotations

import math

from meshsim.sim.core.errors import UserError

MAX_LAYERS = 1_000  # model.layers (the largest public dense models have ~126)
MAX_MODEL_DIM = 1 << 24  # hidden, ffn_hidden, heads, kv_heads, seq_len, vocab (16,777,216)
MAX_GPUS = 16_384  # GPUs of a topology (nodes x GPUs per node)
MAX_MICRO_BATCHES = 10_000  # micro-batches per DP rank per step (global_batch / (micro_batch x dp))
MAX_LAYER_PASSES = 10_000  # layers x micro-batches simulated on one rank (bounds its ops, see above)
MAX_EXPLICIT_RANKS = 64  # ranks simulated by `meshsim run --explicit-ranks` (tp x min(dp, 2))
MAX_SWEEP_POINTS = 1_024  # configurations of one sweep (product of its axes)
MAX_COLLECTIVE_BYTES = 1 << 50  # one collective's payload (1 PiB), `meshsim collective --max-bytes`
MAX_SIZE_ROWS = 1_000  # sizes of one `meshsim collective` sweep (min..max by --step-factor)
MAX_DEVICES = 20_000  # devices of a custom topology file (one node)
MAX_LINKS = 200_000  # links of a custom topology file (one node)
MAX_NICS_PER_NODE = 256  # NICs of one custom node joined into several nodes (one rail each)
MAX_TRANSIT_GPUS = 256  # GPUs of one node with nvlink_gpu_transit (routes search through GPUs)
MAX_YAML_BYTES = 1 << 20  # a scenario, topology or profile YAML file (1 MiB)
MAX_JSON_BYTES = 512 << 20  # a results or trace JSON read by compare / validate (512 MiB)
MAX_YAML_NODES = 200_000  # values in a parsed YAML file, every alias counted at each use
MAX_NESTING = 32  # nesting depth of sections and lists in a YAML / JSON input
MAX_NUMBER_DIGITS = 30  # digits of an integer in a YAML / JSON input (every count meshsim accepts has <= 17)


def check_at_most(field: str, value: object, limit: int, fix: str, *, source: str | None = None,
                  what: str = "", amount: int | None = None) -> None:
    """UserError when `amount` (default: the value itself) exceeds limit, naming the limit."""
    amount = value if amount is None else amount
    if amount > limit:
        shown = f"{amount:,}" if amount < 10**30 else f"{float(amount):.3g}"
        problem = f"{what or field} is {shown} but meshsim accepts at most {limit:,} (README, Limits)"
        raise UserError(field, value, fix, source=source, problem=problem)


def check_finite(field: str, value: float, fix: str, *, source: str | None = None) -> None:
    if not math.isfinite(value):
        raise UserError(field, value, fix, source=source, problem="Not a finite number")


def check_work(layers: int, micro_batches: int, simulated_micro_batches: int | None = None, *,
               source: str | None = None) -> None:
    """The limits on a step's size: micro-batches per step, and layer passes per simulated rank
    (`layers` = the layers one simulated rank runs per micro-batch: all of them, or its pipeline stage's
    (scenarios/pipeline_split.py) x the micro-batches the engine actually simulates; default: all)."""
    check_at_most("parallel.global_batch", micro_batches, MAX_MICRO_BATCHES,
                  "use a smaller global_batch or a larger micro_batch", source=source,
                  what="micro-batches per step (global_batch / (micro_batch x dp))")
    simulated = micro_batches if simulated_micro_batches is None else simulated_micro_batches
    check_at_most("model.layers", layers, MAX_LAYER_PASSES, "use fewer layers (per pipeline stage) or fewer "
                  "micro-batches per step", source=source,
                  what=f"layers per simulated rank x simulated micro-batches ({layers} x {simulated})",
                  amount=layers * simulated)
