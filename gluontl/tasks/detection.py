"""Detection: SSD and YOLOv3 from the GluonCV zoo, trained with their own losses.

Targets are made per batch, on the batch's context, from the padded ground truth
``(B, M, 6)`` the detection loaders give (GluonCV's DALI path does the same; its default
path makes them per image in data workers): SSD's ``SSDTargetGenerator`` + ``SSDMultiBoxLoss``,
YOLOv3's prefetch target generator + the loss inside the network. SSD's loss is normalized by
the positives of the whole batch and meant for ``trainer.step(1)``; it is scaled by the batch's
image count here so that, like every task's, the loop's ``trainer.step(images)`` applies it.

A hybridized GluonCV detector keeps the graph it traced, so after a training step it would go
on returning training outputs in inference (and the inference graph in training): the cached
graph is dropped around every evaluation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd

from ..pipeline import Prepared
from ..recipe import Recipe
from ..rules import apply_plan, make_plan
from . import split, transform_record


class Detection:
    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int):
        from ..detect.data import make_detection_loaders
        from ..stages import detector_family

        loaders = make_detection_loaders(recipe.data, recipe.model.input_shape, seed=seed)
        prep = prepare(recipe, loaders.class_names, ctx)
        net = prep.block
        self.family = detector_family(net)
        self.class_names = loaders.class_names
        self.targets = _ssd_targets() if self.family == "ssd" else _YoloTargets(net, recipe.model.input_shape, ctx)
        return prep, loaders

    def check(self, recipe: Recipe, prep, loaders, ctx, guards) -> None:
        from ..train.guards import check_weights

        guards.handle(check_weights(recipe, prep))

    def feed(self, net, plan, recipe: Recipe, loaders, ctx, folder: Path, quiet: bool, previous):
        from ..train.cache import Feed

        if previous is not None:
            previous.net._clear_cached_op()  # traced with the old grad_req
            return previous
        return Feed(net, loaders, log="feature cache: off (a detector trains on augmented images end to end)")

    def forward(self, net, xs, ys):
        images = sum(x.shape[0] for x in xs)
        if self.family == "ssd":
            return _ssd_losses(net, xs, ys, self.targets, images), None
        losses = []
        for x, y in zip(xs, ys):
            with autograd.pause():
                targets = self.targets(y)
            losses.append(sum(net(x, y[:, :, :4], *targets)))
        return losses, None

    def evaluate(self, net, batches, ctxs) -> dict[str, Any]:
        dets, gts = predict_batches(net, batches, ctxs)
        from ..detect.metrics import DetectionEval

        ev = DetectionEval(self.class_names)
        for d, g in zip(dets, gts):
            ev.update(d, g)
        voc, coco = ev.voc(), ev.coco()
        return {"val_map50": voc["map50"], "val_map": coco["map"], "per_class_ap50": voc["per_class"],
                "voc": voc, "coco": coco}

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        return []

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        from ..train.card import run_card

        return {**run_card(recipe, recipe.data, loaders.class_names), "task": "detection",
                "transforms": self.transforms(recipe)}

    def transforms(self, recipe: Recipe) -> dict[str, dict[str, str | None]]:
        from ..detect.augment import describe

        hw = recipe.model.input_shape[-2:]
        return transform_record(recipe, lambda spec, train: describe(spec, hw, train))


def prepare(recipe: Recipe, classes: list[str] | None = None, ctx=None, apply: bool = True) -> Prepared:
    """The recipe's detector for ``classes`` (default: the training split's), restored, planned."""
    from ..detect.models import build_detector

    if classes is None:
        from ..detect.data import load_detection_split
        from ..errors import RecipeError

        if recipe.data is None:
            raise RecipeError("A detection recipe needs a data: section: the detector's classes come from "
                              "the data (data.source, and data.classes to pick and order them).")

        classes = load_detection_split(recipe.data, recipe.data.train, recipe.model.input_shape).class_names
    net, report = build_detector(recipe, classes, ctx or mx.cpu())
    shape = (1, *recipe.model.input_shape)
    make_plan(net, recipe.rules, epoch=None, input_shape=shape)  # every rule must match, from_epoch ones too
    plan = make_plan(net, recipe.rules, epoch=0, input_shape=shape)
    if apply:
        apply_plan(net, plan)
    loaded = set(net._gluontl_loaded)
    if report is not None:
        loaded |= set(report.restored) | {n for n, _ in report.rebuilt}
    return Prepared(net, report, plan, loaded)


def predict_batches(net, batches, ctxs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per image: detections ``(K, 6)`` [class, score, x1, y1, x2, y2] and ground truth ``(N, 6)``
    (padding rows removed), both in network-input pixels."""
    net._clear_cached_op()
    dets, gts = [], []
    try:
        with autograd.predict_mode():
            for x, y in batches:
                for xi, yi in zip(split(x, ctxs), split(y, ctxs)):
                    ids, scores, boxes = net(xi)
                    out = mx.nd.concat(ids, scores, boxes, dim=-1).asnumpy()
                    for d, g in zip(out, yi.asnumpy()):
                        dets.append(d[d[:, 0] >= 0])
                        gts.append(g[g[:, 4] >= 0])
    finally:
        net._clear_cached_op()
    return dets, gts


def _ssd_targets():
    from gluoncv.model_zoo.ssd.target import SSDTargetGenerator

    return SSDTargetGenerator(iou_thresh=0.5, stds=(0.1, 0.1, 0.2, 0.2), negative_mining_ratio=-1)


def _ssd_losses(net, xs, ys, target_gen, images: int) -> list[mx.nd.NDArray]:
    from gluoncv.loss import SSDMultiBoxLoss

    cls_preds, box_preds, cls_targets, box_targets = [], [], [], []
    for x, y in zip(xs, ys):
        cls_pred, box_pred, anchors = net(x)
        with autograd.pause():
            cls_t, box_t, _ = target_gen(anchors, None, y.slice_axis(axis=-1, begin=0, end=4),
                                         y.slice_axis(axis=-1, begin=4, end=5))
        cls_preds.append(cls_pred)
        box_preds.append(box_pred)
        cls_targets.append(cls_t)
        box_targets.append(box_t)
    sum_loss, _, _ = SSDMultiBoxLoss()(cls_preds, box_preds, cls_targets, box_targets)
    return [l * images for l in sum_loss]


class _YoloTargets:
    """YOLOv3's targets for a padded ground-truth batch; anchors, offsets and feature-map sizes
    come from one training-mode forward at the recipe's input size."""

    def __init__(self, net, input_shape: tuple[int, ...], ctx: mx.Context) -> None:
        from gluoncv.model_zoo.yolo.yolo_target import YOLOV3PrefetchTargetGenerator

        self.fake = mx.nd.zeros((1, *input_shape))
        with autograd.train_mode():
            _, self.anchors, self.offsets, feats, *_ = net(mx.nd.zeros((1, *input_shape), ctx=ctx))
        net._clear_cached_op()
        self.anchors = [a.as_in_context(mx.cpu()) for a in self.anchors]
        self.offsets = [o.as_in_context(mx.cpu()) for o in self.offsets]
        self.feats = [mx.nd.zeros(f.shape) for f in feats]
        self.gen = YOLOV3PrefetchTargetGenerator(num_class=len(net.classes))

    def __call__(self, y: mx.nd.NDArray) -> list[mx.nd.NDArray]:
        y_cpu = y.as_in_context(mx.cpu())
        out = self.gen(self.fake, self.feats, self.anchors, self.offsets, y_cpu[:, :, :4], y_cpu[:, :, 4:5])
        return [t.as_in_context(y.context) for t in out]
