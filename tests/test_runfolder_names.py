"""A run folder's file names have one owner, ``gluontl.runfolder.RunFolder`` (issue 32): a name it
defines spelled in any other module of ``gluontl/`` fails here. Spelled means in a string constant
(f-string pieces included; docstrings are prose and do not count):

- a file name of ``RunFolder.FILE_NAMES`` anywhere in the string (``"recipe.yaml"``,
  ``f"... (no recipe.yaml)"``; ``NAME-preprocess.json`` beside an export is another name);
- a checkpoint file, ``best.params``, ``last.json``, ...;
- a folder name of ``RunFolder.DIR_NAMES`` followed by ``/`` (``"checkpoints/best.params"``), or as
  a path step: the right of a ``/`` between paths, whole or as ``NAME-...`` (``run / "checkpoints"``,
  ``run / f"feature_cache-{rank}"``); elsewhere such words are keys and prose (``"export"`` the
  recipe section).

KNOWN lists today's spellings outside the owner; it may only shrink (a fixed one leaves it in the
same commit). ``scripts/house_counts.py`` prints the count from the same walk."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

from gluontl.runfolder import TAGS, RunFolder

PACKAGE = Path(__file__).resolve().parents[1] / "gluontl"
OWNER = "runfolder.py"

# (file relative to gluontl/, name): the recipe schema is being split into a package (issue 32
# item 3); its run-folder check moves to RunFolder.of_recipe there.
KNOWN: set[tuple[str, str]] = set()


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _path_steps(tree: ast.AST) -> set[int]:
    """The string constants that are (part of) the right operand of a ``/``."""
    return {id(c) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            for c in ast.walk(node.right) if isinstance(c, ast.Constant)}


def spellings(source: str, files: Iterable[str], dirs: Iterable[str], tags: Iterable[str] = TAGS) -> list[str]:
    """The run-folder names ``source`` (a module's text) spells, one per occurrence."""
    tree = ast.parse(source)
    skip, steps = _docstrings(tree), _path_steps(tree)
    file_res = [(n, re.compile(rf"(?<![\w.-]){re.escape(n)}(?![\w-])")) for n in files]
    ckpt = re.compile(rf"(?<![\w.-])(?:{'|'.join(tags)})\.(?:params|states|ema|json)(?![\w-])")
    dir_res = [(d, re.compile(rf"(?<![\w.-]){re.escape(d)}/")) for d in dirs]
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        s = node.value
        found += [n for n, r in file_res if r.search(s)]
        found += [m.group(0) for m in ckpt.finditer(s)]
        found += [d for d, r in dir_res if r.search(s)
                  or (id(node) in steps and (s == d or s.startswith(f"{d}-")))]
    return found


def violations(package: Path = PACKAGE, files: Iterable[str] = RunFolder.FILE_NAMES,
               dirs: Iterable[str] = RunFolder.DIR_NAMES) -> list[tuple[str, str]]:
    """``(module path relative to the package, name)`` per spelling outside the owner."""
    files, dirs = list(files), list(dirs)
    return [(str(p.relative_to(package)), name) for p in sorted(package.rglob("*.py"))
            if p.relative_to(package) != Path(OWNER)
            for name in spellings(p.read_text(encoding="utf-8"), files, dirs)]


def test_run_folder_names_are_spelled_only_by_runfolder():
    new = sorted({v for v in violations() if v not in KNOWN})
    assert not new, (f"run-folder names spelled outside gluontl/runfolder.py: {new}; ask RunFolder for the path "
                     f"(e.g. RunFolder(run).recipe_path, .checkpoint('best'), .feature_cache_dir()).")


def test_known_spellings_only_shrink():
    gone = sorted(KNOWN - set(violations()))
    assert not gone, f"no longer spelled, remove from KNOWN: {gone}"


def test_the_walk_finds_each_kind_of_spelling():
    """The checker itself: each kind of spelling is found, and keys, prose and export names are not."""
    src = '''
"""A docstring naming recipe.yaml and checkpoints/ is prose."""
a = run / "recipe.yaml"
b = f"no {x} in checkpoints/best.params"
c = run / ("feature_cache" if one else f"feature_cache-{rank}")
d = {"feature_cache": 1, "export": 2}
e = out / f"{name}-preprocess.json"
f = "last.json"
g = run / "export"
'''
    assert sorted(spellings(src, RunFolder.FILE_NAMES, RunFolder.DIR_NAMES)) == sorted([
        "recipe.yaml", "best.params", "checkpoints", "feature_cache", "feature_cache", "last.json", "export"])
