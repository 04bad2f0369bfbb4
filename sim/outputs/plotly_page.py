"""A self-contained plotly HTML page written from a plain figure dict, without importing plotly.

Importing plotly and validating a figure cost ~0.4 s of CPU per `meshsim run`, more than simulating
the step. The timeline's figure is a plain dict (the schema plotly.js reads), so the page is written
directly: plotly.js (`plotly/package_data/plotly.min.js`) and the named template (`.../templates/<name>.json`)
are read from the installed plotly package as files (importlib's spec finds the folder without executing
plotly), and the figure goes in as JSON. Numeric arrays travel as plotly.js typed arrays
(`{"dtype": "f4", "bdata": base64}`, what plotly >= 6 writes itself), float32 little-endian.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from array import array
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from meshsim.sim.core.outfiles import open_own_for_writing


def typed_array(values: Iterable[float]) -> dict[str, str]:
    """A float32 typed-array spec plotly.js decodes (NaN kept: it breaks a line between segments). A numpy
    array is converted by numpy (float64 -> float32 rounds to nearest, as the C cast array("f") uses does),
    anything else through array("f"): the same bytes for the same values."""
    if hasattr(values, "astype"):  # a numpy array: no per-value Python float
        raw = values.astype("<f4").tobytes()
    else:
        data = array("f", values)
        if sys.byteorder != "little":
            data.byteswap()
        raw = data.tobytes()
    return {"dtype": "f4", "bdata": base64.b64encode(raw).decode("ascii")}


def decode_typed_array(spec: Mapping[str, str]) -> list[float]:
    """The floats of a typed-array spec (for tests and readers)."""
    data = array("f", base64.b64decode(spec["bdata"]))
    if sys.byteorder != "little":
        data.byteswap()
    return list(data)


@lru_cache(maxsize=1)
def _package_data() -> Path:
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("plotly is not installed (it ships the plotly.js the page embeds)")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data"


@lru_cache(maxsize=4)
def template(name: str) -> dict[str, Any]:
    """plotly's named template (e.g. "plotly_white"), as plotly itself embeds it in a figure's layout."""
    return json.loads((_package_data() / "templates" / f"{name}.json").read_text())


def figure_json(figure: Mapping[str, Any]) -> str:
    """JSON of the figure, safe inside a <script> element ("</" cannot close it)."""
    return json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def write_page(path: Path, figure: Mapping[str, Any], height_px: int) -> Path:
    """One HTML page: plotly.js inline, then Plotly.newPlot of the figure (works offline). Written as
    UTF-8 bytes; plotly.js is copied as bytes, with its line ends made "\\n" as a text read would."""
    plotly_js = (_package_data() / "plotly.min.js").read_bytes()
    if b"\r" in plotly_js:
        plotly_js = plotly_js.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    head = ('<html>\n<head><meta charset="utf-8" /></head>\n<body>\n'
            f'<div id="timeline" style="height:{height_px}px; width:100%;"></div>\n'
            '<script type="text/javascript">window.PlotlyConfig = {MathJaxConfig: "local"};</script>\n'
            '<script type="text/javascript">')
    tail = ("</script>\n<script type=\"text/javascript\">\n"
            f"(function () {{ var fig = {figure_json(figure)};\n"
            'Plotly.newPlot("timeline", fig.data, fig.layout, {"responsive": true}); })();\n'
            "</script>\n</body>\n</html>\n")
    with open_own_for_writing(path, "wb") as f:  # never through a link made after the checks
        f.write(head.encode("utf-8"))
        f.write(plotly_js)
        f.write(tail.encode("utf-8"))
    return path
