"""Layers only look down, lazy imports inside functions included: the engine (train/, export/, dist/)
never reaches the front doors (cli, api), and model I/O (onnx/, sources/, convert/) never the data
and training code above it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gluontl"
# known, not yet moved: reading a run folder's checkpoint as model.weights needs train/checkpoint's hash check
KNOWN = {"gluontl/sources/restore.py imports gluontl.train.runs",
         "gluontl/sources/restore.py imports gluontl.train.runs.run_weights"}


def imported(path: Path) -> set[str]:
    """Every gluontl module ``path`` imports, at any depth of its code, as a dotted name."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - n.level + 1] if n.level else []
            stem = ".".join(base + ([n.module] if n.module else []))
            out |= {stem} | {f"{stem}.{a.name}" for a in n.names}
    return {m for m in out if m == "gluontl" or m.startswith("gluontl.")}


def under(m: str, prefixes: tuple[str, ...]) -> bool:
    return any(m == p or m.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("lower, upper", [
    (("train", "export", "dist"), ("gluontl.cli", "gluontl.api")),
    (("onnx", "sources", "convert"), ("gluontl.train", "gluontl.tasks", "gluontl.cli", "gluontl.api"))])
def test_no_upward_import(lower, upper):
    found = {f"{p.relative_to(PACKAGE.parent)} imports {m}" for d in lower for p in (PACKAGE / d).rglob("*.py")
             for m in imported(p) if under(m, upper)}
    assert not found - KNOWN, sorted(found - KNOWN)
