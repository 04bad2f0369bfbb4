"""The documented limits on what meshsim accepts, chosen so that every accepted input finishes in bounded
time and memory. Each is checked where the input is loaded and refused with a one-line UserError.

The table in README.md ("Limits") and docs/scenarios.md ("Limits") lists the same numbers; keep the three
in step. Where a number comes from a measurement it is stated beside it (2-core CPU, Python 3.11):
- 16,384 GPUs (2,048 eight-GPU nodes): llama2-70b on 2,048 DGX H100 nodes simulates in ~20 s; the cost
  of a DP collective grows with the number of concurrent groups it is costed against.
- 1,200,000 ops of one simulation run, by a closed-form bound over the scenario that is >= the ops the
  builder makes (scenarios/limits.simulated_ops_bound: layers x micro-batches x a per-layer-pass bound that
  grows with the layout's ring and chunk counts; tests/test_op_bound.py checks it against the built
  schedules of generated scenarios, where the real count reached at most ~0.74 of it). A run is the whole
  step, or the short run its steady state is extrapolated from (~2 pp + 2 micro-batches for a pipeline);
  a pipeline simulates every stage, so its stages' layers add up to model.layers. Set so the library's
  llama31-405b-h100-tp8-pp8-cp2 runs (its steady-state run: 56 micro-batches, 856,091 ops, bound
  1,152,768). With the compiled core a run costs ~15 us CPU and ~1.2 KB per op: 405B, 12 s CPU and
  1.1 GB; at the limit, a 64-rank CP ring over 500 layers, 5 micro-batches, --full (bound 1,132,560):
  13 s CPU and 1.1 GB (benchmarks/limits.py, loaded 2-core machine). So accepted runs stay under a minute
  but not under 1 GB: memory per op (the Op objects, ~340 B of it) is what holds the limit down. Counting
  layer passes (before issue 44, ~110 ops each assumed) let a CP ring of 64 ranks (350 ops per pass) run
  99 s and 2 GB.
- 576 GPUs in one node of a simulated scenario (NVL576, the largest announced NVLink domain): ring search,
  tree plans and link sharing are quadratic in the GPUs of a node (1,280 GPUs: 75 s, 1.1 GB); loading or
  showing a larger custom node stays cheap (one search per switch).
- 512 ranks in one all-to-all (parallel.ep, `meshsim collective --op all_to_all`): it has ranks^2 flows
  sharing links (512 ranks: 16-25 s and 440 MB).
benchmarks/limits.py runs a case at each limit and prints its time and peak RSS.
The library's largest scenario (gpt3-175b-a100-16node) uses 1,536 layer passes and 128 GPUs.
"""

from __future__ import annotations

import math

from meshsim.sim.core.errors import UserError

MAX_LAYERS = 1_000  # model.layers (the largest public dense models have ~126)
MAX_MODEL_DIM = 1 << 24  # hidden, ffn_hidden, heads, kv_heads, seq_len, vocab (16,777,216)
MAX_GPUS = 16_384  # GPUs of a topology (nodes x GPUs per node)
MAX_MICRO_BATCHES = 10_000  # micro-batches per DP rank per step (global_batch / (micro_batch x dp))
MAX_SIMULATED_OPS = 1_200_000  # ops of one simulation run, by a closed-form bound (see above)
MAX_EXPLICIT_RANKS = 64  # ranks simulated by `meshsim run --explicit-ranks` (tp x min(dp, 2))
MAX_SWEEP_POINTS = 1_024  # configurations of one sweep (product of its axes)
MAX_COLLECTIVE_BYTES = 1 << 50  # one collective's payload (1 PiB), `meshsim collective --max-bytes`
MAX_SIZE_ROWS = 1_000  # sizes of one `meshsim collective` sweep (min..max by --step-factor)
MAX_DEVICES = 20_000  # devices of a custom topology file (one node)
MAX_LINKS = 200_000  # links of a custom topology file (one node)
MAX_NICS_PER_NODE = 256  # NICs of one custom node joined into several nodes (one rail each)
MAX_TRANSIT_GPUS = 256  # GPUs of one node with nvlink_gpu_transit (routes search through GPUs)
MAX_NODE_GPUS = 576  # GPUs of one node a scenario simulates (ring search and link sharing are quadratic in it)
MAX_ALL_TO_ALL_RANKS = 512  # ranks of one all-to-all (parallel.ep; meshsim collective --op all_to_all)
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


def check_nodes(flag: str, nodes: int | None) -> None:
    """--nodes (when given) is a whole number of nodes >= 1 (every command that takes it; the GPU limit is
    checked where the topology is built)."""
    if nodes is not None and nodes < 1:
        raise UserError(flag, nodes, f"use {flag} 1 or more (nodes joined by the IB fabric)",
                        problem="Not a number of nodes")


def check_finite(field: str, value: float, fix: str, *, source: str | None = None) -> None:
    if not math.isfinite(value):
        raise UserError(field, value, fix, source=source, problem="Not a finite number")


def check_work(layers: int, micro_batches: int, *, source: str | None = None) -> None:
    """At load: micro-batches per step (what one simulation run costs is checked where the run's
    micro-batches are known: check_simulated_work)."""
    check_at_most("parallel.global_batch", micro_batches, MAX_MICRO_BATCHES,
                  "use a smaller global_batch or a larger micro_batch", source=source,
                  what="micro-batches per step (global_batch / (micro_batch x dp))")


def check_simulated_ops(bound: int, layers: int, micro_batches: int, *, most: int, ops_per_pass: int,
                        source: str | None = None, pp: int = 1, why: str = "") -> None:
    """Before the engine runs: `bound` (scenarios/limits.simulated_ops_bound, a closed form that is >= the ops
    the run builds) is at most MAX_SIMULATED_OPS. The run simulates model.layers (a pipeline simulates every
    stage, whose layers add up to model.layers) x its micro-batches layer passes (the whole step, or the
    short run its steady state is extrapolated from, ~2 pp + 2 micro-batches for a pipeline), each of at
    most `ops_per_pass` ops; `most`: the micro-batches the bound allows."""
    stages = f"; with pp = {pp} the steady state needs ~{2 * pp + 2} micro-batches simulated: use fewer " \
             "pipeline stages" if pp > 1 else ""
    check_at_most("model.layers x micro-batches", f"{layers:,} x {micro_batches:,}", MAX_SIMULATED_OPS,
                  f"use at most {most:,} micro-batches per step (a smaller global_batch, a larger micro_batch or "
                  f"more dp), fewer layers, or a layout with fewer ops per layer (a smaller cp ring, no "
                  f"tp_comm_overlap, no recompute){stages}", source=source,
                  what=f"ops simulated{why}, bounded by {layers:,} layers x {micro_batches:,} micro-batches x <= "
                       f"{ops_per_pass:,} ops per layer pass,", amount=bound)
