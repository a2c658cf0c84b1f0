#!/usr/bin/env python
"""Rewrite the imports of test code written before tests/ became packages (issue 32).

    python scripts/test_imports.py      # from the checkout root; prints each file it rewrote

``import helpers`` becomes ``from tests import helpers``, ``from opcheck import x`` becomes
``from tests.onnx.opcheck import x``: every bare import of a module under tests/ by its dotted
name from the root. For branches merged after the move; a second run rewrites nothing.
"""
import pathlib
import re

tests = pathlib.Path(__file__).resolve().parents[1] / "tests"
dotted = {p.stem: ".".join(p.relative_to(tests.parent).with_suffix("").parts)
          for p in tests.rglob("*.py") if p.stem not in ("conftest", "__init__")}
for path in sorted(tests.rglob("*.py")):
    text = path.read_text()
    new = re.sub(r"^(\s*)import (\w+)$", lambda m: f"{m[1]}from {dotted[m[2]].rsplit('.', 1)[0]} import {m[2]}"
                 if m[2] in dotted else m[0], text, flags=re.M)
    new = re.sub(r"^(\s*)from (\w+) import ", lambda m: f"{m[1]}from {dotted[m[2]]} import " if m[2] in dotted else m[0],
                 new, flags=re.M)
    if new != text:
        path.write_text(new)
        print(path.relative_to(tests.parent))
