"""meshsim's import graph, read from the source with `ast` (no import is executed).

Folders map to modules as pyproject's package-dir says: `sim/cost/compute.py` is `meshsim.sim.cost.compute`.
LAYERS lists the packages from the bottom of the flow to the top; a module may import its own layer
(within the package, without cycles) and any layer below it, never one above.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_FOLDERS = ("sim", "topologies", "scenarios", "validate")

# bottom -> top; a module belongs to the longest prefix that names it
LAYERS = (
    "meshsim.sim.core",
    "meshsim.topologies",
    "meshsim.scenarios",
    "meshsim.sim.schedule",
    "meshsim.sim.cost",
    "meshsim.sim.kineto",  # reads PyTorch-profiler traces: uses op keys and busbw factors, nothing above
    "meshsim.sim.engine",
    "meshsim.sim.results",
    "meshsim.sim.outputs",
    "meshsim.sim.sweep",
    "meshsim.sim.search",  # branch and bound over layouts: runs them through the sweep
    "meshsim.sim.api",
    "meshsim.validate.stack",
    "meshsim.validate.launch",
    "meshsim.validate.numerics",
    "meshsim.validate.timing",  # may run the numerics check first (one launch for both)
    "meshsim.validate.calibrate",
    "meshsim.validate.crosscheck",
    "meshsim.validate.printing",
    "meshsim.sim.cli",
)
# peers: neither may import the other
PEERS: set[tuple[str, str]] = set()
# the only third-party modules a function body may import (optional extras or slow to load), see README
LAZY_ALLOWED = ("torch", "plotly", "ray", "nbformat", "IPython", "simpy")
# meshsim modules a function body may import: the meshsim[validate] extra (imports torch), from the CLI only
LAZY_MESHSIM = {"meshsim.sim.cli.validate": "meshsim.validate.", "meshsim.sim.cli.calibrate": "meshsim.validate."}


@dataclass(frozen=True)
class Import:
    src: str  # importing module
    dst: str  # imported module (the longest meshsim module the statement names)
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "meshsim." + ".".join(parts)


def source_files() -> list[Path]:
    return sorted(p for top in TOP_FOLDERS for p in (ROOT / top).rglob("*.py"))


def known_modules() -> set[str]:
    return {module_name(p) for p in source_files()}


def _targets(node: ast.AST, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = [f"{node.module}.{a.name}" for a in node.names]
        return [s for s in subs if s in modules] or [node.module]
    return []


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function?) for every import statement of one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for target in _targets(node, modules):
            found.append((target, node.lineno, in_function))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def meshsim_imports() -> list[Import]:
    modules = known_modules()
    out = []
    for path in source_files():
        src = module_name(path)
        for dst, line, in_function in imports_of(path, modules):
            if dst.startswith("meshsim."):
                out.append(Import(src, dst, line, in_function))
    return out


def layer_of(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise KeyError(f"{module} is in no layer of tests/import_graph.py LAYERS")
    return LAYERS.index(best)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the module graph (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None
