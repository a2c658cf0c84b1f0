"""A recipe from YAML, a dict or the API's arguments: validated, with every problem said once as
one paragraph naming the file (or ``--set``), each bad key path and what to do."""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar, get_args

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import GluontlError, RecipeError, RuleError
from ..readers import parse_yaml
from ..runfolder import RunFolder
from .overrides import RecipeLoader, apply_override, culprit
from .common import suggest
from .presets import TAGS, AnyRule, Rule, RuleItem, plain_loc
from .schema import Recipe

SpecT = TypeVar("SpecT", bound=BaseModel)

MAX_RECIPE_BYTES = 1 << 20


def _key_path(loc: tuple) -> str:
    """A key path as users write it: list items numbered from 1, as the plan numbers rules."""
    return ".".join(str(p + 1) if isinstance(p, int) else str(p) for p in plain_loc(loc)) or "(top level)"


def _section(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section model a key path leads to, for listing its valid keys."""
    cls: type[BaseModel] | None = root
    for i, p in enumerate(loc):
        if isinstance(p, str) and p in TAGS and (i == 0 or isinstance(loc[i - 1], int)):
            cls = TAGS[p]  # a rule union's member
        elif isinstance(p, str) and cls is not None:
            field = cls.model_fields.get(p)
            cls = _model_in(field.annotation) if field is not None else None
    return cls


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)


def _describe(err: Mapping[str, Any], root: type[BaseModel] | None = Recipe) -> str:
    loc = _key_path(err["loc"])
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        section = _section(root, err["loc"][:-1])
        return f"unknown key '{loc}'" + (suggest(err["loc"][-1], section.model_fields) if section else "")
    if kind == "missing":
        return f"missing required key '{loc}'"
    if kind in ("transform_size", "input_shape_hwc"):  # names its keys itself
        return msg
    msg = msg.removeprefix("Value error, ")
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        close = difflib.get_close_matches(str(err.get("input")), expected, n=1, cutoff=0.6)
        msg += f" (did you mean {close[0]!r}?)" if close else ""
    whole = not plain_loc(err["loc"]) or isinstance(err.get("input"), Mapping)  # a section's own rule: the section is no help
    return f"'{loc}': {msg}" if whole or "input" not in err or kind == "model_type" else \
        f"'{loc}': {msg} (got {err.get('input')!r})"


def as_spec(value: Any, cls: type[SpecT], what: str, error: type[GluontlError], example: str,
            hint: str = "") -> SpecT:
    """``value`` as the spec ``cls`` where the API takes one: the object itself, or a dict with
    the recipe section's keys, validated like a recipe (a wrong key is named, never an
    AttributeError deep inside)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise error(f"{what} is a {type(value).__name__}; give it as a dict with the recipe's keys (e.g. "
                    f"{example}) or as a gluontl.recipe.{cls.__name__}.")
    try:
        return cls.model_validate(dict(value))
    except ValidationError as e:
        problems = "; ".join(_describe(err, cls) for err in e.errors())
        raise error(f"{what} is invalid: {problems}. {hint or f'It takes the keys of {cls.__name__} (see docs/recipes.md).'}"
                    ) from None


_RULE = TypeAdapter(RuleItem)


def as_rules(rules: Iterable[AnyRule | Mapping[str, Any]]) -> list[AnyRule]:
    """Rules as the API takes them: ``Rule`` and preset objects, or dicts with a recipe rule's keys."""
    out = []
    for i, r in enumerate(rules, 1):
        if isinstance(r, (Rule, *TAGS.values())):
            out.append(r)
            continue
        if not isinstance(r, Mapping):
            raise RuleError(f"rule {i} is a {type(r).__name__}; give it as a dict with the recipe's keys (e.g. "
                            f"{{'match': 'features.*', 'grad_req': 'null'}}) or as a gluontl.recipe.Rule.")
        try:
            out.append(_RULE.validate_python(dict(r)))
        except ValidationError as e:
            problems = "; ".join(_describe(err, None) for err in e.errors())
            raise RuleError(f"rule {i} is invalid: {problems}. Rules take the keys of a recipe's rules (see "
                            f"docs/recipes.md, Rules and their precedence).") from None
    return out


def as_recipe(recipe: Any) -> "Recipe":
    """A recipe as the API takes it: a ``Recipe``, a dict with a recipe file's keys, or a YAML path."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, Mapping):
        return parse_recipe(dict(recipe), origin="the recipe dict")
    if isinstance(recipe, (str, os.PathLike)):
        return load_recipe(recipe)
    raise RecipeError(f"recipe is a {type(recipe).__name__}; pass a gluontl.recipe.Recipe, a dict with a recipe "
                      f"file's keys (name, model, data, ...) or the path of a recipe YAML file.")


def parse_recipe(data: Any, origin: str = "<recipe>",
                 overrides: list[str] | None = None) -> Recipe:
    """A validated Recipe from YAML data and ``--set`` overrides.

    A problem under a key that a ``--set`` wrote is blamed on that ``--set``, so users do not
    search the recipe file for a value it does not contain.
    """
    if not isinstance(data, dict):
        raise RecipeError(f"{origin}: a recipe must be a YAML mapping with keys name, model, "
                          f"surgery, rules, data, train, export; got {type(data).__name__}.")
    data = dict(data)
    written = [(apply_override(data, ov), ov) for ov in overrides or []]
    try:
        return Recipe(**data)
    except ValidationError as e:
        found = [(_describe(err), culprit(written, err)) for err in e.errors()]
        if all(ov for _, ov in found):
            problems = "; ".join(f"--set {ov!r}: {d}" for d, ov in found)
            raise RecipeError(f"Invalid --set value: {problems}. Fix the value given with --set (list items, "
                              f"rules included, are numbered from 1 as in `gluontl plan`).") from None
        problems = "; ".join(d + (f" (from --set {ov!r})" if ov else "") for d, ov in found)
        raise RecipeError(f"{origin}: invalid recipe: {problems}. Fix these keys (see recipes/ for "
                          f"working examples and docs/recipes.md).") from None
    except TypeError as e:  # non-string keys at the top level
        raise RecipeError(f"{origin}: invalid recipe: {e}.") from None


def resolve_backend(recipe: Recipe) -> Recipe:
    """``recipe`` with ``train.distributed.backend`` decided where it was left unset: kvstore in a
    parameter-server job's worker (``DMLC_ROLE=worker``: gluontl launch, or a cluster's own
    launcher), so the documented recipes run under ``gluontl launch`` as written; none elsewhere.
    A distributed recipe is checked again as a whole: it refuses some settings (``from_epoch``)."""
    spec = recipe.train.distributed
    if spec.backend is not None:
        return recipe
    if os.environ.get("DMLC_ROLE") != "worker":
        train = recipe.train.model_copy(update={"distributed": spec.model_copy(update={"backend": "none"})})
        return recipe.model_copy(update={"train": train})
    data = recipe.as_written()  # transforms as written: defaults are derived again, and marked so
    data["train"]["distributed"]["backend"] = "kvstore"
    return parse_recipe(data, origin=f"recipe '{recipe.name}' (train.distributed.backend unset: kvstore in a "
                                     f"launched worker)")


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    p = Path(path)
    if p.is_dir():
        raise RecipeError(f"Recipe '{p}' is a directory; pass a YAML file, e.g. --recipe recipes/resnet18_freeze.yaml.")
    if not p.is_file():
        raise RecipeError(f"Recipe file '{p}' does not exist. Pass an existing YAML file, e.g. "
                          f"--recipe recipes/resnet18_freeze.yaml.")
    if p.stat().st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"Recipe file '{p}' is {p.stat().st_size} bytes; recipes are small YAML files (< 1 MiB).")
    try:
        data = parse_yaml(p.read_text(encoding="utf-8"), RecipeLoader)
    except UnicodeDecodeError:
        raise RecipeError(f"Recipe file '{p}' is not UTF-8 text; a recipe is a YAML text file "
                          f"(see recipes/).") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"Recipe file '{p}' is not valid YAML: {' '.join(str(e).split())}.") from None
    rules = data.get("rules") if isinstance(data, dict) else None
    if isinstance(rules, list):
        if RunFolder.of_recipe(p) is not None:
            # Run folders written before runs dropped unset fields hold `grad_req: null` for "not set".
            data["rules"] = [{k: v for k, v in r.items() if v is not None} if isinstance(r, dict) else r
                             for r in rules]
        else:
            _refuse_bare_null(rules, p)
    return parse_recipe(data, origin=str(p), overrides=overrides)


def _refuse_bare_null(rules: list[Any], path: Path) -> None:
    """YAML reads ``grad_req: null`` as no value, which beside another setting would silently
    leave grad_req unset; in a recipe file it can only mean the mode ``"null"`` misspelt."""
    for i, r in enumerate(rules, 1):
        if isinstance(r, dict) and "grad_req" in r and r["grad_req"] is None:
            raise RecipeError(f"{path}: rules.{i}.grad_req is empty: YAML reads a bare null as no value, not as "
                              f"the mode 'null'. Write grad_req: \"null\" (quoted) to freeze, or leave "
                              f"grad_req out.")
