"""Classification's loss for imbalanced classes (``train.loss``): focal loss and class weights.

Per image, with ``p = softmax(logits)``, target ``t`` (one-hot, or label-smoothed:
``(1 - eps) one_hot + eps / K``) and true class ``y``::

    loss = w[y] * sum_k t_k (1 - p_k)^gamma (-log p_k)

``gamma = 0`` is cross-entropy; ``gamma > 0`` is Lin et al.'s focal loss (2017, "Focal Loss for
Dense Object Detection"; their ``alpha_t`` is ``w[y]``), which scales down images the model
already gets right; ``w`` is ``train.loss.class_weights`` (1 when none). Gradients come from
MXNet's autograd through ``log_softmax``. Plain cross-entropy without weights never comes here:
it stays Gluon's ``SoftmaxCrossEntropyLoss`` (tasks/classification.py), so runs without
``train.loss`` compute what they always did.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

_TINY = 1e-12  # 1 - p is clipped here when 0 < gamma < 1: d/dp (1 - p)^gamma is infinite at p = 1


class ClassLoss:
    """``loss(logits, labels)`` -> per-image loss (shape ``(N,)``), as Gluon's losses return it."""

    def __init__(self, num_classes: int, *, gamma: float = 0.0, weights: np.ndarray | None = None,
                 label_smoothing: float = 0.0) -> None:
        self.num_classes, self.gamma, self.eps = num_classes, float(gamma), float(label_smoothing)
        self.weights = None if weights is None else np.asarray(weights, np.float32)

    def __call__(self, out: mx.nd.NDArray, label: mx.nd.NDArray) -> mx.nd.NDArray:
        logp = mx.nd.log_softmax(out, axis=-1)
        target = mx.nd.one_hot(label.as_in_context(out.context), self.num_classes)
        if self.eps:
            target = target * (1 - self.eps) + self.eps / self.num_classes
        term = -logp * target
        if self.gamma:
            rest = 1 - mx.nd.exp(logp)
            if self.gamma < 1:
                rest = mx.nd.maximum(rest, _TINY)
            term = term * rest ** self.gamma
        loss = term.sum(axis=-1)
        if self.weights is not None:
            w = mx.nd.array(self.weights, ctx=out.context)
            loss = loss * mx.nd.take(w, label.as_in_context(out.context))
        return loss



def imbalance_loss(recipe, num_classes: int, loaders=None) -> ClassLoss | None:
    """``train.loss`` as a :class:`ClassLoss`; None when it is plain cross-entropy (Gluon's own then).
    ``class_weights: balanced`` counts the classes of ``loaders``' train split."""
    from ..data.balance import loss_class_weights
    from ..mxinternals import loader_dataset

    spec = recipe.train.loss
    if spec.kind == "cross_entropy" and spec.class_weights == "none":
        return None
    counts, names = np.zeros(num_classes, np.int64), [str(i) for i in range(num_classes)]
    if loaders is not None and loaders.train is not None:
        labels = np.asarray(loader_dataset(loaders.train).labels).astype(np.int64)
        counts, names = np.bincount(labels, minlength=num_classes), list(loaders.class_names)
    elif spec.class_weights == "balanced":
        return None  # no train split to count (evaluate's loss): plain cross-entropy
    where = f"the train split '{recipe.data.train}' of {recipe.data.source}" if recipe.data is not None else "the data"
    weights = loss_class_weights(spec.class_weights, counts, names, where)
    return ClassLoss(num_classes, gamma=spec.gamma if spec.kind == "focal" else 0.0, weights=weights,
                     label_smoothing=recipe.train.label_smoothing)


__all__ = ["ClassLoss", "imbalance_loss"]
