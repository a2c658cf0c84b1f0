"""The task registry: each task declared once, as data — its code, its recipe section, its metrics,
its data sources and the curves ``plot`` draws.

It sits in the base layer so that everything that needs to know the tasks reads it without
looking up: the recipe schema (``task:``, ``train.select``'s default, ``data.source``, the
section check), the metric registry (which task a built-in metric belongs to) and the task
seam (``gluontl.tasks`` imports ``code`` on demand). A new task is its own module or package
plus one entry in :data:`TASKS`.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    name: str  # the recipe's task:
    code: str  # "module:Class" implementing gluontl.tasks.Task; imported only by gluontl.tasks
    metrics: tuple[str, ...]  # what `best` records and train.select may pick; the first is the default
    sources: tuple[str, ...]  # its data.source forms: a scheme ("folder:") or a whole name ("demo:digits")
    source_help: str  # the forms as an error message lists them
    section: str | None = None  # its own recipe section (a Recipe field of that name); None: no settings
    shown: tuple[str, ...] = ()  # more metrics its epoch rows may have that pick no checkpoint
    curves: tuple[str, ...] = ()  # metrics.jsonl keys plot draws beside loss and lr (labels: gluontl.metrics)
    tta: bool = False  # evaluate/predict --tta average its probabilities over views (gluontl.data.tta)


TASKS: dict[str, TaskEntry] = {t.name: t for t in (
    TaskEntry("classification", "gluontl.tasks.classification:Classification",
              metrics=("val_top1", "val_balanced_acc", "val_loss"),
              sources=("demo:digits", "demo:elpv", "demo:elpv_graded", "folder:", "rec:", "list:"),
              source_help="demo:digits, demo:elpv, demo:elpv_graded, folder:PATH, rec:PATH or list:PATH",
              shown=("val_top5",),  # only with more than 5 classes
              curves=("val_top1", "val_top5", "train_acc"), tta=True),
    TaskEntry("multilabel", "gluontl.tasks.multilabel:MultiLabel",
              metrics=("val_macro_map", "val_micro_map", "val_macro_f1", "val_loss"),
              sources=("demo:elpv_multilabel", "labels:"),
              source_help="demo:elpv_multilabel or labels:PATH (a CSV of image,labels with labels a;b, a JSON "
              "list of {image, labels}, or a folder of one folder per label)",
              section="multilabel", curves=("val_macro_map", "val_micro_map", "val_macro_f1"), tta=True),
    TaskEntry("detection", "gluontl.tasks.detection:Detection",
              metrics=("val_map50", "val_map"), sources=("voc:", "coco:", "yolo:", "demo:digits_det"),
              source_help="voc:PATH, coco:PATH, yolo:PATH or demo:digits_det",
              curves=("val_map50", "val_map")),
    TaskEntry("segmentation", "gluontl.tasks.segmentation:Segmentation",
              metrics=("val_miou", "val_pixel_acc", "val_loss"), sources=("voc:", "masks:", "demo:digits_seg"),
              source_help="demo:digits_seg, masks:PATH or voc:PATH (JPEGImages/, SegmentationClass/, "
              "ImageSets/Segmentation/)",
              section="segmentation", curves=("val_miou", "val_pixel_acc")),
)}


def metric_tasks(key: str) -> tuple[str, ...]:
    """The tasks whose rows have metric ``key`` (as a built-in metric's ``task``)."""
    return tuple(name for name, t in TASKS.items() if key in t.metrics or key in t.shown)


def source_tasks(source: str) -> list[str]:
    """The tasks whose data ``source`` is (``voc:`` serves detection and segmentation)."""
    return [name for name, t in TASKS.items()
            if any(source == f or (f.endswith(":") and source.startswith(f)) for f in t.sources)]


__all__ = ["TaskEntry", "TASKS", "metric_tasks", "source_tasks"]
