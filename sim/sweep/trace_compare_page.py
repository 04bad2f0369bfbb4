"""What `meshsim compare ... --trace PATH --out DIR` writes besides compare_trace.json:
- compare_trace.html: the simulated step (rank 0, one lane per stream) above the traced step (the lowest
  rank, one lane per stream or CPU thread) on one time axis, milliseconds from each step's start, bars
  coloured by kernel class (sim/kineto/classify.py); the same plotly page machinery as timeline.html
  (sim/outputs/plotly_page.py: WebGL segments, typed arrays, no plotly import);
- trace.json: the two as one Perfetto / Chrome trace (sim/sweep/compare.py merge_traces): the simulated
  ranks as "simulated" processes, the traced step's kernels as "measured" ones, both starting at 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshsim.sim.core.outfiles import write_output_file
from meshsim.sim.core.userio import dumps_finite
from meshsim.sim.kineto.classify import family, work_class
from meshsim.sim.kineto.kernels import Kernel
from meshsim.sim.outputs.plotly_page import template, typed_array, write_page
from meshsim.sim.outputs.trace import trace_events
from meshsim.sim.sweep.compare import merge_traces
from meshsim.sim.sweep.trace_compare import SimSide

COLOURS = {"gemm": "#1f77b4", "attention": "#9467bd", "norm": "#17becf", "elementwise": "#2ca02c",
           "optimizer": "#8c564b", "conv": "#7f7f7f", "collective": "#d62728", "p2p": "#ff7f0e",
           "memcpy": "#bcbd22", "memset": "#e377c2", "other": "#aaaaaa"}
LANE_PX = 22


def _bars(items: Sequence[tuple[str, int, float, float]]) -> dict[str, tuple[list[float], list[float]]]:
    """class -> (x, y) segment coordinates, NaN-separated, of (class, lane, start_ms, end_ms) bars."""
    out: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for cls, lane, a, b in items:
        xs, ys = out[cls]
        xs += [a, b, math.nan]
        ys += [lane, lane, math.nan]
    return out


def sim_bars(sim: SimSide) -> tuple[list[tuple[str, int, float, float]], list[str]]:
    works = {op.id: op.work for op in sim.schedule.ops}
    lanes = sorted({e.stream for e in sim.events}, key=["compute", "tp_comm", "dp_comm", "pp_comm"].index)
    t0 = min((e.start_s for e in sim.events), default=0.0)
    items = [(family(work_class(works[e.op_id])) if e.op_id in works else "other", lanes.index(e.stream),
              (e.start_s - t0) * 1e3, (e.end_s - t0) * 1e3) for e in sim.events]
    return items, [f"simulated {s}" for s in lanes]


def measured_bars(kernels: Sequence[Kernel], t0_us: float) -> tuple[list[tuple[str, int, float, float]], list[str]]:
    lanes = sorted({k.ev.stream for k in kernels})
    items = [(family(k.cls), lanes.index(k.ev.stream), (k.ev.ts - t0_us) / 1e3, (k.ev.end - t0_us) / 1e3)
             for k in kernels]
    return items, [f"measured stream {s}" for s in lanes]


def figure(sim: SimSide, kernels: Sequence[Kernel], t0_us: float, title: str) -> dict[str, Any]:
    top, top_names = sim_bars(sim)
    bottom, bottom_names = measured_bars(kernels, t0_us)
    data = []
    for axis, items in (("y", top), ("y2", bottom)):
        for cls, (xs, ys) in sorted(_bars(items).items()):
            data.append({"type": "scattergl", "mode": "lines", "x": typed_array(xs), "y": typed_array(ys),
                         "yaxis": axis, "name": cls, "legendgroup": cls, "showlegend": axis == "y",
                         "line": {"color": COLOURS.get(cls, "#aaaaaa"), "width": 14}, "hoverinfo": "x+name"})
    split = len(bottom_names) / (len(top_names) + len(bottom_names)) if top_names or bottom_names else 0.5
    gap = 0.06
    layout = {"template": template("plotly_white"), "title": {"text": title},
              "xaxis": {"title": {"text": "ms from the step's start"}, "anchor": "y2",
                        "rangeslider": {"visible": True, "thickness": 0.06}},
              "yaxis": {"domain": [min(1.0, split + gap / 2), 1.0], "tickvals": list(range(len(top_names))),
                        "ticktext": top_names, "autorange": "reversed"},
              "yaxis2": {"domain": [0.0, max(0.0, split - gap / 2)], "tickvals": list(range(len(bottom_names))),
                         "ticktext": bottom_names, "autorange": "reversed"}}
    return {"data": data, "layout": layout}


def measured_trace_events(kernels: Sequence[Kernel], t0_us: float, rank: int) -> list[dict[str, Any]]:
    """The traced step's kernels as trace events (pid = rank, tid = stream), times from its start."""
    out: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                                  "args": {"name": f"rank {rank}"}}]
    for s in sorted({k.ev.stream for k in kernels}):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": s, "args": {"name": f"stream {s}"}})
    for k in kernels:
        args: dict[str, Any] = {"class": k.cls}
        if k.label:
            args["op"] = k.label
        if k.coll is not None:
            args.update({"Collective name": k.coll.op, "bytes": k.coll.nbytes, "Group size": k.coll.group})
        out.append({"name": k.ev.name, "cat": "kernel", "ph": "X", "ts": k.ev.ts - t0_us, "dur": k.ev.dur,
                    "pid": rank, "tid": k.ev.stream, "args": args})
    return out


def write_outputs(out: Path, doc: dict, sim: SimSide, kernels: Sequence[Kernel], t0_us: float, rank: int) -> dict:
    """compare_trace.json, compare_trace.html and the merged trace.json in `out`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "compare_trace.json", "page": out / "compare_trace.html", "trace": out / "trace.json"}
    write_output_file("--out", paths["json"], dumps_finite(doc, indent=1))
    title = f"{sim.label}: simulated (top) and traced rank {rank} (bottom)"
    lanes = len({e.stream for e in sim.events}) + len({k.ev.stream for k in kernels})
    write_page(paths["page"], figure(sim, kernels, t0_us, title), 260 + 2 * LANE_PX * lanes)
    t_sim = min((e.start_s for e in sim.events), default=0.0)
    sim_events = trace_events([e._replace(start_s=e.start_s - t_sim, end_s=e.end_s - t_sim) for e in sim.events],
                              (), result=sim.result)
    merged = merge_traces(sim_events, measured_trace_events(kernels, t0_us, rank), "simulated", "measured")
    write_output_file("--out", paths["trace"], dumps_finite(merged, separators=(",", ":")))
    return {k: str(v) for k, v in paths.items()}
