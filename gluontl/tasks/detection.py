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
from typing import Any, Callable

import mxnet as mx
from mxnet import autograd

from ..mxinternals import clear_cached_op, loaded_names
from ..pipeline import Prepared, planned
from ..recipe import QuantizeSpec, Recipe
from . import EndToEnd, PredictOptions, Report, transform_record


class Detection(EndToEnd):
    feed_note = "feature cache: off (a detector trains on augmented images end to end)"

    def prepare(self, recipe: Recipe, ctx=None, *, apply: bool = True) -> Prepared:
        return prepare(recipe, None, ctx, apply)

    def plan_notes(self, recipe: Recipe, prep: Prepared) -> tuple[str, list[str], dict[str, Any]]:
        return self.feed_note, [], {}

    def load(self, run: Path, recipe: Recipe, tag: str, ctx=None):
        from ..detect.runs import load_detector

        return load_detector(run, recipe, tag, ctx)

    def evaluate_run(self, run: Path, recipe: Recipe, net, split: str, tag: str, tta: str | None = None) -> Report:
        from ..detect.runs import evaluate

        out = evaluate(run, recipe, net, split)
        return Report(out, [f"{run} [{tag}] on {split} ({out['images']} images, {out['objects']} objects): "
                            f"VOC mAP@0.5 {out['val_map50']:.4f}, COCO mAP@[.5:.95] {out['val_map']:.4f}",
                            out["table"], f"PR curves: {out['pr_curves']}"])

    def predict_run(self, run: Path, recipe: Recipe, net, images: list[str], opts: PredictOptions) -> Report:
        from ..detect.runs import predict

        return _drawn(*predict(run, recipe, net, images, opts.out, opts.score))

    def predict_onnx(self, path: Path, images: list[str], opts: PredictOptions) -> Report:
        from ..detect.runs import predict_onnx

        return _drawn(*predict_onnx(path, images, opts.out, opts.score))

    def export_run(self, run: Path, recipe: Recipe, net, out_dir: Path, formats: list[str], force: bool,
                   quantize: QuantizeSpec | None, echo: Callable[[str], None]) -> list[Path]:
        from ..detect.runs import export

        return export(run, recipe, net, out_dir, formats, force, quantize, echo)

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
        from ..detect.metrics import DetectionEval
        from ..detect.runs import predict_batches

        dets, gts = predict_batches(net, batches, ctxs)
        ev = DetectionEval(self.class_names)
        for d, g in zip(dets, gts):
            ev.update(d, g)
        voc, coco = ev.voc(), ev.coco()
        return {"val_map50": voc["map50"], "val_map": coco["map"], "per_class_ap50": voc["per_class"],
                "voc": voc, "coco": coco}

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        return []

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        from ..data.card import run_card

        return {**run_card(recipe, recipe.data, loaders.class_names), "task": "detection",
                "transforms": self.transforms(recipe)}

    def transforms(self, recipe: Recipe) -> dict[str, dict[str, str | None]]:
        from ..detect.augment import describe

        hw = recipe.model.input_shape[-2:]
        return transform_record(recipe, lambda spec, train: describe(spec, hw, train))


def _drawn(rows: list[dict[str, Any]], report: Path) -> Report:
    lines = [f"{r['file']}: " + (", ".join(f"{d['class']} {d['score']:.3f} {[round(v) for v in d['box']]}"
                                           for d in r["detections"]) or "nothing") for r in rows]
    return Report({"rows": rows, "report": report}, [*lines, f"images with boxes and detections.json: {report.parent}"])


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
    net, plan = planned(net, recipe, apply)
    loaded = set(loaded_names(net))
    if report is not None:
        loaded |= set(report.restored) | {n for n, _ in report.rebuilt}
    return Prepared(net, report, plan, loaded)


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
        clear_cached_op(net)
        self.anchors = [a.as_in_context(mx.cpu()) for a in self.anchors]
        self.offsets = [o.as_in_context(mx.cpu()) for o in self.offsets]
        self.feats = [mx.nd.zeros(f.shape) for f in feats]
        self.gen = YOLOV3PrefetchTargetGenerator(num_class=len(net.classes))

    def __call__(self, y: mx.nd.NDArray) -> list[mx.nd.NDArray]:
        y_cpu = y.as_in_context(mx.cpu())
        out = self.gen(self.fake, self.feats, self.anchors, self.offsets, y_cpu[:, :, :4], y_cpu[:, :, 4:5])
        return [t.as_in_context(y.context) for t in out]
