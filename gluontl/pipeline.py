"""Recipe → ready model: source, restore, surgery, rules. The CLI and API share this path."""
from __future__ import annotations

import dataclasses

import mxnet as mx
from mxnet.gluon import HybridBlock

from .recipe import Recipe
from .rules import Plan, apply_plan, make_plan
from .sources import RestoreReport, build_model


@dataclasses.dataclass
class Prepared:
    block: HybridBlock
    restore: RestoreReport | None
    plan: Plan


def prepare(recipe: Recipe, *, ctx=None, apply: bool = True) -> Prepared:
    """Build the recipe's model, restore its weights, attach the head and plan (and apply) rules.

    Every rule is checked for matches up front, including ``from_epoch`` rules that only
    take effect later, so a typo fails before training starts, not hours in.
    """
    ctx = ctx or mx.cpu()
    head = recipe.surgery.head
    block, report = build_model(recipe.model, classes=head.classes if head else None,
                                head_init=head.init if head else "xavier", ctx=ctx)
    make_plan(block, recipe.rules, epoch=None, input_shape=recipe.model.input_shape)
    plan = make_plan(block, recipe.rules, epoch=0, input_shape=recipe.model.input_shape)
    if apply:
        apply_plan(block, plan)
    return Prepared(block, report, plan)
