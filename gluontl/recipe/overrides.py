"""``--set section.key=value`` overrides: where each writes in a recipe's data, and which one a
validation problem is blamed on. Values are YAML, read by the recipe's own YAML loader."""
from __future__ import annotations

import re
from typing import Any, Mapping

import yaml

from ..errors import RecipeError
from ..readers import SafeYamlLoader, parse_yaml
from .presets import plain_loc


class RecipeLoader(SafeYamlLoader):
    """Recipe files' and --set values' YAML: the reading policy's loader (no aliases, tags or deep
    nesting) with YAML 1.2 booleans."""


# YAML 1.2 booleans: only true/false. YAML 1.1 also reads on/off/yes/no as booleans, which turned
# `cache_features: off` and `guards: off` into False; pydantic still reads those words as booleans
# where a field is one (`flip: yes`).
_BOOL = "tag:yaml.org,2002:bool"
RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
RecipeLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def culprit(written: list[tuple[tuple, str]], err: Mapping[str, Any]) -> str | None:
    """The last ``--set`` that wrote at, above or below the key path of a problem (or of one of
    the ``keys`` a recipe-wide problem names)."""
    locs = err.get("ctx", {}).get("keys") or [plain_loc(err["loc"])]
    return next((ov for path, ov in reversed(written) for loc in locs
                 if loc[:len(path)] == path or path[:len(loc)] == loc), None)


def apply_override(data: dict[str, Any], spec: str) -> tuple[str | int, ...]:
    """``train.epochs=3`` or ``rules.2.lr_mult=0.1`` (list items from 1; one past the end
    appends) from the CLI; the value is parsed as YAML. Returns the key path it wrote."""
    key, eq, raw = spec.partition("=")
    parts = key.split(".")
    if not eq or not all(parts):
        raise RecipeError(f"--set '{spec}' must look like section.key=value, e.g. --set train.epochs=3 or "
                          f"--set rules.1.lr_mult=0.1.")
    try:
        value = parse_yaml(raw, RecipeLoader)
        if value is None and parts[-1] == "grad_req":  # YAML reads a bare null as "no value"
            value = "null"
    except yaml.YAMLError as e:
        raise RecipeError(f"--set '{spec}': the value is not valid YAML "
                          f"({' '.join(str(e).split())}); write it as YAML, e.g. --set train.lr=0.01 or "
                          f"--set 'train.schedule={{kind: cosine}}'.") from None
    node: Any = data
    path: list[str | int] = []
    for depth, p in enumerate(parts):
        where = ".".join(parts[:depth])
        if isinstance(node, list):
            if not (p.isdigit() and 1 <= int(p) <= len(node) + 1):
                items = f"{where}.1 to {where}.{len(node)}, or " if node else ""
                raise RecipeError(f"--set '{spec}': '{where}' is a list of {len(node)} item(s), numbered from 1 "
                                  f"as in `gluontl plan`; use {items}{where}.{len(node) + 1} to add one, or set "
                                  f"the whole list: --set '{where}=[...]'.")
            k: str | int = int(p) - 1
            if k == len(node):
                node.append({})
        else:
            k = p
        path.append(k)
        if depth == len(parts) - 1:
            node[k] = value
            break
        nxt = node[k] if isinstance(node, list) else node.get(k)
        if nxt is None:
            nxt = [] if parts[depth + 1].isdigit() else {}
        if not isinstance(nxt, (dict, list)):
            raise RecipeError(f"--set '{spec}': '{where + '.' if where else ''}{p}' holds {nxt!r}, not a section "
                              f"or a list.")
        node[k] = nxt = type(nxt)(nxt)  # copies: the caller's data stays as it was
        node = nxt
    return tuple(path)
