"""report.html of a search: the sweep's page (sim/sweep/report_page.py: explanation, throughput,
critical-path and memory figures, the table of every simulated layout) with the search's counts and a
figure of the lower bound against the simulated step of every simulated layout."""

from __future__ import annotations

import html
from pathlib import Path

from meshsim.sim.core.fmt import fmt_s
from meshsim.sim.search.result import SearchResult
from meshsim.sim.sweep.report_page import REPORT_NAME, report_html

ANCHOR = "<h2>All configurations</h2>"


def summary_line(result: SearchResult) -> str:
    """'searched N, refused R (rule n, ...), out of memory M, pruned by the bound P (K of them on the cheap
    bound alone), simulated S'."""
    rules = ", ".join(f"{r.rule} {r.count:,}" for r in result.refused)
    failed = f" ({len(result.failed)} refused by the simulation)" if result.failed else ""
    unscreened = f" ({result.unscreened:,} not screened: --budget)" if result.unscreened else ""
    return (f"searched {result.searched:,}{unscreened}, refused {result.refused_total:,}" + (f" ({rules})" if rules else "")
            + f", out of memory {result.out_of_memory:,}, pruned by the bound {result.pruned:,} "
            f"({len(result.entries) - result.refined:,} on the cheap bound alone), "
            f"simulated {len(result.simulated):,}{failed}" + (f" ({result.needed_for_proof:,} of them for the proof, "
                                                              "the rest for the error band)" if result.proven else ""))


def verdict(result: SearchResult) -> str:
    """What the winner is, and which claims hold (branch.py step 4: with --budget each is stated on its own)."""
    if result.winner is None:
        return "No layout of the space ran and fits in memory." + (f" {result.stop_reason}." if result.unscreened else "")
    step = fmt_s(result.winner.step_s)
    if result.proven:
        text = (f"{result.winner.key} is the fastest layout of the space under meshsim's model (step {step}): "
                "every layout not simulated has a lower bound at least that step, and no simulated one is faster.")
        if not result.band_complete:
            text += (f" The list of layouts that could be the best within the model's error is incomplete: "
                     f"{result.stop_reason} with {result.band_missing:,} layouts whose bound is within the band "
                     "not simulated.")
        return text
    lacking = f"{result.unproven:,} layouts with a lower bound below that step were not simulated" + (
        f" and {result.unscreened:,} were not screened" if result.unscreened else "")
    return (f"{result.winner.key} is the fastest layout simulated (step {step}), not proven optimal: "
            f"{result.stop_reason}; {lacking}. Neither claim (proven optimal, the error band's list) holds.")


def bound_figure(result: SearchResult):
    """Simulated step (x) against the lower bound (y) of every simulated layout, with y = x."""
    import plotly.graph_objects as go  # heavy: only when a report is drawn

    sims = [e for e in result.simulated if e.step_s is not None]
    xs, ys = [e.step_s for e in sims], [e.bound.step_s for e in sims]
    top = max(xs, default=1.0)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="bound = simulated",
                             line=dict(color="#888", dash="dash")))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="simulated layouts", marker=dict(size=8),
                             hovertext=[f"{e.key}<br>step {fmt_s(e.step_s)}, bound {fmt_s(e.bound.step_s)} "
                                        f"({e.tightness:.2f}); bound set by stage {e.bound.binding[0]} "
                                        f"{e.bound.binding[1]}" for e in sims], hoverinfo="text"))
    if result.winner is not None:
        fig.add_trace(go.Scatter(x=[result.winner.step_s], y=[result.winner.bound.step_s], mode="markers",
                                 name="winner", marker=dict(symbol="star", size=16, color="gold")))
    fig.update_layout(title="Lower bound against the simulated step (every point on or below the line)",
                      xaxis_title="simulated step (s)", yaxis_title="lower bound (s)", height=480)
    return fig


def write_search_report(result: SearchResult, out_dir: str | Path) -> Path:
    records = [e.record for e in result.simulated]
    page = report_html(records, list(result.explanation), f"meshsim search of {result.scenario}")
    head = (f"<h2>Search</h2><p>{html.escape(summary_line(result))}.</p><p><b>{html.escape(verdict(result))}</b></p>"
            f"<div class='fig'>{bound_figure(result).to_html(full_html=False, include_plotlyjs=False)}</div>")
    page = page.replace(ANCHOR, head + ANCHOR, 1)
    path = Path(out_dir) / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path
