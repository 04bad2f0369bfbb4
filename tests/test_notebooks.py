"""The notebooks execute top to bottom with the python3 kernel, render their plotly figures, and are
committed with outputs cleared. Their figures survive export: each is stored as HTML with plotly.js
embedded (not only the plotly mimetype, which only a live Jupyter renders), and the notebook converted
with nbconvert to HTML holds every figure."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ("tp_sweet_spot.ipynb", "timeline_and_what_if.ipynb")
CELL_TIMEOUT_S = 600  # a bound on a hung cell, not a speed check (no test asserts wall-clock time)


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs(name):
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code, "no code cells"
    assert all(c.outputs == [] and c.execution_count is None for c in code), f"{name}: clear outputs before committing"


def _plotly_outputs(book) -> int:
    """Figures stored in a form that survives export: an HTML output that draws a plotly figure."""
    count = 0
    for cell in book.cells:
        for out in cell.get("outputs", []):
            count += "Plotly.newPlot" in str(out.get("data", {}).get("text/html", ""))
    return count


def _exported_figures(book) -> tuple[int, bool]:
    """(figures drawn, plotly.js embedded) in the notebook converted to HTML as nbconvert does it."""
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(book)
    return page.count("Plotly.newPlot("), "plotly.js v" in page


@pytest.mark.slow
@pytest.mark.parametrize("name,min_figures", [(NAMES[0], 6), (NAMES[1], 2)])
def test_notebook_executes(name, min_figures, tmp_path):
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(book, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert _plotly_outputs(book) >= min_figures
    drawn, embedded = _exported_figures(book)
    assert drawn >= min_figures and embedded
