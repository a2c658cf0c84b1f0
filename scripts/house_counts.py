"""The four counts issue 32's closing note asks for, measured on any checkout:

    python scripts/house_counts.py                    # this checkout
    python scripts/house_counts.py --root /work/main  # another (before/after); -v lists what is counted

1. run-folder names spelled outside their owner: the walk of ``tests/test_runfolder_names.py`` (this
   checkout's, with this checkout's ``RunFolder`` names) over ROOT's ``gluontl/``, less ROOT's
   ``gluontl/runfolder.py``; one per occurrence.
2. modules touching MXNet privates: modules of ``gluontl/`` naming an attribute ``_cached_graph``,
   ``_children``, ``_params``, ``_kwargs`` or ``_reg_params``, or parsing ``tojson()`` (a module that
   calls ``.tojson()`` and ``json.loads``), outside the door ``gluontl/mxinternals/`` (whose job they
   are); with the uses of each name.
3. lines in recipe: ``gluontl/recipe.py``, or every file of the package ``gluontl/recipe/``.
4. test files outside a package mirroring the code: ``tests/**/test_*.py`` but for those in a test
   package (``__init__.py`` on the way) whose path is a package of ``gluontl/`` (``tests/data/`` for
   ``gluontl/data/``), and ``tests/test_NAME*.py`` where NAME starts with a top-level module's name
   (``test_rules_kinds.py`` tests ``gluontl/rules.py``; each top-level module is a package of its own,
   as in ``tests/test_layers.py``). Tests of the whole house (``test_docs.py``) count as outside."""
from __future__ import annotations

import argparse
import ast
import collections
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))  # the tests package beside scripts/, and this checkout's gluontl
from tests.test_runfolder_names import violations  # noqa: E402

PRIVATES = ("_cached_graph", "_children", "_params", "_kwargs", "_reg_params")


def run_folder_spellings(root: Path) -> list[tuple[str, str]]:
    return violations(root / "gluontl")


def mxnet_privates(root: Path) -> dict[str, collections.Counter]:
    """module → uses per private name (``tojson()`` parsing counted as ``tojson``)."""
    out = {}
    door = root / "gluontl" / "mxinternals"
    for p in sorted((root / "gluontl").rglob("*.py")):
        if door in p.parents:
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        uses = collections.Counter(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in PRIVATES)
        calls = [n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if "tojson" in calls and "loads" in calls:
            uses["tojson"] = calls.count("tojson")
        if uses:
            out[str(p.relative_to(root))] = uses
    return out


def recipe_lines(root: Path) -> int:
    files = [root / "gluontl" / "recipe.py"] if (root / "gluontl" / "recipe.py").is_file() else \
        sorted((root / "gluontl" / "recipe").rglob("*.py"))
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def _names(package: Path) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.stem != "__init__"} | \
        {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def unmirrored_tests(root: Path) -> list[str]:
    tests, code = root / "tests", root / "gluontl"
    out = []
    for f in sorted(tests.rglob("test_*.py")):
        rel = f.parent.relative_to(tests)
        package = code.joinpath(*rel.parts)
        packaged = all((tests.joinpath(*rel.parts[:i + 1]) / "__init__.py").is_file() for i in range(len(rel.parts)))
        name = f.stem[len("test_"):]
        mirrored = package.is_dir() and packaged and (bool(rel.parts) or any(
            name == m or name.startswith(m + "_") for m in _names(package)))
        if not mirrored:
            out.append(str(f.relative_to(root)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=HERE, help="the checkout to measure")
    ap.add_argument("-v", "--verbose", action="store_true", help="list what is counted")
    args = ap.parse_args()
    root = args.root.resolve()
    spelled = run_folder_spellings(root)
    privates = mxnet_privates(root)
    tests = unmirrored_tests(root)
    print(f"checkout: {root}")
    print(f"1. run-folder names spelled outside RunFolder: {len(spelled)} "
          f"(in {len({m for m, _ in spelled})} modules)")
    if args.verbose:
        for (m, n), c in sorted(collections.Counter(spelled).items()):
            print(f"     {m}: {n} x{c}")
    total = collections.Counter()
    for uses in privates.values():
        total.update(uses)
    print(f"2. modules touching MXNet privates outside gluontl/mxinternals/: {len(privates)} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(total.items()))} uses)")
    if args.verbose:
        for m, uses in privates.items():
            print(f"     {m}: {dict(sorted(uses.items()))}")
    print(f"3. lines in recipe: {recipe_lines(root)}")
    print(f"4. test files outside a package mirroring the code: {len(tests)}")
    if args.verbose:
        for t in tests:
            print(f"     {t}")


if __name__ == "__main__":
    main()
