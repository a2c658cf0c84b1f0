"""Per-pixel softmax cross-entropy with an ignore label, optional class weights and an optional
auxiliary head.

GluonCV's ``MixSoftmaxCrossEntropyLoss`` returns ``loss(pred) + aux_weight * loss(aux_pred)``;
each term there is ``SoftmaxOutput`` with ``normalization='valid'``, whose *gradient* averages
over the labelled pixels while its reported *value* averages over all pixels (ignored ones
counting 0). Here value and gradient agree: each image's loss is the mean over its labelled
pixels, equal to GluonCV's value times ``H*W / labelled``. An image with no labelled pixel
(all ignore) has loss 0 and zero gradient, not 0/0 = NaN.

With class weights ``w`` the mean is weighted: ``sum(w[y] * nll) / sum(w[y])`` over an image's
labelled pixels (PyTorch's ``CrossEntropyLoss(weight=...)`` per image), so rare classes are not
drowned by the background that mIoU weighs no more than any digit.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from mxnet.gluon import HybridBlock

from .formats import IGNORE


class SegmentationLoss(HybridBlock):
    """``loss(pred, label)`` or, with ``aux_weight``, ``loss(pred, aux_pred, label)`` -> (N,).

    ``pred`` and ``aux_pred`` are (N, C, H, W) logits at the label's size, ``label`` (N, H, W) ids.
    """

    def __init__(self, aux_weight: float | None = None, ignore: int = IGNORE,
                 class_weights: Sequence[float] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.aux_weight, self.ignore = aux_weight, ignore
        self.class_weights = None if class_weights is None else tuple(float(w) for w in class_weights)

    def _pixel_weights(self, F, label, valid):
        """Each pixel's weight: its class's (Python floats, so the block hybridizes without a
        parameter), 0 where ignored."""
        if self.class_weights is None:
            return valid
        return sum(((label == c) * w for c, w in enumerate(self.class_weights) if w), valid * 0) * valid

    def _one(self, F, pred, label):
        valid = label != self.ignore
        ids = F.where(valid, label, F.zeros_like(label))
        weight = self._pixel_weights(F, label, valid)
        nll = -F.pick(F.log_softmax(pred, axis=1), ids, axis=1) * weight
        total = F.sum(weight, axis=0, exclude=True)
        return F.sum(nll, axis=0, exclude=True) / F.where(total > 0, total, F.ones_like(total))

    def hybrid_forward(self, F, pred, *rest):
        if self.aux_weight is None:
            (label,) = rest
            return self._one(F, pred, label)
        aux, label = rest
        return self._one(F, pred, label) + self.aux_weight * self._one(F, aux, label)


def median_frequency_weights(pixels: np.ndarray) -> np.ndarray:
    """SegNet's median-frequency balancing (Eigen & Fergus): ``w_c = median(f) / f_c`` with
    ``f_c`` = class c's pixels / all labelled pixels of the images that hold c.

    ``pixels`` is (images, classes) labelled-pixel counts. A class no image holds gets weight 0
    (no pixel would carry it anyway) and stays out of the median.
    """
    pixels = np.asarray(pixels, dtype=np.float64)
    holds = pixels > 0
    freq = np.zeros(pixels.shape[1])
    seen = holds.any(0)
    freq[seen] = pixels.sum(0)[seen] / (holds * pixels.sum(1, keepdims=True)).sum(0)[seen]
    weights = np.zeros_like(freq)
    weights[seen] = np.median(freq[seen]) / freq[seen]
    return weights
