"""The house's import structure, held by a ratchet (issue 20): no import circle between gluontl modules,
no ``_private`` name taken from another package, no import from a higher layer than LAYERS allows.
Lazy imports inside functions (and ``TYPE_CHECKING`` ones) count like top-level ones.  Today's violations are listed in the KNOWN
sets: a new violation fails, and so does a KNOWN entry that no longer occurs, so the lists only shrink.

A package is a directory (``gluontl/data/``, ``gluontl/detect/``, ...); each top-level module
``gluontl/*.py`` is a package of its own.  ``scripts/imports.py`` prints the counts from this walk."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gluontl"

# Each module by what it is, not by what it imports today; a module looks only at its own layer or below.
LAYERS = ("base", "model I/O", "model ops", "data", "tasks", "engine", "sweep", "front doors")
PLACES = {  # dotted prefix → layer; the longest matching prefix wins
    "gluontl.errors": 0, "gluontl.naming": 0, "gluontl.atomic": 0, "gluontl.threads": 0,
    "gluontl.npcompat": 0, "gluontl.deploy_preprocess": 0,
    "gluontl.mxinternals": 0,  # the one door to MXNet's internals: symbol JSON, Gluon privates, per-block state
    "gluontl.home": 0, "gluontl.runfolder": 0,  # $GLUONTL_HOME; a run folder's checkpoints as read back
    "gluontl.readers": 0,  # the reading policy: safe bounded YAML, JSON, JSON lines; non-UTF-8 names
    "gluontl.zoo": 0,  # the zoo's names and input sizes: a catalogue the recipe schema reads
    "gluontl.task_registry": 0,  # each task declared once: code path, section, metrics, sources, curves
    "gluontl.metrics": 0,  # the metric registry: key, label, direction, format, task
    "gluontl.export_formats": 0,  # the export formats' names and modules: a catalogue the recipe schema reads
    "gluontl.console": 0,  # what a process shows: lines, bars, worker logs (data loading shows progress too)
    "gluontl.onnx": 1, "gluontl.sources": 1, "gluontl.convert": 1,
    "gluontl.recipe": 1,  # the schema of what a user asks for (a package: sections, presets, policy, compat,
    # --set, load); recipe.sources reads an ONNX file's declared input size
    "gluontl.stages": 2, "gluontl.surgery": 2, "gluontl.adapters": 2, "gluontl.rules": 2,
    "gluontl.pipeline": 2,  # recipe → ready model: source, restore, surgery, rules
    # image decoding, transforms, splits, bad images, demo data, epoch order and the run card: what every task feeds on;
    # and what every task builds on: a run's checkpoints read back, the frozen-prefix feed, the guards
    "gluontl.data": 3,
    "gluontl.export": 3,  # writing a model out as verified files
    "gluontl.tasks": 4, "gluontl.detect": 4, "gluontl.segment": 4,
    "gluontl.train": 5, "gluontl.dist": 5,
    "gluontl.sweep": 6,  # Optuna studies whose trials are runs of the train loop (above it)
    "gluontl": 7, "gluontl.cli": 7, "gluontl.api": 7, "gluontl.__main__": 7,
}

# Today's violations (issue 20 removes them); entries leave, none arrive.
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_PRIVATE: set[str] = set()
KNOWN_UPWARD: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def tree(module: str) -> ast.Module:
    return ast.parse(modules()[module].read_text())


def package_of(module: str) -> str:
    """The directory a module lives in; a top-level ``gluontl/*.py`` module is its own package."""
    if modules()[module].name == "__init__.py" or module.count(".") == 1:
        return module
    return module.rsplit(".", 1)[0]


def layer(module: str) -> int:
    return PLACES[max((p for p in PLACES if module == p or module.startswith(p + ".")), key=len)]


def bindings(module: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, str, str | None]]:
    """``(local name, gluontl module, attribute or None)`` for each name an import statement binds."""
    if isinstance(node, ast.Import):
        return [(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0], None)
                for a in node.names if a.name.split(".")[0] == "gluontl"]
    if node.level:
        here = module if modules()[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        base = ".".join(here.split(".")[: here.count(".") + 2 - node.level] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != "gluontl":
        return []
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append((a.asname or a.name, sub, None) if sub in modules() else (a.asname or a.name, base, a.name))
    return out


@functools.cache
def imports(module: str) -> tuple[tuple[str, str | None, int], ...]:
    """Every ``(gluontl module, attribute or None, line)`` ``module`` takes, at any depth of its code;
    ``stages._units`` on a name bound to an imported module counts as taking ``_units``."""
    out, as_module = [], {}
    for n in ast.walk(tree(module)):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            if isinstance(n, ast.Import):
                out += [(a.name, None, n.lineno) for a in n.names if a.name.split(".")[0] == "gluontl"]
            for local, target, attr in bindings(module, n):
                out.append((target, attr, n.lineno))
                if attr is None:
                    as_module[local] = target
    for n in ast.walk(tree(module)):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in as_module:
            target = as_module[n.value.id]
            out.append((f"{target}.{n.attr}", None, n.lineno) if f"{target}.{n.attr}" in modules()
                       else (target, n.attr, n.lineno))
    return tuple(out)


def edges() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in imports(m) if t != m and t in modules()} for m in modules()}


def cycles() -> list[frozenset[str]]:
    """Strongly connected components of the module graph with more than one module (Tarjan)."""
    graph, index, low, stack, on, out = edges(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while not scc or w != v:
                w = stack.pop()
                on.discard(w)
                scc.add(w)
            if len(scc) > 1:
                out.append(frozenset(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports() -> set[str]:
    """``module takes target._name`` for a private name (or module) from another package."""
    found = set()
    for m in modules():
        for target, attr, _ in imports(m):
            names = target.split(".")[1:] + ([attr] if attr else [])
            if any(x.startswith("_") and not x.startswith("__") for x in names) \
                    and package_of(target) != package_of(m):
                found.add(f"{m} takes {target}{'.' + attr if attr else ''}")
    return found


def upward_imports() -> set[str]:
    """``module (layer) imports target (layer)`` for each target in a higher layer."""
    return {f"{m} ({LAYERS[layer(m)]}) imports {t} ({LAYERS[layer(t)]})"
            for m, targets in edges().items() for t in targets if layer(t) > layer(m)}


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if m != "gluontl" and layer(m) == PLACES["gluontl"]
                and not any(m == p or m.startswith(p + ".") for p in PLACES if p != "gluontl")]
    assert not unplaced, f"place these modules (or their package) in a layer of PLACES: {unplaced}"


def test_no_new_import_circle():
    """A circle may only shrink inside a known one; one that reaches a new module is new."""
    known = set().union(*KNOWN_CYCLES)
    new = [f"{len(c)} modules, not in a known circle before: {sorted(c - known)}; all: {sorted(c)}"
           for c in cycles() if not any(c <= k for k in KNOWN_CYCLES)]
    assert not new, f"import circles (each a strongly connected set of modules): {new}"


def test_no_new_private_import_across_packages():
    new = private_imports() - KNOWN_PRIVATE
    assert not new, sorted(new)


def test_no_new_upward_import():
    new = upward_imports() - KNOWN_UPWARD
    assert not new, sorted(new)


def test_known_violations_only_shrink():
    """A fixed violation leaves its KNOWN set in the same commit (a shrunk circle is written down
    smaller), so it cannot come back unnoticed."""
    gone = ([sorted(c) for c in KNOWN_CYCLES - set(cycles())] + sorted(KNOWN_PRIVATE - private_imports())
            + sorted(KNOWN_UPWARD - upward_imports()))
    assert not gone, f"no longer occur, remove from (or shrink in) KNOWN_*: {gone}"


# ============================================================================ the one door to MXNet (issue 32)

DOOR = "gluontl.mxinternals"
# Private names of MXNet, Gluon and GluonCV objects that gluontl reaches: only the door names them (any
# other foreign private name, ``_cached_op`` say, fails test_no_new_foreign_private_outside_the_door).
MX_PRIVATE = frozenset({
    "_cached_graph", "_clear_cached_op", "_call_cached_op", "_active",  # hybridize
    "_children", "_reg_params", "_params", "_kwargs", "_op_name", "_units", "_flatten", "_differentiable",
    "_trainer", "_collect_params_with_prefix", "_Conv", "_RNNLayer", "_dataset",  # blocks, parameters
    "_params_to_init", "_kv_initialized", "_init_kvstore", "_init_params", "_updaters", "_update_on_kvstore",
    "_kvstore", "_optimizer", "_all_index_update_counts", "_index_update_count", "_update_count", "_get_lr",
    "_get_wd",  # Trainer, Optimizer
    "_im_size", "_sizes", "_ratios", "_generate_anchors",  # GluonCV's SSD anchor generator
})
# Calls that read or write symbol JSON; ``Symbol.save`` and ``mx.sym.load`` (files) stay public.
SYMBOL_JSON = frozenset({"tojson", "load_json"})
# Underscore names that are public Python API.
PUBLIC_UNDERSCORE = frozenset({"_exit", "_replace", "_asdict", "_fields", "_make"})
# MXNet registers its scalar operators (``_plus_scalar``...) only under this namespace; they are ops,
# named so in symbol JSON too, not attributes of an object.
OPERATOR_NAMESPACES = frozenset({"mx.sym._internal", "mx.nd._internal"})

# Uses outside the door, ``module: name``; entries leave, none arrive (a stale one fails too).
KNOWN_MX_PRIVATE: set[str] = set()
# Other private names of foreign packages (not defined anywhere in gluontl outside the door), and why they stay.
KNOWN_FOREIGN_PRIVATE: set[str] = {
    # MXNet's recordio header format: npcompat's numpy-2 copy of recordio.pack needs it, and npcompat
    # runs before MXNet is imported (the door imports MXNet), so it cannot ask the door
    "gluontl.npcompat: _IR_FORMAT",
    "gluontl.onnx.importer: _get_all_tensors",  # the onnx package's, not MXNet's
    # Optuna 5's: a study's storage and id and a frozen trial's storage id have no public accessor,
    # and failing a dead process's trial goes through the storage's heartbeat hook (Optuna's own
    # fail_stale_trials does the same); pinned by optuna==5.0.0 and tests/sweep/test_storage.py
    "gluontl.sweep.storage: _storage",
    "gluontl.sweep.storage: _study_id",
    "gluontl.sweep.storage: _trial_id",
}


def outside_door() -> list[str]:
    return [m for m in modules() if m != DOOR and not m.startswith(DOOR + ".")]


def attributes(module: str) -> list[ast.Attribute]:
    return [n for n in ast.walk(tree(module)) if isinstance(n, ast.Attribute)]


def mx_private_uses() -> set[str]:
    """``module: name`` for each MXNet private name, symbol-JSON call or per-block state attribute
    (``gluontl_*``: the door's BlockState carries it) used outside the door."""
    return {f"{m}: {a.attr}" for m in outside_door() for a in attributes(m)
            if a.attr in MX_PRIVATE | SYMBOL_JSON or a.attr.startswith(("gluontl_", "_gluontl_"))}


@functools.cache
def gluontl_names() -> frozenset[str]:
    """Every name gluontl outside the door defines: functions, classes, methods, assigned names and attributes."""
    out = set()
    for m in outside_door():
        for n in ast.walk(tree(m)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    out |= {x.attr for x in ast.walk(t) if isinstance(x, ast.Attribute)}
                    out |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
            elif isinstance(n, ast.alias):
                out.add((n.asname or n.name).split(".")[0])
    return frozenset(out)


def foreign_private_uses() -> set[str]:
    """``module: name`` for each ``x._name`` outside the door where gluontl defines no ``_name``: another
    package's private, which an upgrade may change without notice."""
    found = set()
    for m in outside_door():
        ops = {t.id for n in ast.walk(tree(m)) if isinstance(n, ast.Assign) and ast.unparse(n.value) in OPERATOR_NAMESPACES
               for t in n.targets if isinstance(t, ast.Name)}
        for a in attributes(m):
            if not a.attr.startswith("_") or a.attr.startswith("__") or a.attr in PUBLIC_UNDERSCORE:
                continue
            if ast.unparse(a) in OPERATOR_NAMESPACES or ast.unparse(a.value) in OPERATOR_NAMESPACES | ops:
                continue
            if a.attr not in gluontl_names() and a.attr not in MX_PRIVATE:
                found.add(f"{m}: {a.attr}")
    return found


def test_mxnet_privates_only_through_the_door():
    """Gluon's private attributes, symbol JSON and per-block state are the door's (gluontl.mxinternals):
    call its named functions instead."""
    new = mx_private_uses() - KNOWN_MX_PRIVATE
    assert not new, sorted(new)


def test_no_new_foreign_private_outside_the_door():
    """A private name of MXNet (or another package) not in MX_PRIVATE yet: give the door a function for it,
    add the name to MX_PRIVATE."""
    new = foreign_private_uses() - KNOWN_FOREIGN_PRIVATE
    assert not new, sorted(new)


def test_door_allow_lists_only_shrink():
    gone = sorted(KNOWN_MX_PRIVATE - mx_private_uses()) + sorted(KNOWN_FOREIGN_PRIVATE - foreign_private_uses())
    assert not gone, f"no longer occur, remove from KNOWN_MX_PRIVATE / KNOWN_FOREIGN_PRIVATE: {gone}"


def test_the_door_names_what_it_guards():
    """Each MX_PRIVATE name is used in the door (a name nothing reaches any more leaves the list)."""
    inside = {a.attr for m in modules() if m == DOOR or m.startswith(DOOR + ".") for a in attributes(m)}
    assert MX_PRIVATE | SYMBOL_JSON <= inside, sorted((MX_PRIVATE | SYMBOL_JSON) - inside)
