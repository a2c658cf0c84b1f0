"""Pixel accuracy and mIoU: a hand-computed 3x3 example, and GluonCV's SegmentationMetric fed
the same batches (GluonCV's ignore value is -1; gluontl's 255 is mapped to it)."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from gluoncv.utils.metrics.segmentation import SegmentationMetric as GluonCVMetric

from gluontl.segment.metrics import SegmentationMetric


def test_hand_computed_3x3():
    label = np.array([[[0, 0, 1], [1, 1, 2], [2, 255, 255]]])
    pred = np.array([[[0, 1, 1], [1, 2, 2], [0, 2, 1]]])
    m = SegmentationMetric(4)
    m.update(label, pred)
    # 7 labelled pixels (label, pred): (0,0) (0,1) (1,1) (1,1) (1,2) (2,2) (2,0); 4 right
    # class 0: inter 1, label 2 + pred 2 - 1 = 3 -> 1/3; class 1: inter 2, 3 + 3 - 2 = 4 -> 1/2
    # class 2: inter 1, 2 + 2 - 1 = 3 -> 1/3; class 3 absent everywhere -> 0 (GluonCV averages it in)
    acc, miou = m.get()
    assert acc == pytest.approx(4 / 7, abs=1e-12)
    np.testing.assert_allclose(m.iou(), [1 / 3, 1 / 2, 1 / 3, 0], atol=1e-12)
    assert miou == pytest.approx((1 / 3 + 1 / 2 + 1 / 3) / 4, abs=1e-12)
    assert m.table(["a", "b", "c", "d"]) == [("a", pytest.approx(1 / 3), 2), ("b", pytest.approx(1 / 2), 3),
                                             ("c", pytest.approx(1 / 3), 2), ("d", None, 0)]
    m.reset()
    assert m.confusion.sum() == 0


def _gluoncv_label(label):
    return np.where(label == 255, -1, label).astype(np.float32)


@pytest.mark.parametrize("nclass", [2, 5, 21])
def test_equals_gluoncv_over_batches(nclass):
    rng = np.random.default_rng(nclass)
    ours, theirs = SegmentationMetric(nclass), GluonCVMetric(nclass)
    for _ in range(4):
        n, h, w = 2, int(rng.integers(5, 30)), int(rng.integers(5, 30))
        label = rng.integers(0, nclass, (n, h, w))
        label[rng.random((n, h, w)) < 0.2] = 255
        label[label == nclass - 1] = 0  # the last class never labelled: absent or only predicted
        logits = rng.normal(size=(n, nclass, h, w)).astype(np.float32)
        logits[:, nclass - 1] -= 1.5 if nclass > 2 else 0  # predicted rarely, for nclass 21 maybe never
        ours.update(label, logits)
        theirs.update(mx.nd.array(_gluoncv_label(label)), mx.nd.array(logits))
    acc, miou = ours.get()
    want_acc, want_miou = theirs.get()
    assert abs(acc - want_acc) <= 1e-9 and abs(miou - want_miou) <= 1e-9
    np.testing.assert_allclose(ours.iou(), 1.0 * theirs.total_inter / (np.spacing(1) + theirs.total_union),
                               rtol=0, atol=1e-12)


def test_equals_gluoncv_with_absent_classes_and_all_ignored_images():
    rng = np.random.default_rng(7)
    label = rng.integers(0, 2, (3, 6, 6))  # classes 2..5 never labelled
    label[1] = 255
    logits = rng.normal(size=(3, 6, 6, 6)).astype(np.float32)
    ours, theirs = SegmentationMetric(6), GluonCVMetric(6)
    ours.update(label, logits)
    theirs.update(mx.nd.array(_gluoncv_label(label)), mx.nd.array(logits))
    assert np.max(np.abs(np.subtract(ours.get(), theirs.get()))) <= 1e-9
    assert ours.confusion.sum() == 2 * 36


def test_labels_outside_the_classes_are_refused():
    with pytest.raises(ValueError, match="outside 0..2"):
        SegmentationMetric(3).update(np.array([[[3]]]), np.array([[[0]]]))
