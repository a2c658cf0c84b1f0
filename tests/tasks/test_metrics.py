"""Balanced accuracy (mean recall) against hand-computed confusion matrices, and through evaluate_loader."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from gluontl.tasks.classification import balanced_accuracy, evaluate_loader


@pytest.mark.parametrize("conf, want", [
    ([[90, 0], [10, 0]], 0.5),                       # always the majority class: top-1 0.9, balanced 0.5
    ([[3, 1], [1, 5]], (3 / 4 + 5 / 6) / 2),
    ([[2, 0, 0], [0, 0, 0], [1, 0, 1]], (1 + 0.5) / 2),  # a class with no sample does not count
    ([[0, 0], [0, 0]], 0.0),
])
def test_balanced_accuracy_by_hand(conf, want):
    assert balanced_accuracy(np.array(conf)) == pytest.approx(want, abs=1e-12)


class _Fixed(gluon.HybridBlock):
    """Scores are the input itself: the predictions are whatever the test writes."""

    def hybrid_forward(self, F, x):
        return x


def test_evaluate_loader_reports_balanced_accuracy_of_its_confusion():
    scores = np.array([[5, 0], [5, 0], [5, 0], [0, 5], [5, 0], [0, 5]], np.float32)
    labels = np.array([0, 0, 0, 0, 1, 1], np.float32)  # class 0: 3/4 right, class 1: 1/2 right
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(scores, labels), batch_size=4)
    out = evaluate_loader(_Fixed(), loader, [mx.cpu()], 2, gluon.loss.SoftmaxCrossEntropyLoss())
    np.testing.assert_array_equal(out["confusion"], [[3, 1], [1, 1]])
    assert out["val_top1"] == pytest.approx(4 / 6)
    assert out["val_balanced_acc"] == pytest.approx((3 / 4 + 1 / 2) / 2)
