"""Pixel accuracy and mIoU over a confusion matrix, as GluonCV's ``SegmentationMetric``.

GluonCV (``gluoncv/utils/metrics/segmentation.py``) shifts labels by +1 so its ignore value -1
becomes 0 and drops it, zeroes predictions at ignored pixels, and histograms the rest; it
averages IoU over **all** ``nclass`` classes, a class absent from both labels and predictions
scoring 0 (``0 / (eps + 0)``), and divides by ``np.spacing(1) + total``. This module keeps the
whole confusion matrix instead (so a per-class table and any later metric come from one
state) and reproduces those numbers exactly; :meth:`SegmentationMetric.table` marks the absent
classes so a report can tell "never seen" from "never right".
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .formats import IGNORE

_EPS = np.spacing(1)


class SegmentationMetric:
    """Accumulates ``confusion[label, prediction]`` over the labelled pixels."""

    def __init__(self, num_classes: int, ignore: int = IGNORE) -> None:
        self.num_classes, self.ignore = int(num_classes), ignore
        self.confusion = np.zeros((self.num_classes, self.num_classes), np.int64)

    def update(self, labels: np.ndarray, preds: np.ndarray) -> None:
        """``labels`` (N, H, W) ids; ``preds`` (N, C, H, W) scores (arg-max over C) or (N, H, W) ids."""
        labels, preds = np.asarray(labels), np.asarray(preds)
        if preds.ndim == labels.ndim + 1:
            preds = preds.argmax(1)
        if preds.shape != labels.shape:
            raise ValueError(f"predictions {preds.shape} and labels {labels.shape} differ in shape")
        labels, preds = labels.astype(np.int64).ravel(), preds.astype(np.int64).ravel()
        keep = labels != self.ignore
        labels, preds = labels[keep], preds[keep]
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"labels outside 0..{self.num_classes - 1} that are not the ignore label {self.ignore}")
        n = self.num_classes
        self.confusion += np.bincount(labels * n + preds, minlength=n * n).reshape(n, n)

    def iou(self) -> np.ndarray:
        """Per-class IoU; 0 for a class absent from labels and predictions (GluonCV's convention)."""
        inter = np.diag(self.confusion)
        union = self.confusion.sum(0) + self.confusion.sum(1) - inter
        return 1.0 * inter / (_EPS + union)

    def get(self) -> tuple[float, float]:
        """(pixel accuracy, mIoU), as GluonCV's ``SegmentationMetric.get``."""
        correct, labelled = np.diag(self.confusion).sum(), self.confusion.sum()
        return float(1.0 * correct / (_EPS + labelled)), float(self.iou().mean())

    def table(self, classes: list[str]) -> list[tuple[str, float | None, int]]:
        """(class, IoU or None when the class is in neither labels nor predictions, labelled pixels)."""
        present = (self.confusion.sum(0) + self.confusion.sum(1)) > 0
        return [(name, float(v) if p else None, int(px))
                for name, v, p, px in zip(classes, self.iou(), present, self.confusion.sum(1))]

    def reset(self) -> None:
        self.confusion[:] = 0


def int8_metric(num_classes: int, ignore: int = IGNORE):
    """The int8 verifier's judge for a segmenter's ONNX export, fed its ``mask`` output alone: mIoU
    of the float and the int8 file's masks on the same images against their labels (``(H, W)`` ids
    each), ``drop`` in points, and how many labelled pixels the two masks agree on."""
    def metric(float_out: list[np.ndarray], int8_out: list[np.ndarray], labels: Sequence[np.ndarray]
               ) -> dict[str, Any]:
        y = np.stack([np.asarray(m) for m in labels])
        scores = []
        for masks in (float_out[0], int8_out[0]):
            m = SegmentationMetric(num_classes, ignore)
            m.update(y, np.asarray(masks).reshape(y.shape))
            scores.append(m.get()[1])
        labelled = y != ignore
        agree = float(np.mean(float_out[0].reshape(y.shape)[labelled] == int8_out[0].reshape(y.shape)[labelled]))
        change = 100 * (scores[1] - scores[0])
        return {"metric": "mIoU", "images": len(y), "float": scores[0], "int8": scores[1], "drop": -change,
                "agreement": agree,
                "summary": f"mIoU {100 * scores[0]:.2f} float, {100 * scores[1]:.2f} int8 ({change:+.2f} points), "
                           f"{100 * agree:.2f} % of labelled pixels agree on {len(y)} validation images"}
    return metric
