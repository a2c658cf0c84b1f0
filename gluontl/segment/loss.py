"""Per-pixel softmax cross-entropy with an ignore label and an optional auxiliary head.

GluonCV's ``MixSoftmaxCrossEntropyLoss`` returns ``loss(pred) + aux_weight * loss(aux_pred)``;
each term there is ``SoftmaxOutput`` with ``normalization='valid'``, whose *gradient* averages
over the labelled pixels while its reported *value* averages over all pixels (ignored ones
counting 0). Here value and gradient agree: each image's loss is the mean over its labelled
pixels, equal to GluonCV's value times ``H*W / labelled``. An image with no labelled pixel
(all ignore) has loss 0 and zero gradient, not 0/0 = NaN.
"""
from __future__ import annotations

from mxnet.gluon import HybridBlock

from .formats import IGNORE


class SegmentationLoss(HybridBlock):
    """``loss(pred, label)`` or, with ``aux_weight``, ``loss(pred, aux_pred, label)`` -> (N,).

    ``pred`` and ``aux_pred`` are (N, C, H, W) logits at the label's size, ``label`` (N, H, W) ids.
    """

    def __init__(self, aux_weight: float | None = None, ignore: int = IGNORE, **kwargs) -> None:
        super().__init__(**kwargs)
        self.aux_weight, self.ignore = aux_weight, ignore

    def _one(self, F, pred, label):
        valid = label != self.ignore
        ids = F.where(valid, label, F.zeros_like(label))
        nll = -F.pick(F.log_softmax(pred, axis=1), ids, axis=1) * valid
        count = F.sum(valid, axis=0, exclude=True)
        return F.sum(nll, axis=0, exclude=True) / F.maximum(count, F.ones_like(count))

    def hybrid_forward(self, F, pred, *rest):
        if self.aux_weight is None:
            (label,) = rest
            return self._one(F, pred, label)
        aux, label = rest
        return self._one(F, pred, label) + self.aux_weight * self._one(F, aux, label)
