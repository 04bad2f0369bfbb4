"""Regenerate tests/golden/headlines.json: `python tests/golden/update.py`; `--check` compares instead of
writing (exit 1 naming the scenarios whose figures moved, 0 when none did).

Run it only when a model change is meant to move the figures, and say why in the commit message;
tests/test_golden.py then pins the new figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from golden_figures import headline_figures  # noqa: E402

from meshsim.scenarios.library import builtin_scenarios  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with headlines.json, write nothing")
    args = parser.parse_args()
    figures = {name: headline_figures(name) for name in sorted(builtin_scenarios())}
    path = HERE / "headlines.json"
    if args.check:
        pinned = json.loads(path.read_text())
        moved = sorted(n for n in figures.keys() | pinned.keys() if figures.get(n) != pinned.get(n))
        print(f"{len(moved)} of {len(figures)} scenarios moved" + (f": {', '.join(moved)}" if moved else ""))
        return 1 if moved else 0
    path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: {len(figures)} scenarios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
