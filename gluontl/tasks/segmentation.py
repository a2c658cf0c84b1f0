"""Semantic segmentation: per-pixel classes from GluonCV FCN / PSPNet / DeepLabV3 or any gluontl
source with an FCN or LR-ASPP head, over a whole run's life.

The objective is GluonCV's (``MixSoftmaxCrossEntropyLoss``): softmax cross-entropy over the
labelled pixels of each image, plus ``aux_weight`` times the auxiliary head's; an image whose
pixels are all ignored contributes 0, not NaN (``gluontl.segment.loss``). Metrics are GluonCV's
pixel accuracy and mIoU over every class (``gluontl.segment.metrics``), with a per-class IoU table.
In predict mode a segmenter returns its logits alone, in training mode with ``aux`` also the
auxiliary head's (``gluontl.segment.models``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import mxnet as mx
import numpy as np
from mxnet import autograd

from ..errors import ExportError, RecipeError, TrainError, short_reason
from ..naming import named_params
from ..pipeline import Prepared, planned
from ..recipe import QuantizeSpec, Recipe, SegmentationSpec
from ..runfolder import RunFolder
from ..rules import attach_adapters
from ..sources import declared_shape
from . import EndToEnd, PredictOptions, Report, split, transform_record



def seg_spec(recipe: Recipe) -> SegmentationSpec:
    """The recipe's segmentation: section, its defaults when left out."""
    return recipe.segmentation or SegmentationSpec()


class Segmentation(EndToEnd):
    feed_note = "feature cache: off (a segmenter trains on augmented images and masks end to end)"

    # ------------------------------------------------------------ planning and training

    def prepare(self, recipe: Recipe, ctx=None, *, apply: bool = True) -> Prepared:
        return prepare(recipe, None, ctx, apply)

    def plan_notes(self, recipe: Recipe, prep: Prepared) -> tuple[str, list[str], dict[str, Any]]:
        seg = seg_spec(recipe)
        hw = tuple(recipe.model.input_shape[-2:])
        crop = seg.crop or hw
        line = (f"segmenter: {seg.arch}" + (f" on taps {', '.join(seg.taps)}" if seg.taps else "")
                + (f", auxiliary head (loss weight {seg.aux_weight:g})" if seg.aux else "")
                + f"; train crop {crop[0]}x{crop[1]}, val {hw[0]}x{hw[1]}, padded to a multiple of {seg.stride}; "
                f"ignore label {seg.ignore_label}")
        lines = [line]
        declared = declared_shape(recipe.model)[-2:]
        if declared != hw:
            lines.append(f"backbone: {recipe.model.source} declares {declared[0]}x{declared[1]}; bound at "
                         f"{hw[0]}x{hw[1]} up to the taps, the graph being fully convolutional up to there (what "
                         f"lies past them is cut)")
        return self.feed_note, lines, {"segmentation": seg.model_dump(mode="json")}

    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int):
        from ..segment.data import make_segmentation_loaders
        from ..segment.loss import SegmentationLoss

        seg = seg_spec(recipe)
        loaders = make_segmentation_loaders(recipe.data, seg, recipe.model.input_shape, seed=seed)
        prep = prepare(recipe, loaders.class_names, ctx)
        self.class_names, self.seg = loaders.class_names, seg
        self.loss = SegmentationLoss(seg.aux_weight if seg.aux else None, seg.ignore_label,
                                     class_weights(seg, loaders.class_names, loaders.train_pixels))
        return prep, loaders

    def forward(self, net, xs, ys):
        losses = []
        for x, y in zip(xs, ys):
            out = net(x)
            losses.append(self.loss(*out, y) if self.seg.aux else self.loss(out, y))
        return losses, None

    def evaluate(self, net, batches, ctxs) -> dict[str, Any]:
        return evaluate_batches(net, batches, ctxs, self.class_names, self.seg.ignore_label)

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        return []

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        from ..data.card import run_card

        return {**run_card(recipe, recipe.data, loaders.class_names), "task": "segmentation",
                "ignore_label": seg_spec(recipe).ignore_label, "class_weights": self.loss.class_weights,
                "transforms": self.transforms(recipe)}

    def transforms(self, recipe: Recipe) -> dict[str, dict[str, str | None]]:
        from ..data.transforms import describe_normalize

        seg, (h, w) = seg_spec(recipe), recipe.model.input_shape[-2:]
        ch, cw = seg.crop or (h, w)
        pad = f"pad to a multiple of {seg.stride} (mask: ignore label)"

        def describe(spec, train: bool) -> str:
            steps = ([f"random scale {seg.scale[0]:g}-{seg.scale[1]:g} (mask nearest)",
                      f"random crop {ch}x{cw} (padded if smaller)"] + (["horizontal flip (p 1/2)"] if seg.flip else [])
                     if train else [f"resize to {h}x{w} (H x W, mask nearest)"])
            return ", ".join([*steps, pad, describe_normalize(spec)])

        return transform_record(recipe, describe)

    # ------------------------------------------------------------ a finished run

    def load(self, run: Path, recipe: Recipe, tag: str, ctx=None):
        from ..data import checkpoint
        from ..data.card import stored_card

        classes = stored_card(run, recipe)["classes"]
        spec = recipe.model.model_copy(update={"weights": None, "weights_from": None, "restore": recipe.model.restore
                                               .model_copy(update={"type": None, "reuse": {}})})
        net, _ = _build(recipe.model_copy(update={"model": spec}), classes, ctx or mx.cpu())
        net = attach_adapters(net, recipe.rules, input_shape=(1, *recipe.model.input_shape))
        checkpoint.restore_into(RunFolder(run).checkpoints_dir, tag, net, None, ctx)
        net.hybridize(static_alloc=True, static_shape=True)
        return net

    def evaluate_run(self, run: Path, recipe: Recipe, net, split: str, tag: str, tta: str | None = None) -> Report:
        from ..segment.data import load_segmentation_split
        from ..data.card import recipe_data, stored_card

        seg = seg_spec(recipe)
        ds = load_segmentation_split(recipe_data(recipe, run), seg, split, recipe.model.input_shape)
        trained = stored_card(run, recipe)["classes"]
        if list(ds.class_names) != list(trained):  # mask values would mean other classes
            raise TrainError(f"The {split} split of {recipe.data.source} now names its mask values {ds.class_names}, "
                             f"but {run} was trained on {trained} (its {RunFolder.CARD}). Set data.classes in "
                             f"{RunFolder(run).recipe_path} to {trained}.")
        with autograd.predict_mode():
            out = evaluate_batches(net, _batches(ds, recipe.data.batch_size), [mx.cpu()], ds.class_names,
                                   seg.ignore_label)
        values = {"task": "segmentation", **{k: v for k, v in out.items() if k != "table"}, "split": split,
                  "checkpoint": tag, "class_names": ds.class_names, "images": len(ds)}
        lines = [f"{run} [{tag}] on {split} ({len(ds)} images): mIoU {out['val_miou']:.4f}, pixel accuracy "
                 f"{out['val_pixel_acc']:.4f}, loss {out['val_loss']:.4f}", *iou_table(out["table"])]
        return Report(values, lines)

    def predict_run(self, run: Path, recipe: Recipe, net, images: list[str], opts: PredictOptions) -> Report:
        from ..data.card import stored_card
        from ..data.transforms import load_images

        decoded = load_images(images)
        card = stored_card(run, recipe)
        transform, names, _ = input_transform(card, str(RunFolder(run).card_path))

        def masks(x: np.ndarray) -> np.ndarray:
            return net(mx.nd.array(x)).asnumpy().argmax(1)

        with autograd.predict_mode():
            found = [_predict_one(transform, image, masks) for image in decoded]
        return _write(Path(opts.out) if opts.out else RunFolder(run).predictions_dir, images, decoded, found, names)

    def predict_onnx(self, path: Path, images: list[str], opts: PredictOptions) -> Report:
        from ..export.openvino_ir import deployed_card, deployed_session
        from ..data.transforms import load_images

        path = Path(path)
        card = deployed_card(path)  # no metadata: refused before any work (an OpenVINO IR: its runtime info)
        transform, names, hw = input_transform(card, f"'{path}'")
        decoded = load_images(images)
        session = deployed_session(path)  # an OpenVINO IR folder runs behind the same calls
        inputs = session.get_inputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise ExportError(f"'{path}' takes inputs {[(i.name, i.shape) for i in inputs]}; a segmenter's export "
                              f"takes one N x 3 x {hw[0]} x {hw[1]} image batch. Export the run again.")

        def masks(x: np.ndarray) -> np.ndarray:
            try:
                outs = session.run(None, {inputs[0].name: x})
            except Exception as err:  # onnxruntime's errors share no base class
                raise ExportError(f"onnxruntime cannot run '{path}' ({short_reason(err)}); export the run "
                                  f"again.") from None
            return onnx_masks(outs, f"'{path}'", len(names))

        found = [_predict_one(transform, image, masks) for image in decoded]
        out = Path(opts.out) if opts.out else path.with_name(f"{path.stem}-predictions")
        return _write(out, images, decoded, found, names)

    def export_run(self, run: Path, recipe: Recipe, net, out_dir: Path, formats: list[str], force: bool,
                   quantize: QuantizeSpec | None, echo: Callable[[str], None]) -> list[Path]:
        from ..segment.data import load_segmentation_split
        from ..segment.export import export_segmenter
        from ..data.card import export_input_name, recipe_data, stored_card

        card = stored_card(run, recipe)
        seg, shape = seg_spec(recipe), recipe.model.input_shape
        val = load_segmentation_split(recipe.data, seg, recipe.data.val, shape) if recipe.data is not None else None
        if quantize is not None and val is None:
            recipe_data(recipe, run)  # int8 calibrates and judges on the run's images: refused, naming the file
        sample = None if val is None else np.stack([val[(i, 0)][0] for i in range(min(8, len(val)))]).astype(np.float32)

        def write(folder: Path) -> list[Path]:
            return export_segmenter(net, folder, recipe.name, tuple(shape), formats=formats, force=force,
                                    sample=sample, card={**card, "task": "segmentation"}, rtol=recipe.export.rtol,
                                    input_name=export_input_name(recipe),
                                    **({"opset": recipe.export.opset} if recipe.export.opset else {}))

        if quantize is None:
            return write(out_dir)
        from ..export.quantize import export_with_int8
        from ..segment.metrics import int8_metric

        # the network is quantized; the arg-max that makes the mask stays float, as NMS does for detectors
        train = val if quantize.calibration == "val" else load_segmentation_split(recipe.data, seg, recipe.data.train,
                                                                                 shape)
        labels = [val[(i, 0)][1] for i in range(len(val))]
        return export_with_int8(write, out_dir, recipe.name, quantize, train, val, labels,
                                int8_metric(len(card["classes"]), seg.ignore_label), force=force, report_dir=run,
                                echo=echo, op_types=["Conv"], outputs=["mask"],
                                symbol_outputs=lambda outs: [np.argmax(outs[0], axis=1)],
                                tensors=lambda _, ds: lambda i: ds[(i, 0)][0])


# ---------------------------------------------------------------- building

def _build(recipe: Recipe, classes: list[str], ctx):
    from ..segment.models import SegmenterSpec, build_segmenter

    seg = seg_spec(recipe)
    spec = SegmenterSpec(arch=seg.arch, taps=tuple(seg.taps), aux=seg.aux, head_channels=seg.head_channels)
    return build_segmenter(recipe.model, spec, len(classes), ctx, class_names=classes)


def prepare(recipe: Recipe, classes: list[str] | None = None, ctx=None, apply: bool = True) -> Prepared:
    """The recipe's segmenter for ``classes`` (default: the source's), restored, planned."""
    if classes is None:
        from ..segment.data import class_names

        if recipe.data is None:
            raise RecipeError("A segmentation recipe needs a data: section: the segmenter's classes are the "
                              "data's mask values (data.source, and data.classes to name them).")
        classes = class_names(recipe.data)
    net, report = _build(recipe, classes, ctx or mx.cpu())
    net, plan = planned(net, recipe, apply)
    spec = recipe.model  # the backbone's source carries its weights (ONNX, symbol, a pretrained zoo model)
    carried = not spec.random_init and (not spec.source.startswith("zoo:") or spec.pretrained)
    loaded = {n for n in named_params(net) if carried and n.startswith("backbone.")}
    if report is not None:
        loaded |= set(report.restored) | {n for n, _ in report.rebuilt}
    return Prepared(net, report, plan, loaded)


def class_weights(seg: SegmentationSpec, classes: list[str], pixels) -> list[float] | None:
    """The loss's per-class weights ``segmentation.class_weights`` asks for (None: unweighted)."""
    from ..segment.loss import median_frequency_weights

    if seg.class_weights == "none":
        return None
    if seg.class_weights == "balanced":
        return [float(w) for w in median_frequency_weights(pixels)]
    if len(seg.class_weights) != len(classes):
        raise RecipeError(f"segmentation.class_weights lists {len(seg.class_weights)} weights but the data has "
                          f"{len(classes)} classes ({', '.join(classes)}); give one weight per class in that order, "
                          f"or balanced / none.")
    return list(seg.class_weights)


# ---------------------------------------------------------------- evaluation

def evaluate_batches(net, batches, ctxs: list[mx.Context], class_names: list[str], ignore: int) -> dict[str, Any]:
    """``val_loss`` (the main head's), ``val_miou``, ``val_pixel_acc``, ``per_class_iou`` and the
    metric's ``table`` over ``batches`` of (images, masks)."""
    from ..segment.loss import SegmentationLoss
    from ..segment.metrics import SegmentationMetric

    metric, loss = SegmentationMetric(len(class_names), ignore), SegmentationLoss(None, ignore)
    total, images = 0.0, 0
    for x, y in batches:
        for xi, yi in zip(split(x, ctxs), split(y, ctxs)):
            logits = net(xi)
            total += float(loss(logits, yi).sum().asscalar())
            images += xi.shape[0]
            metric.update(yi.asnumpy(), logits.asnumpy().argmax(1))
    acc, miou = metric.get()
    table = metric.table(class_names)
    return {"val_loss": total / max(images, 1), "val_miou": miou, "val_pixel_acc": acc,
            "per_class_iou": {name: iou for name, iou, _ in table}, "table": table}


def iou_table(table: list[tuple[str, float | None, int]]) -> list[str]:
    """The per-class IoU table as evaluate prints it; a class in neither labels nor predictions is
    marked (it scores 0 in the mean, as in GluonCV)."""
    width = max([len("class"), *(len(n) for n, _, _ in table)])
    rows = [f"{'class':<{width}}  {'IoU':>6}  {'pixels':>10}"]
    for name, iou, pixels in table:
        rows.append(f"{name:<{width}}  {'absent' if iou is None else f'{iou:.4f}':>6}  {pixels:>10}")
    return rows


def _batches(ds, batch: int):
    for s in range(0, len(ds), batch):
        items = [ds[(i, 0)] for i in range(s, min(s + batch, len(ds)))]
        yield mx.nd.array(np.stack([a for a, _ in items])), mx.nd.array(np.stack([b for _, b in items]))


# ---------------------------------------------------------------- predict

def input_transform(card: dict[str, Any], where: str):
    """The evaluation transform a segmentation card describes (a run's preprocess.json or an
    export's metadata), its class names and the network input (H, W): a resize to H, W and the
    recorded normalization."""
    from ..data.card import resized_input
    from ..segment.augment import SegmentationTransform

    prep, names, hw = resized_input(card, where, "segmenter", "segmentation")
    return SegmentationTransform(False, prep.mean, prep.std, size=hw), names, hw


def onnx_masks(outputs: list[np.ndarray], where: str, num_classes: int) -> np.ndarray:
    """The (N, H, W) class ids of a segmenter export's outputs: its arg-max output (rank 3), else
    the arg-max of its (N, K, H, W) logits."""
    ids = [o for o in outputs if o.ndim == 3]
    if ids:
        return np.asarray(ids[0]).astype(np.int64)
    logits = [o for o in outputs if o.ndim == 4 and o.shape[1] == num_classes]
    if not logits:
        raise ExportError(f"{where} gives outputs of shapes {[list(o.shape) for o in outputs]}, neither (N, H, W) "
                          f"class ids nor (N, {num_classes}, H, W) logits for its {num_classes} classes; export the "
                          f"run again.")
    return logits[0].argmax(1)


def _predict_one(transform, image: np.ndarray, masks) -> np.ndarray:
    """The (H, W) uint8 class ids of one image at its own size (network mask resized nearest)."""
    from ..segment.augment import resize_mask

    x, _ = transform(image, np.zeros(image.shape[:2], np.uint8))
    mask = masks(x[None])[0].astype(np.uint8)
    return resize_mask(mask, image.shape[1], image.shape[0])


def _write(out: Path, images: list[str], decoded: list[np.ndarray], masks: list[np.ndarray],
           names: list[str]) -> Report:
    """Per image: ``STEM-mask.png`` (VOC palette: colours that are the class ids), ``STEM-overlay.png``
    and the share of its pixels per class, in ``predictions.json``."""
    from ..atomic import atomic_write, write_text
    from ..segment.draw import overlay
    from ..segment.formats import write_mask

    out.mkdir(parents=True, exist_ok=True)
    rows, lines = [], []
    for path, image, mask in zip(images, decoded, masks):
        stem = Path(path).stem
        mask_file, overlay_file = out / f"{stem}-mask.png", out / f"{stem}-overlay.png"
        write_mask(mask_file, mask)
        picture = overlay(image, mask)
        atomic_write(overlay_file, lambda p: picture.save(p, format="PNG"), TrainError)
        counts = np.bincount(mask.ravel(), minlength=len(names))[:len(names)]
        fractions = {n: round(float(c) / mask.size, 6) for n, c in zip(names, counts) if c}
        rows.append({"image": str(path), "mask": str(mask_file), "overlay": str(overlay_file),
                     "fractions": fractions})
        shown = sorted(fractions.items(), key=lambda kv: -kv[1])[:5]
        lines.append(f"{path}: " + ", ".join(f"{n} {f:.1%}" for n, f in shown) + f"  -> {overlay_file}")
    report = out / "predictions.json"
    write_text(report, json.dumps({"classes": names, "images": rows}, indent=1), TrainError)
    lines.append(f"masks, overlays and {report.name} in {out}")
    return Report({"rows": rows, "json": str(report)}, lines)
