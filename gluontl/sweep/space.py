"""A sweep's search space: dotted recipe keys (as ``--set`` writes them) mapped to distributions,
checked against the recipe schema before any trial runs, so a typo or a distribution the key's
type cannot take costs nothing.

    train.lr: {log_uniform: [1.0e-4, 1.0e-1]}
    train.wd: {uniform: [0, 1.0e-3]}
    train.cache_views: {int: [1, 4]}
    rules: {choice: [[{preset: freeze_all_but_head}], [{preset: freeze_until_stage, until_stage: 3}]]}
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import RecipeError, SweepError
from ..readers import read_yaml
from ..recipe import Recipe, parse_recipe

KINDS = ("log_uniform", "uniform", "int", "choice")
_PRIMITIVE = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Dim:
    """One key of the space: ``kind`` one of KINDS; ``args`` [low, high] or the choices."""

    key: str
    kind: str
    args: tuple

    def probes(self) -> list[Any]:
        """Values that show whether the key's type takes this distribution: the ends and a point
        inside (a float range on an integer key fails there)."""
        if self.kind == "choice":
            return list(self.args)
        low, high = self.args
        at = 0.381966  # an inner point no integer range lands on at once (a midpoint of [1, 5] is 3.0)
        inner = math.exp(math.log(low) + at * math.log(high / low)) if self.kind == "log_uniform" \
            else low + at * (high - low)
        return [low, high] if self.kind == "int" else [low, high, inner]

    def choices(self) -> list[Any]:
        """The choices as Optuna stores them: primitives as they are, lists and mappings as JSON text."""
        return [c if isinstance(c, _PRIMITIVE) else json.dumps(c, sort_keys=True) for c in self.args]

    def suggest(self, trial) -> Any:
        if self.kind == "log_uniform":
            return trial.suggest_float(self.key, *self.args, log=True)
        if self.kind == "uniform":
            return trial.suggest_float(self.key, *self.args)
        if self.kind == "int":
            return trial.suggest_int(self.key, *self.args)
        picked = trial.suggest_categorical(self.key, self.choices())
        return self.args[self.choices().index(picked)]


def parse_space(data: Any, origin: str) -> list[Dim]:
    """The dimensions of a space file's mapping; a malformed entry is one paragraph naming it."""
    example = "e.g. train.lr: {log_uniform: [1.0e-4, 1.0e-1]}"
    if not isinstance(data, Mapping) or not data:
        raise SweepError(f"{origin}: a sweep space is a mapping of dotted recipe keys to distributions, {example}; "
                         f"got {type(data).__name__ if data else 'nothing'}.")
    dims = []
    for key, dist in data.items():
        if not isinstance(key, str) or not key or not all(key.split(".")):
            raise SweepError(f"{origin}: space key {key!r} is not a dotted recipe key such as train.lr.")
        if not isinstance(dist, Mapping) or len(dist) != 1 or next(iter(dist)) not in KINDS:
            raise SweepError(f"{origin}: space key '{key}' must map to one distribution, one of "
                             f"{', '.join(KINDS)} ({example}); got {dist!r}.")
        kind, args = next(iter(dist.items()))
        if kind == "choice":
            if not isinstance(args, list) or not args:
                raise SweepError(f"{origin}: space key '{key}': choice takes a non-empty list of values, "
                                 f"e.g. {{choice: [sgd, adam]}}; got {args!r}.")
        else:
            number = int if kind == "int" else (int, float)
            if not (isinstance(args, list) and len(args) == 2 and all(
                    isinstance(a, number) and not isinstance(a, bool) for a in args) and args[0] < args[1]):
                raise SweepError(f"{origin}: space key '{key}': {kind} takes [low, high] with low < high"
                                 f"{' (integers)' if kind == 'int' else ''}; got {args!r}.")
            if kind == "log_uniform" and args[0] <= 0:
                raise SweepError(f"{origin}: space key '{key}': log_uniform needs low > 0; got {args!r}.")
        dims.append(Dim(key, kind, tuple(args)))
    return dims


def load_space(path: str | Path) -> list[Dim]:
    return parse_space(read_yaml(path, SweepError, "the sweep space"), str(path))


def with_params(recipe: Recipe, values: Mapping[str, Any], origin: str = "the sweep") -> Recipe:
    """``recipe`` with each dotted key set to its value, validated by the recipe schema."""
    overrides = [f"{key}={json.dumps(value)}" for key, value in values.items()]
    return parse_recipe(recipe.as_written(), origin=origin, overrides=overrides)


def check_space(recipe: Recipe, dims: list[Dim], origin: str) -> None:
    """Every value each distribution can give must make a valid recipe (probed at the ends and
    inside): else one paragraph naming the key, before any trial."""
    for dim in dims:
        for value in dim.probes():
            try:
                with_params(recipe, {dim.key: value})
            except RecipeError as e:
                why = str(e).removeprefix("Invalid --set value: ").split(". Fix the value given with --set")[0]
                raise SweepError(f"{origin}: space key '{dim.key}' ({dim.kind} {list(dim.args)}) cannot be used: "
                                 f"the value {value!r} makes recipe '{recipe.name}' invalid ({why.rstrip('.')}). "
                                 f"Use a key the recipe schema knows (docs/recipes.md) and a distribution its "
                                 f"type takes: log_uniform/uniform for numbers, int for integers, choice for "
                                 f"anything.") from None


def _written(recipe: Recipe, key: str) -> Any:
    node: Any = recipe.model_dump(mode="json")
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit() and 1 <= int(part) <= len(node):
            node = node[int(part) - 1]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def baseline(recipe: Recipe, dims: list[Dim]) -> dict[str, Any] | None:
    """The recipe's own values as Optuna parameters (a sweep's first trial, so its best is never
    worse than the recipe as written), or None when one lies outside the space."""
    out: dict[str, Any] = {}
    for dim in dims:
        if dim.kind == "choice":  # a choice is the recipe's when setting it changes nothing
            same = [i for i, c in enumerate(dim.args) if with_params(recipe, {dim.key: c}).digest() == recipe.digest()]
            if not same:
                return None
            out[dim.key] = dim.choices()[same[0]]
            continue
        value = _written(recipe, dim.key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not dim.args[0] <= value <= dim.args[1]:
            return None
        if dim.kind == "int" and value != int(value):
            return None
        out[dim.key] = int(value) if dim.kind == "int" else float(value)
    return out
