"""compare.html: the comparison of two results as a small static page (no script), written beside the
merged trace by `meshsim compare --out DIR`: the configuration (differences first), the headline and
the step-time tables, and a link to the merged trace for Perfetto. `fmt_value` formats one cell for
this page and for the terminal tables of sim/sweep/compare.py."""

from __future__ import annotations

import html
from pathlib import Path

from meshsim.sim.core.fmt import fmt_count, fmt_pct, time_column

COMPARED_TABLES = (("Headline", "headline"),
                   ("Step time ({unit}): the critical path adds up to 'step'; busy times overlap", "categories"))
_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1100px} table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right} td:first-child{text-align:left}"
        "tr.diff{background:#fff3b0;font-weight:bold}")


COMPARED_HEAD = ("A", "B", "B - A", "B vs A")


def fmt_value(value: object, name: str = "") -> str:
    """A configuration cell: on/off, counts with separators, lists comma-joined, sections as key=value,
    text as it is."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in value.items()) or "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return fmt_count(value)
    return f"{value:,.4g}" if isinstance(value, float) else str(value)


def _decimal(value: float) -> str:
    return f"{value:,.1f}"


def _signed(text: str) -> str:
    """A delta: '+' before a positive figure, no sign on one that reads as zero ('0.000', not '-0.000')."""
    digits = text.lstrip("+-").replace(",", "")
    if not any(ch not in "0." for ch in digits):
        return digits
    return text if text.startswith("-") else "+" + text


def compared_cells(rows: list[dict]) -> tuple[str, list[list[str]]]:
    """(time unit, [label, A, B, B - A, B vs A] per row). One number format per row kind, shared by the
    row's A, B and delta: times in one unit and one number of decimals for the whole table (time_column
    over every time in it), counts with separators, other figures with one decimal; the percentage is
    never '0%' for a change that is not zero (fmt_pct). A label names its section only where it starts
    (section_rows)."""
    times = [abs(v) for r in rows if r["kind"] == "time" for v in (r["a"], r["b"], r["delta"]) if v is not None]
    unit, fmt_time = time_column(times or [1.0])
    fmt = {"time": fmt_time, "count": fmt_count, "decimal": _decimal}
    out = []
    for r in rows:
        f = fmt[r["kind"]]
        name = r["name"].replace("(s)", f"({unit})") if r["kind"] == "time" else r["name"]
        out.append([name, "-" if r["a"] is None else f(r["a"]), "-" if r["b"] is None else f(r["b"]),
                    "-" if r["delta"] is None else _signed(f(r["delta"])),
                    "-" if r["delta_pct"] is None else fmt_pct(r["delta_pct"] / 100, 1, signed=True)])
    return unit, out


def section_rows(rows: list[dict], cells: list[list[str]]) -> list[tuple[list[str], bool]]:
    """(cells, is_heading): a heading row ('critical path') where a section starts, its rows indented
    under it without the repeated prefix."""
    out, current = [], ""
    for row, cell in zip(rows, cells, strict=True):
        section = row.get("section", "")
        if section and section != current:
            out.append(([f"{section}:"] + [""] * (len(cell) - 1), True))
        current = section
        label = cell[0].removeprefix(f"{section}: ") if section else cell[0]
        out.append(([("  " if section else "") + label, *cell[1:]], False))
    return out


def _table(title: str, head: list[str], rows: list[tuple[list[str], bool]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(("<tr class='diff'>" if marked else "<tr>") + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                   + "</tr>" for cells, marked in rows)
    return f"<h2>{html.escape(title)}</h2><table><tr>{th}</tr>{body}</table>"


def page_html(comparison: dict) -> str:
    label_a, label_b = comparison["labels"]
    config = [([r["name"], fmt_value(r["a"], ""), fmt_value(r["b"], "")], r["differs"]) for r in comparison["config"]]
    parts = [_table("Configuration (differences highlighted)", ["", label_a, label_b], config)]
    parts.insert(0, f"<p>A: {html.escape(label_a.removeprefix('A: '))}<br>B: {html.escape(label_b.removeprefix('B: '))}</p>")
    for title, key in COMPARED_TABLES:
        unit, cells = compared_cells(comparison[key])
        parts.append(_table(title.format(unit=unit), ["", *COMPARED_HEAD], section_rows(comparison[key], cells)))
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
