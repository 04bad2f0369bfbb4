"""compare.html: the comparison of two results as a small static page (no script), written beside the
merged trace by `meshsim compare --out DIR`: the configuration (differences first), the headline and
the step-time tables, and a link to the merged trace for Perfetto. `fmt_value` formats one cell for
this page and for the terminal tables of sim/sweep/compare.py."""

from __future__ import annotations

import html
from pathlib import Path

from meshsim.sim.core.fmt import fmt_count

_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1100px} table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right} td:first-child{text-align:left}"
        "tr.diff{background:#fff3b0;font-weight:bold}")


def fmt_value(value: object, name: str) -> str:
    """One cell: counts with separators, small figures with 4 significant digits, never an exponent."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if not isinstance(value, int | float):
        return str(value)
    if name.startswith("tokens/s") or isinstance(value, int) or abs(value) >= 1000:
        return fmt_count(value)
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"


def _table(title: str, head: list[str], rows: list[tuple[list[str], bool]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(("<tr class='diff'>" if marked else "<tr>") + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                   + "</tr>" for cells, marked in rows)
    return f"<h2>{html.escape(title)}</h2><table><tr>{th}</tr>{body}</table>"


def page_html(comparison: dict) -> str:
    label_a, label_b = comparison["labels"]
    config = [([r["name"], fmt_value(r["a"], ""), fmt_value(r["b"], "")], r["differs"]) for r in comparison["config"]]
    parts = [_table("Configuration (differences highlighted)", ["", label_a, label_b], config)]
    for title, key in (("Headline", "headline"),
                       ("Step time (s): critical-path rows add up to the step; busy rows overlap", "categories")):
        rows = [([r["name"], fmt_value(r["a"], r["name"]), fmt_value(r["b"], r["name"]),
                  fmt_value(r["delta"], r["name"]), "-" if r["delta_pct"] is None else f"{r['delta_pct']:+.1f}%"],
                 False) for r in comparison[key]]
        parts.append(_table(title, ["", label_a, label_b, "B - A", "B vs A"], rows))
    fits = ", ".join(f"{lab}: {'fits' if f else 'does NOT fit'}" for lab, f in zip(comparison["labels"],
                                                                                    comparison["fits"], strict=True))
    parts.append(f"<p>Memory: {html.escape(fits)}</p>")
    if comparison.get("trace"):
        name = html.escape(Path(comparison["trace"]).name)
        parts.append(f"<p>Both timelines: <a href='{name}'>{name}</a> (open it in https://ui.perfetto.dev).</p>")
    if comparison.get("note"):
        parts.append(f"<p>{html.escape(comparison['note'])}</p>")
    title = html.escape(f"{label_a} vs {label_b}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
            f"</head><body><h1>{title}</h1>{''.join(parts)}</body></html>")


def write_page(comparison: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(page_html(comparison))
    return path
