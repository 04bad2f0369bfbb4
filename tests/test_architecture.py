"""The import graph follows the flow: no upward import, no peer import, no cycle, and function-level
imports only for optional or heavy third-party packages (tests/import_graph.py reads it with ast)."""

from __future__ import annotations

import ast

import pytest
from import_graph import (
    LAYERS,
    LAZY_ALLOWED,
    LAZY_MESHSIM,
    PEERS,
    ROOT,
    find_cycle,
    known_modules,
    layer_of,
    meshsim_imports,
    module_name,
    source_files,
)


def test_every_module_sits_in_a_layer():
    for module in known_modules():
        if module in ("meshsim.sim", "meshsim.validate"):
            continue
        layer_of(module)


def test_no_import_points_upward():
    upward = [f"{i.src}:{i.line} imports {i.dst}" for i in meshsim_imports()
              if i.src not in ("meshsim.sim", "meshsim.validate") and layer_of(i.dst) > layer_of(i.src)]
    assert upward == []


def test_peers_do_not_import_each_other():
    bad = [f"{i.src}:{i.line} imports {i.dst}" for i in meshsim_imports()
           for a, b in PEERS for x, y in ((a, b), (b, a))
           if i.src.startswith(x + ".") and i.dst.startswith(y + ".")]
    assert bad == []


def test_no_import_cycle():
    edges: dict[str, set[str]] = {}
    for i in meshsim_imports():
        edges.setdefault(i.src, set()).add(i.dst)
    assert find_cycle(edges) is None


def test_meshsim_is_imported_at_module_level_only():
    hidden = [f"{i.src}:{i.line} imports {i.dst} inside a function" for i in meshsim_imports()
              if i.in_function and not i.dst.startswith(LAZY_MESHSIM.get(i.src, "-"))]
    assert hidden == []


def test_function_level_imports_are_optional_heavy_packages_with_a_comment():
    bad = []
    for path in source_files():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    name = inner.module if isinstance(inner, ast.ImportFrom) else inner.names[0].name
                    root = (name or "").split(".")[0]
                    context = "".join(lines[max(0, inner.lineno - 4):inner.lineno])  # the line or the 3 above
                    allowed = root in LAZY_ALLOWED or name.startswith(LAZY_MESHSIM.get(module_name(path), "-"))
                    if not allowed or "#" not in context:
                        bad.append(f"{module_name(path)}:{inner.lineno} {name}")
    assert bad == []


def test_the_checker_sees_an_upward_import_and_a_cycle():
    """Negative controls: the rules above would catch a violation."""
    assert layer_of("meshsim.topologies.model") < layer_of("meshsim.sim.engine.events")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
    assert len(LAYERS) == len(set(LAYERS))


@pytest.mark.parametrize("folder", ["sim", "validate"])
def test_stage_folders_hold_no_loose_modules(folder):
    """sim/ and validate/ are organised by stage: loose modules only where the layers name them."""
    loose = {module_name(p) for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
    assert loose <= set(LAYERS)
