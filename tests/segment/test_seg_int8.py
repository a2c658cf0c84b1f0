"""The int8 verifier's judge for segmenters: mIoU of each file's masks and their agreement, by hand."""
from __future__ import annotations

import numpy as np
import pytest

from gluontl.segment.metrics import int8_metric


def test_int8_metric_is_the_miou_change_over_labelled_pixels():
    labels = [np.array([[0, 0], [1, 1]]), np.array([[255, 0], [1, 1]])]
    float_masks = np.array([[[0, 0], [1, 1]], [[0, 0], [1, 1]]])
    int8_masks = np.array([[[0, 0], [0, 1]], [[1, 0], [1, 1]]])  # one labelled pixel wrong, one ignored differs
    r = int8_metric(2)([float_masks], [int8_masks], labels)  # fed the mask output alone
    # float: every labelled pixel right.  int8: class 0 predicted on 4 labelled pixels, 3 of them class 0
    # (IoU 3/(4+3-3)); class 1 predicted on 3 of its 4 pixels (IoU 3/(3+4-3)); mIoU 0.75
    assert r["float"] == pytest.approx(1.0) and r["int8"] == pytest.approx(0.75)
    assert r["drop"] == pytest.approx(25.0) and r["agreement"] == pytest.approx(6 / 7)
    assert r["metric"] == "mIoU" and r["images"] == 2 and "+" not in r["summary"].split("(")[1][:1]
