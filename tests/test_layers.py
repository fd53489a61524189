"""The architecture is one-way (README, Layout): storage → flink → records → assign → engine →
writer → what operations share → operations → CLI, with errors, text, input-file checks, the
release of freed memory and the compiled loops of framing (``framing``: read by the format's
buffers and the records alike) at the bottom. Every ``ckpt_tool`` import, lazy ones inside functions
included, points down or stays in its own part, and no modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ckpt_tool"

RANK = {
    "__init__": 0,
    "errors": 0,
    "text": 0,
    "input_files": 0,
    "memory": 0,
    "framing": 0,
    "storage": 1,
    "flink": 2,
    "records": 3,
    "assign": 4,
    "engine": 5,
    "writer": 6,
    "output_files": 7,
    "exchanges": 7,
    "planning": 7,
    "carried": 7,
    "channel_bounds": 7,
    "topology": 7,
    "rewrite": 7,
    "session": 7,
    "ops": 8,
    "cli": 9,
}


def _imports() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        targets = edges.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckpt_tool"):
                targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name.startswith("ckpt_tool"))
    return edges


def _part(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def test_every_part_is_ranked():
    parts = {_part(module) for module in _imports()}
    assert parts <= set(RANK), sorted(parts - set(RANK))


def test_imports_point_down():
    up = sorted(
        (module, target)
        for module, targets in _imports().items()
        for target in targets
        if RANK[_part(target)] > RANK[_part(module)]
    )
    assert up == []


def test_no_circles():
    edges = _imports()
    cycles = []
    for start in edges:  # a path back to the start through modules other than a package's own __init__
        seen: set[str] = set()
        stack = [(target, (start, target)) for target in edges[start] if target != start]
        while stack:
            module, path = stack.pop()
            if module == start:
                cycles.append(path)
                break
            if module in seen:
                continue
            seen.add(module)
            stack.extend((target, path + (target,)) for target in edges.get(module, ()) if target != module)
    # a package's __init__ importing its own submodule, and that submodule importing the package, is a circle too
    assert sorted({tuple(sorted(set(cycle))) for cycle in cycles}) == []
