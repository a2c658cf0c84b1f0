"""Checks across a recipe's sections: what the task allows, what distribution refuses, and the
transforms a classifier's recipe leaves out, derived from the model's input size (and the
normalization its file declares). Recipe's validators call these once its sections are valid."""
from __future__ import annotations

from typing import Any

from pydantic_core import PydanticCustomError

from ..errors import hwc_hint
from ..metrics import EMA, find_metric
from ..task_registry import source_tasks
from .sections import TASK_SCHEMAS, DataSpec, SegmentationSpec, SurgerySpec, TransformSpec, selectable
from .sources import file_normalize

TRANSFORMS = ("train_transform", "val_transform")


def check_task(recipe: Any) -> None:
    """The sections agree with the task and with each other (what one section allows depends on
    another); a ValueError says what to change."""
    valid = selectable(recipe.task)
    if recipe.train.select.removeprefix(EMA) not in valid:
        known = find_metric(recipe.train.select)
        what = (f"it is a {'/'.join(known.task)} metric" if known and known.task and recipe.task not in known.task
                else "it cannot pick a checkpoint" if known else "no metric of that name is registered")
        raise ValueError(f"train.select {recipe.train.select} is not a {recipe.task} metric ({what}); use one of "
                         f"{', '.join(valid)} (or ema_ and one of them, with train.ema); a metric of your "
                         f"own is registered with gluontl.register_metric before the recipe is loaded")
    for item in recipe.train.callbacks:
        spec = item.get("early_stopping")
        monitor = spec and spec.monitor
        if monitor and (monitor.removeprefix(EMA) not in valid or (monitor.startswith(EMA) and
                                                                   recipe.train.ema is None)):
            raise ValueError(f"train.callbacks early_stopping monitor {monitor} is not a metric of this "
                             f"{recipe.task} run; monitor one of {', '.join(valid)}"
                             f"{' (or ema_ and one of them)' if recipe.train.ema else ''}")
    if recipe.train.select.startswith("ema_") and recipe.train.ema is None:
        raise ValueError(f"train.select {recipe.train.select} picks the best checkpoint by the averaged "
                         f"weights, but the recipe averages none; add train.ema (e.g. train.ema: "
                         f"{{decay: 0.9998}}) or select {recipe.train.select.removeprefix('ema_')}")
    if recipe.task == "classification" and (recipe.model.restore.type or recipe.model.restore.reuse):
        raise ValueError("model.restore.type / reuse are for task: detection (which rows of a detector's "
                         "heads to restore); classification restores by name (only, prefix_map, expect_*)")
    if recipe.model.detector is not None and (recipe.task != "detection" or recipe.model.source.startswith("zoo:")):
        raise ValueError("model.detector builds an SSD on an onnx:/symbol: backbone for task: detection; zoo "
                         "detectors (zoo:ssd_*, zoo:yolo3_*) come whole — remove model.detector")
    for owner in TASK_SCHEMAS.values():
        if owner.section and getattr(recipe, owner.section) is not None and recipe.task != owner.name:
            raise ValueError(f"the {owner.section}: section is for task: {owner.name}; the recipe's task is "
                             f"{recipe.task} (set task: {owner.name}, or remove the section)")
    owners = source_tasks(recipe.data.source) if recipe.data is not None else [recipe.task]
    if owners and recipe.task not in owners:  # a source of no task (demo:NAME) is the loader's to explain
        raise ValueError(f"data.source {recipe.data.source} is {' or '.join(owners)} data, not {recipe.task} data "
                         f"(the recipe's task); set task: {owners[0]} or use a {recipe.task} source "
                         f"({TASK_SCHEMAS[recipe.task].source_help})")
    if recipe.task in ("detection", "segmentation"):
        _strong_augmentation_refused(recipe)
    if recipe.task == "segmentation":
        _segmentation_fits(recipe)
    if recipe.train.distributed.backend == "horovod" and "," in recipe.train.ctx:
        raise ValueError(f"train.ctx {recipe.train.ctx} lists several devices, but Horovod 0.28's MXNet Trainer "
                         f"reduces only the first context's gradients (the other copies would drift apart); "
                         f"run one Horovod process per device (horovodrun -np <devices>) with one ctx each")
    if recipe.train.lr == "auto" and recipe.train.distributed.backend not in (None, "none"):
        raise ValueError("train.lr: auto would run the range test in every worker; run `gluontl lr-find` once "
                         "and set train.lr to its suggestion")
    staged = [i + 1 for i, r in enumerate(recipe.rules) if r.from_epoch or r.preset == "fine_tune"]
    if recipe.train.distributed.backend not in (None, "none") and staged:  # unset: checked once resolved
        raise ValueError(f"rules {', '.join(map(str, staged))} start at a later epoch (from_epoch, or preset "
                         f"fine_tune's unfreezing), which "
                         f"rebuilds the Trainer mid-run; a distributed Trainer's parameter-server keys cannot "
                         f"be rebuilt, so gradual unfreezing needs one run per stage with train.distributed "
                         f"(--init-from the previous run) or backend: none")
    if recipe.task == "detection" and (recipe.train.label_smoothing or recipe.train.cache_features == "on"):
        raise ValueError("train.label_smoothing and train.cache_features: on are for classification; a "
                         "detector uses its family's loss and trains on augmented images end to end")
    _imbalance_fits(recipe)
    if recipe.task == "detection" and recipe.surgery != SurgerySpec():
        raise ValueError("surgery (cut_at, drop_last, ignore, head) is for classifiers; a detector gets its "
                         "new classes from data.classes and keeps its own heads (model.restore.reuse "
                         "chooses which class rows start from old ones)")


def _imbalance_fits(recipe: Any) -> None:
    """data.sampler and train.loss are classification's; a class_weights list has one weight per class."""
    loss, sampler = recipe.train.loss, recipe.data.sampler if recipe.data is not None else "uniform"
    if recipe.task != "classification" and (loss is not None or sampler != "uniform"):
        raise ValueError(f"train.loss and data.sampler are for task: classification; a {recipe.task} recipe uses "
                         f"its own loss and samples uniformly (remove them)")
    if loss is not None and recipe.train.mixup is not None and (loss.kind != "cross_entropy"
                                                                or loss.class_weights != "none"):
        raise ValueError("train.mixup trains on mixed soft targets with plain cross-entropy, so it would ignore "
                         "train.loss's focal kind and class_weights; remove train.mixup or train.loss (balance "
                         "classes with data.sampler instead, which combines with mixup)")
    if loss is None or not isinstance(loss.class_weights, list):
        return
    head = recipe.surgery.head.classes if recipe.surgery.head is not None else None
    named = len(recipe.data.classes) if recipe.data is not None and recipe.data.classes is not None else None
    for classes, where in ((named, "data.classes"), (head, "surgery.head.classes")):
        if classes is not None and len(loss.class_weights) != classes:
            raise ValueError(f"train.loss.class_weights lists {len(loss.class_weights)} weights but {where} makes "
                             f"{classes} classes; give one weight per class, in label order (or class_weights: "
                             f"balanced)")


STRONG_AUGMENTATION = ("randaugment", "trivial_augment", "random_erasing")


def _strong_augmentation_refused(recipe: Any) -> None:
    """Mixup/CutMix and the photometric-geometric policies are classification's: they would move pixels
    without the boxes or masks, and a mixed box or mask has no label."""
    keys = ["train.mixup"] * (recipe.train.mixup is not None) + [
        f"data.{k}.{f}" for k in TRANSFORMS if recipe.data is not None
        for f in STRONG_AUGMENTATION if getattr(getattr(recipe.data, k), f)]
    if keys:
        raise ValueError(f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} for task: classification; a "
                         f"{recipe.task} recipe's images carry {'boxes' if recipe.task == 'detection' else 'masks'} "
                         f"that mixing, RandAugment, TrivialAugment and random erasing would not move or mix with "
                         f"them. Remove {'it' if len(keys) == 1 else 'them'}")


def _segmentation_fits(recipe: Any) -> None:
    if recipe.train.label_smoothing or recipe.train.cache_features == "on" or recipe.surgery != SurgerySpec():
        raise ValueError("train.label_smoothing, train.cache_features: on and surgery are for classification; "
                         "a segmenter trains its own head (segmentation:) on augmented images end to end")
    if recipe.model.restore.type == "detection" or recipe.model.detector is not None:
        raise ValueError("model.restore.type: detection and model.detector are for task: detection; a "
                         "segmenter restores with restore.type segmentation or classification")
    if len(recipe.model.input_shape) != 3:
        raise ValueError(f"model.input_shape {list(recipe.model.input_shape)} is not C, H, W; a segmenter takes "
                         f"images, e.g. [3, 128, 128]")
    stride = (recipe.segmentation or SegmentationSpec()).stride
    if any(d % stride for d in recipe.model.input_shape[1:]):
        raise ValueError(f"model.input_shape {list(recipe.model.input_shape)}: H and W must be multiples of "
                         f"segmentation.stride {stride}, the size validation, predict and exports feed (training "
                         f"crops of any size are padded to it; gluon-cv #1173)")
    if recipe.data is not None:
        plain = TransformSpec()
        changed = {k: [f for f in TransformSpec.model_fields if f != "normalize"
                       and getattr(getattr(recipe.data, k), f) != getattr(plain, f)] for k in TRANSFORMS}
        wrong = [f"data.{k} ({', '.join(fields)})" for k, fields in changed.items() if fields]
        if wrong:
            raise ValueError(f"{' and '.join(wrong)} set more than normalize; a segmenter's image and mask move "
                             f"together, so sizes, crops and flips are segmentation.crop, .scale and .flip "
                             f"(validation resizes to model.input_shape's H x W)")


def fitted_data(recipe: Any) -> DataSpec | None:
    """``recipe.data`` with its derived transforms (None: nothing to derive). Transforms a recipe
    leaves out, or gives without a size, come from ``model.input_shape`` (timm's ``resolve_data_config``): evaluation scales the shorter side to H and takes the
    centre H x W; training adds a horizontal flip. A size that differs from the input size is
    refused here, before any work: hybridized blocks (static shapes), the onnxruntime prefix and
    exports are built for that one size."""
    if recipe.data is None:
        return None
    given = recipe.data.model_fields_set
    if recipe.task == "segmentation":  # checked by _segmentation_fits: segmentation: holds the geometry
        recipe.data._defaults = {k: "default: segmentation's own rule" for k in TRANSFORMS if k not in given}
        return None
    if recipe.task == "detection":  # a detector resizes every image to input_shape's H, W itself
        sized = [f"data.{k} ({getattr(recipe.data, k).sizes()})" for k in TRANSFORMS
                 if getattr(recipe.data, k).out_size() is not None]
        if sized:
            raise ValueError(f"{' and '.join(sized)} sets a size, which detection does not use: every image is "
                             f"resized whole to model.input_shape's H x W {tuple(recipe.model.input_shape[-2:])} "
                             f"and crops are the IoU-constrained SSD crops; remove resize / center_crop / "
                             f"random_resized_crop")
        recipe.data._defaults = {k: "default: the detector's own rule" for k in TRANSFORMS if k not in given}
        return None
    if len(recipe.model.input_shape) != 3:
        return None
    shape, (_, h, w) = list(recipe.model.input_shape), recipe.model.input_shape
    filled, defaults, wrong = {}, {}, []
    for key in TRANSFORMS:
        spec = getattr(recipe.data, key)
        size = spec.out_size()
        if size is not None and size != (h, w):
            wrong.append((key, f"data.{key} makes {size[0]}x{size[1]} images ({spec.sizes()})"))
        elif size is None:
            whole = key not in given  # else a transform without a size: it gets the size only
            flip = whole and key == "train_transform"
            one_view = flip and recipe.train.cache_features == "on" and recipe.train.cache_views == 0
            filled[key] = spec.model_copy(update={"resize": h if h == w else (h, w),
                                                  "flip": spec.flip or (flip and not one_view)})
            defaults[key] = (f"{'default' if whole else 'size'} from model.input_shape {shape}"
                             + (", no flip: train.cache_features: on caches one view" if one_view else ""))
    declared = file_normalize(recipe.model.source) if not wrong else None
    for key in TRANSFORMS:  # normalization the model file declares, where the recipe gives none
        spec = filled.get(key, getattr(recipe.data, key))
        if declared and (key not in given or "normalize" not in getattr(recipe.data, key).model_fields_set):
            filled[key] = spec.model_copy(update={"normalize": declared[0]})
            defaults[key] = ", ".join(filter(None, [defaults.get(key), f"normalize from {declared[1]}"]))
        elif declared is False and key in defaults and spec.normalize == "imagenet":
            defaults[key] += ", normalize ImageNet default (the model file declares none)"
    hint = hwc_hint(tuple(shape))
    if wrong and hint:  # the transforms do not fit because the channels came last
        raise PydanticCustomError("input_shape_hwc", f"model.input_shape {','.join(map(str, shape))}:{hint} Give "
                                  f"model.input_shape as C,H,W", {"keys": [("model", "input_shape")]})
    if wrong:
        size = h if h == w else f"[{h}, {w}]"
        fix = (f"Give {' and '.join(f'data.{k}' for k, _ in wrong)} the size {size} (resize: {size}; or "
               f"resize: N >= {min(h, w)} with center_crop: {size}), "
               f"or leave the sizes out to get the default ("
               + (f"shorter side to {h}" if h == w else f"scaled to cover {h}x{w}") +
               f", centre crop {h}x{w}), or change model.input_shape to the size the transform makes")
        raise PydanticCustomError(
            "transform_size", f"{'; '.join(text for _, text in wrong)}, but model.input_shape {shape} takes "
            f"{h}x{w} images "
            f"(H x W), the one size the model is built for (hybridized with static shapes, a frozen prefix "
            f"run by onnxruntime, the exported ONNX). {fix}",
            {"keys": [("model", "input_shape"), *(("data", k) for k, _ in wrong)]})
    if filled:
        data = recipe.data.model_copy(update=filled)
        data._defaults = defaults
        data._given = {k: getattr(recipe.data, k) if k in given else None for k in filled}
        return data
    return None
