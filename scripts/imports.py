"""The import-structure counts of issue 20, from the AST walk and layer table of tests/test_layers.py.

    python scripts/imports.py                  # this checkout
    python scripts/imports.py --root /work/main  # another checkout (before/after)

Printed: import circles (strongly connected sets of modules, lazy imports included) and their sizes;
private names taken across packages; upward imports per (lower layer → higher layer) pair; and two
walks that follow a recipe through an entry function.

A walk is defined on the static reference graph: its nodes are the top-level functions and classes of
``gluontl/`` (a class is one node, its methods included), and a node points at every function or class
its body names that resolves statically — a module-level def, a name bound by an import at the top or
inside the function (re-exports followed), ``module.name`` on an imported module; type annotations
are not references.  Dynamic dispatch
(the task registry, callbacks held in data) is not followed.  From the entry, the reachable subgraph
is taken, and over its distinct edges between two *rooms* (packages: a directory, or a top-level
module on its own):

- rooms entered: the rooms the walk reaches;
- climbs back up: edges into a room of a higher layer than the caller's (LAYERS of the test);
- revisits: edges on a circle of rooms — the callee's room leads back to the caller's room
  within the walk, so following it comes back into a room already visited.
"""
from __future__ import annotations

import argparse
import ast
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package beside scripts/
from tests import test_layers as T  # noqa: E402

ENTRIES = {"finetune": "gluontl.train.loop.finetune", "detection's prepare": "gluontl.tasks.detection.prepare"}


def defs(module: str) -> set[str]:
    return {n.name for n in T.tree(module).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def scope_bindings(module: str, node: ast.AST) -> dict[str, tuple[str, str | None]]:
    """local name → (module, attribute or None), for the imports anywhere inside ``node``."""
    return {local: (target, attr) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))
            for local, target, attr in T.bindings(module, n)}


def resolve(module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
    """The node ``module.name`` is, following re-exports (``from .exporters import export_block``)."""
    if name in defs(module):
        return module, name
    bound = scope_bindings(module, ast.Module(body=[n for n in T.tree(module).body
                                                    if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[]))
    if depth < 5 and name in bound and bound[name][1]:
        return resolve(bound[name][0], bound[name][1], depth + 1)
    return None


def annotations(node: ast.AST) -> list[ast.expr]:
    """Type annotations: names a signature mentions, which the run never follows."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            out += [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                    if x is not None and x.annotation is not None] + ([n.returns] if n.returns else [])
        elif isinstance(n, ast.AnnAssign):
            out.append(n.annotation)
    return out


def references(module: str, name: str) -> set[tuple[str, str]]:
    node = next(n for n in T.tree(module).body if getattr(n, "name", None) == name)
    bound = {**scope_bindings(module, T.tree(module)), **scope_bindings(module, node)}
    out, typing = set(), {id(t) for a in annotations(node) for t in ast.walk(a)}
    for n in ast.walk(node):
        if id(n) in typing:
            continue
        hit = None
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id in bound and bound[n.id][1]:
                hit = resolve(*bound[n.id])
            elif n.id in defs(module) and n.id != name:
                hit = module, n.id
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in bound \
                and bound[n.value.id][1] is None:
            hit = resolve(bound[n.value.id][0], n.attr)
        if hit and hit != (module, name):
            out.add(hit)
    return out


def walk(entry: str) -> dict[str, object]:
    module, name = entry.rsplit(".", 1)
    seen, todo, edges = {(module, name)}, [(module, name)], set()
    while todo:
        caller = todo.pop()
        for callee in references(*caller):
            edges.add((caller, callee))
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    room = lambda node: T.package_of(node[0])  # noqa: E731
    crossing = {(room(a), room(b), a, b) for a, b in edges if room(a) != room(b)}
    reach = collections.defaultdict(set)  # room → rooms reachable from it in the walk
    for p, q, _, _ in crossing:
        reach[p].add(q)
    changed = True
    while changed:
        changed = False
        for p in list(reach):
            more = set().union(*(reach[q] for q in reach[p] if q in reach)) - reach[p]
            if more:
                reach[p] |= more
                changed = True
    name = lambda node: ".".join(node).removeprefix("gluontl.")  # noqa: E731
    return {"rooms entered": len({room(n) for n in seen}), "functions reached": len(seen),
            "climbs back up": sorted(f"{name(a)} → {name(b)}" for _, _, a, b in crossing
                                     if T.layer(b[0]) > T.layer(a[0])),
            "revisits": sorted(f"{name(a)} → {name(b)}" for p, q, a, b in crossing if p in reach[q])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, help="checkout to measure (default: this one)")
    ap.add_argument("-v", "--verbose", action="store_true", help="list each climb and revisit of the walks")
    args = ap.parse_args()
    if args.root:
        T.PACKAGE = args.root.resolve() / "gluontl"
    cycles = sorted(T.cycles(), key=len, reverse=True)
    print(f"import circles: {len(cycles)}, sizes {[len(c) for c in cycles]}")
    for c in cycles:
        print(f"  {len(c)}: {', '.join(sorted(m.removeprefix('gluontl.') for m in c))}")
    private = sorted(T.private_imports())
    print(f"private names taken across packages: {len(private)}")
    for p in private:
        print(f"  {p}")
    pairs = collections.Counter()
    for m, targets in T.edges().items():
        pairs.update((T.layer(m), T.layer(t)) for t in targets if T.layer(t) > T.layer(m))
    print(f"upward imports (module → module): {sum(pairs.values())}")
    for (lo, hi), n in sorted(pairs.items()):
        print(f"  {T.LAYERS[lo]} → {T.LAYERS[hi]}: {n}")
    for label, entry in ENTRIES.items():
        w = walk(entry)
        print(f"following a recipe through {label} ({entry}): climbs back up {len(w['climbs back up'])} times, "
              f"revisits rooms {len(w['revisits'])} times ({w['rooms entered']} rooms, "
              f"{w['functions reached']} functions reached)")
        for kind in ("climbs back up", "revisits") if args.verbose else ():
            print(f"  {kind}:", *w[kind], sep="\n    ")


if __name__ == "__main__":
    main()
