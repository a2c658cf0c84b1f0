"""Classification: softmax cross-entropy, top-1/top-5, balanced accuracy, confusion matrix."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..errors import TrainError
from ..pipeline import prepare
from ..recipe import Recipe
from . import split, transform_record


class Classification:
    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int):
        from ..train.data import make_loaders

        prep = prepare(recipe, ctx=ctx)
        loaders = make_loaders(recipe.data, seed=seed)
        head = recipe.surgery.head
        if head is not None and head.classes != loaders.num_classes:
            raise TrainError(f"surgery.head.classes is {head.classes} but the data has {loaders.num_classes} "
                             f"classes ({', '.join(loaders.class_names[:10])}). Make them equal.")
        if head is None:
            _check_outputs(prep.block, recipe, loaders.num_classes, loaders.class_names, ctx)
        self.loss_fn = loss_fn(recipe, loaders.num_classes)
        self.num_classes = loaders.num_classes
        return prep, loaders

    def check(self, recipe: Recipe, prep, loaders, ctx: mx.Context, guards) -> None:
        from ..train.guards import check_features, check_weights

        guards.handle(check_weights(recipe, prep))
        guards.handle(check_features(recipe, prep.block, prep.plan, loaders, ctx))

    def feed(self, net, plan, recipe: Recipe, loaders, ctx, folder: Path, quiet: bool, previous):
        from ..train.cache import build_feed

        return build_feed(net, plan, recipe, loaders, ctx, folder, quiet, previous)

    def forward(self, net, xs, ys):
        return classify(net, xs, ys, self.loss_fn)

    def evaluate(self, net, batches, ctxs) -> dict[str, Any]:
        return evaluate_loader(net, batches, ctxs, self.num_classes, self.loss_fn)

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        from ..train.guards import check_first_epoch

        return check_first_epoch(batch_losses, steps, loaders.num_classes)

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        from ..train.card import run_card

        return {**run_card(recipe, recipe.data, loaders.class_names), "transforms": self.transforms(recipe)}

    def transforms(self, recipe: Recipe) -> dict[str, dict[str, str | None]]:
        from ..train.transforms import describe

        return transform_record(recipe, describe)


def classify(net, xs, ys, loss: Callable) -> tuple[list[mx.nd.NDArray], list[mx.nd.NDArray]]:
    outs = [net(x) for x in xs]
    losses = [loss(o, y) for o, y in zip(outs, ys)]
    with autograd.pause():  # read after backward is queued, so counting does not stall the step
        hits = [(o.argmax(axis=1) == y).sum() for o, y in zip(outs, ys)]
    return losses, hits


def evaluate_loader(net, loader, ctxs, num_classes: int, loss_fn) -> dict[str, Any]:
    """Loss, top-1/top-5 and the confusion matrix over a loader, in inference mode."""
    total_loss, n = 0.0, 0
    conf = np.zeros((num_classes, num_classes), dtype=np.int64)
    top5_hits = 0
    for x, y in loader:
        xs = split(x, ctxs)
        ys = split(y, ctxs)
        for xi, yi in zip(xs, ys):
            out = net(xi)
            total_loss += float(loss_fn(out, yi).sum().asscalar())
            scores = out.asnumpy()
            labels = yi.asnumpy().astype(np.int64)
            pred = scores.argmax(axis=1)
            np.add.at(conf, (labels, pred), 1)
            k = min(5, num_classes)
            top = np.argsort(-scores, axis=1)[:, :k]
            top5_hits += int((top == labels[:, None]).any(axis=1).sum())
            n += len(labels)
    n = max(n, 1)
    out = {"val_loss": total_loss / n, "val_top1": float(np.trace(conf)) / n,
           "val_balanced_acc": balanced_accuracy(conf), "confusion": conf}
    if num_classes > 5:
        out["val_top5"] = top5_hits / n
    return out


def balanced_accuracy(conf: np.ndarray) -> float:
    """Mean recall over the classes present (rows: true labels): on imbalanced data top-1 can
    look good for a model that always answers the majority class; this cannot."""
    support = conf.sum(axis=1)
    present = support > 0
    return float(np.mean(np.diag(conf)[present] / support[present])) if present.any() else 0.0


def loss_fn(recipe: Recipe, num_classes: int) -> Callable:
    eps = recipe.train.label_smoothing
    if eps == 0:
        return gluon.loss.SoftmaxCrossEntropyLoss()
    ce = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def smoothed(out, label):
        target = mx.nd.one_hot(label, num_classes) * (1 - eps) + eps / num_classes
        return ce(out, target.as_in_context(out.context))

    return smoothed


def _check_outputs(net, recipe: Recipe, classes: int, names: list[str], ctx) -> None:
    """Without a new head the model's own output must score the data's classes, one per column."""
    with autograd.predict_mode():
        out = net(mx.nd.zeros((1, *recipe.model.input_shape), ctx=ctx))
    shape = tuple(out.shape) if isinstance(out, mx.nd.NDArray) else tuple(tuple(o.shape) for o in out)
    if len(shape) != 2 or shape[1] != classes:
        raise TrainError(f"The model's output has shape {shape} for one image, but the data has {classes} classes "
                         f"({', '.join(names[:10])}): a classifier needs (1, {classes}). Attach a new head with "
                         f"surgery.head: {{classes: {classes}}} (zoo models rebuild their own classifier), or cut "
                         f"the model (surgery.cut_at / drop_last) and attach one there.")
