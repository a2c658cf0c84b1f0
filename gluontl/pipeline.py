"""Recipe → ready model: source, restore, surgery, rules. The CLI and API share this path."""
from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Mapping

import mxnet as mx
from mxnet.gluon import HybridBlock

from .naming import named_params
from .recipe import Recipe, as_recipe
from .rules import Plan, apply_plan, attach_adapters, make_plan
from .sources import RestoreReport, model_input_name, build_model, restore
from .surgery import apply_surgery, needs_surgery


@dataclasses.dataclass
class Prepared:
    block: HybridBlock
    restore: RestoreReport | None
    plan: Plan
    loaded: set[str] | None = None  # names with values from a file, where the source alone does not say


def prepare(recipe: Recipe | Mapping[str, Any] | str | os.PathLike, *, ctx=None, apply: bool = True) -> Prepared:
    """Build the recipe's model, restore its weights, attach the head and plan (and apply) rules;
    ``recipe`` as ``gluontl.finetune`` takes it.

    Every rule is checked for matches up front, including ``from_epoch`` rules that only
    take effect later, so a typo fails before training starts, not hours in.
    """
    recipe = as_recipe(recipe)
    ctx = ctx or mx.cpu()
    head = recipe.surgery.head
    if needs_surgery(recipe.surgery, recipe.model.source):
        block, report = _with_surgery(recipe, ctx)
    else:
        block, report = build_model(recipe.model, classes=head.classes if head else None,
                                    head_init=head.init if head else "xavier", ctx=ctx)
    block, plan = planned(block, recipe, apply)
    return Prepared(block, report, plan)


def planned(block: HybridBlock, recipe: Recipe, apply: bool = True) -> tuple[HybridBlock, Plan]:
    """A task's built model with the recipe's adapters attached and its rules planned (and
    applied): every rule is checked for matches, ``from_epoch`` ones too."""
    shape = (1, *recipe.model.input_shape)  # batch-first: a recipe's 4-dim (C,D,H,W) shape is no N,C,H,W
    block = attach_adapters(block, recipe.rules, input_shape=shape)
    make_plan(block, recipe.rules, epoch=None, input_shape=shape)
    plan = make_plan(block, recipe.rules, epoch=0, input_shape=shape)
    if apply:
        apply_plan(block, plan)
    return block, plan


def with_input_name(recipe: Recipe) -> Recipe:
    """``model.input_name`` made the model's own first input where the recipe left it out: a run
    folder's recipe.yaml writes every field, and reloaded it must not name a default ``data``
    that an ONNX or symbol model does not have."""
    name = model_input_name(recipe.model)
    if name == recipe.model.input_name:
        return recipe
    return recipe.model_copy(update={"model": recipe.model.model_copy(update={"input_name": name})})


def _with_surgery(recipe: Recipe, ctx) -> tuple[HybridBlock, RestoreReport | None]:
    """Surgery first, then ``weights`` restored under the kept names.

    Restoring after the cut lets a file for the whole original model (its old classifier
    included) and a fine-tuned file (with ``head.*``) both load: what surgery dropped may be
    in the file and the new head may be missing from it without being declared.
    """
    spec = recipe.model
    original, _ = build_model(spec.model_copy(update={"weights": None}), ctx=ctx)
    before = set(named_params(original))
    block = apply_surgery(original, recipe.surgery, spec.input_shape, ctx)
    if not spec.weights:
        return block, None
    r = spec.restore
    report = restore(block, spec.weights, prefix_map=r.prefix_map, only=r.only)
    dropped = [glob.escape(n) for n in sorted(before - set(named_params(block)))]
    report.check([*r.expect_missing, "head.*"], [*r.expect_unexpected, *dropped], r.expect_mismatch)
    return block, report
