"""Regenerate tests/golden/headlines.json: `python tests/golden/update.py`.

Run it only when a model change is meant to move the figures, and say why in the commit message;
tests/test_golden.py then pins the new figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from golden_figures import headline_figures  # noqa: E402

from meshsim.scenarios.library import builtin_scenarios  # noqa: E402


def main() -> None:
    figures = {name: headline_figures(name) for name in sorted(builtin_scenarios())}
    (HERE / "headlines.json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"wrote {HERE / 'headlines.json'}: {len(figures)} scenarios")


if __name__ == "__main__":
    main()
