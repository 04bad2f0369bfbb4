"""`meshsim collective`: nccl-tests, simulated, on a topology preset.

Prints one row per size (bytes, time_us, algbw_gbps, busbw_gbps, algorithm), optionally writes the
rows as JSON (a list of objects with exactly those keys) and a self-contained plotly HTML of busbw
against size with one line per applicable algorithm plus the auto choice.
Bad input raises UserError: printed on one line, exit status 2, no traceback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import typer

from meshsim.sim.core.console import Column, fitted_table, make_console, print_fitted
from meshsim.sim.core.errors import EXIT_USER_ERROR, UserError, unknown_name_error
from meshsim.sim.core.fmt import fmt_bytes, fmt_count
from meshsim.sim.core.limits import (
    MAX_ALL_TO_ALL_RANKS,
    MAX_COLLECTIVE_BYTES,
    MAX_SIZE_ROWS,
    check_at_most,
    check_nodes,
)
from meshsim.sim.core.outfiles import check_output_file
from meshsim.sim.core.text import echo_plain
from meshsim.sim.core.units import format_size, parse_size
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.cost.collectives.choose import ALGOS, OPS, PROTOCOL_NAMES
from meshsim.sim.cost.collectives.nccl_table import Row, curves, sweep, sweep_sizes
from meshsim.sim.outputs.busbw_plot import write_busbw_html
from meshsim.topologies.registry import build_topology

PROTOCOL_CHOICES = ("auto", *PROTOCOL_NAMES)


def _size(flag: str, text: str) -> int:
    try:
        size = parse_size(text)
    except (ValueError, OverflowError) as err:
        raise UserError(flag, text, "use a whole number of bytes with an optional K/M/G/T suffix, e.g. 64M",
                        problem=str(err)) from None
    check_at_most(flag, text, MAX_COLLECTIVE_BYTES, f"use at most {format_size(MAX_COLLECTIVE_BYTES)}",
                  what="the size in bytes", amount=size)
    return size


def _check_rows(min_bytes: int, max_bytes: int, step_factor: float) -> None:
    """--step-factor is finite and > 1, and gives at most MAX_SIZE_ROWS sizes from min to max."""
    if not (math.isfinite(step_factor) and step_factor > 1):
        raise UserError("--step-factor", step_factor, "use a finite factor > 1, e.g. 2",
                        problem="The sizes must grow from row to row")
    if 1 <= min_bytes <= max_bytes:
        rows = math.floor(math.log(max_bytes / min_bytes) / math.log(step_factor) + 1e-9) + 1
        check_at_most("--step-factor", step_factor, MAX_SIZE_ROWS, "use a larger --step-factor or a narrower "
                      "--min-bytes..--max-bytes range", what="rows", amount=rows)


def _check_names(op: str, algo: str, protocol: str) -> None:
    if op not in OPS:
        raise unknown_name_error("--op", op, OPS)
    if algo not in ("auto", *ALGOS):
        raise unknown_name_error("--algo", algo, ("auto", *ALGOS))
    if protocol not in PROTOCOL_CHOICES:
        raise unknown_name_error("--protocol", protocol, PROTOCOL_CHOICES)


def _ranks(requested: int | None, num_gpus: int, name: str, op: str) -> list[int]:
    n = num_gpus if requested is None else requested
    if num_gpus < 2:
        raise UserError("--ranks", n, f"add --nodes 2 or more ({name} has {num_gpus} GPU per node)",
                        problem="A collective needs at least 2 ranks")
    if not 2 <= n <= num_gpus:
        raise UserError("--ranks", n, f"use 2..{num_gpus} (the GPUs of {name}; add --nodes for more)")
    if op == "all_to_all":
        check_at_most("--ranks", n, MAX_ALL_TO_ALL_RANKS, f"use --ranks {MAX_ALL_TO_ALL_RANKS} or fewer (an "
                      "all-to-all's ranks^2 flows are costed one by one)", what="ranks of one all-to-all")
    return list(range(n))


COLUMNS = (Column("size", keep=True), Column("bytes", rank=0), Column("time (us)", keep=True),
           Column("algbw GB/s", rank=1), Column("busbw GB/s", keep=True), Column("algorithm", "left", keep=True))


def print_table(rows: Sequence[Row], title: str) -> None:
    cells = [[fmt_bytes(r.bytes), fmt_count(r.bytes), f"{r.time_us:,.2f}", f"{r.algbw_gbps:.2f}", f"{r.busbw_gbps:.2f}",
              r.algorithm] for r in rows]
    console = make_console()
    print_fitted(console, fitted_table(title, COLUMNS, cells, console.width))


def run_collective(topology: str, nodes: int, op: str, ranks: int | None, min_bytes: str, max_bytes: str,
                   step_factor: float, algo: str, protocol: str, json_path: Path | None,
                   plot_path: Path | None) -> list[Row]:
    """The command's work, raising UserError on bad input."""
    _check_names(op, algo, protocol)
    check_nodes("--nodes", nodes)
    check_output_file("--json", json_path)
    check_output_file("--plot", plot_path)
    low, high = _size("--min-bytes", min_bytes), _size("--max-bytes", max_bytes)
    _check_rows(low, high, step_factor)
    sizes = sweep_sizes(low, high, step_factor)
    topo = build_topology(topology, nodes)
    group = _ranks(ranks, topo.num_gpus, topo.name, op)
    rows = sweep(topo, op, group, sizes, algo=algo, protocol=protocol)
    title = f"{op} on {len(group)} ranks of {topo.name} (simulated nccl-tests)"
    print_table(rows, title)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(dumps_finite([r.to_dict() for r in rows], indent=2) + "\n")
        echo_plain(f"json: {json_path}")
    if plot_path is not None:
        # every applicable algorithm, one line each; the table's rows are the forced algorithm's (or auto's)
        lines = curves(topo, op, group, sizes, protocol=protocol, known={algo: rows})
        write_busbw_html(lines, title, plot_path)
        echo_plain(f"plot: {plot_path}")
    return rows


def register(app: typer.Typer) -> None:
    @app.command("collective")
    def collective(
        topology: str = typer.Option("dgx-h100", help="topology preset (meshsim topologies)"),
        nodes: int = typer.Option(1, help="nodes joined by the preset's IB fabric"),
        op: str = typer.Option("all_reduce", help="all_reduce | all_gather | reduce_scatter | broadcast | all_to_all"),
        ranks: int | None = typer.Option(None, help="ranks 0..N-1 take part (default: every GPU)"),
        min_bytes: str = typer.Option("1K", "--min-bytes", help="smallest size (K/M/G/T = powers of 1024)"),
        max_bytes: str = typer.Option("8G", "--max-bytes", help="largest size"),
        step_factor: float = typer.Option(2.0, "--step-factor", help="size multiplier between rows (> 1)"),
        algo: str = typer.Option("auto", help="auto | ring | tree | nvls | hierarchical | direct"),
        protocol: str = typer.Option("auto", help="auto | ll | ll128 | simple | ideal"),
        json_path: Path | None = typer.Option(None, "--json", help="write the rows as JSON here"),
        plot: Path | None = typer.Option(None, "--plot", help="write a busbw-vs-size plotly HTML here"),
    ) -> None:
        """Simulated nccl-tests: time, algbw and busbw of one collective over a size sweep."""
        try:
            run_collective(topology, nodes, op, ranks, min_bytes, max_bytes, step_factor, algo, protocol,
                           json_path, plot)
        except UserError as err:
            echo_plain(f"error: {err}", err=True)
            raise typer.Exit(EXIT_USER_ERROR) from None
