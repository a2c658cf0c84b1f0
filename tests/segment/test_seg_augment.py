"""Joint image + mask augmentation: masks resized nearest at pixel centres (exact rational
reference), image and mask move together through scale, crop, pad and flip, padding is the
ignore label, outputs are multiples of the stride (gluon-cv #1173), seeded per sample."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from gluontl.segment.augment import SegmentationTransform, resize_mask, unpad
from gluontl.data.transforms import IMAGENET_MEAN, IMAGENET_STD, sample_rng

MEAN, STD = np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)
COLOURS = np.array([[250, 10, 10], [10, 250, 10], [10, 10, 250], [240, 240, 20]], np.uint8)


def _nearest_ref(mask, w, h):
    """Output pixel (i, j) takes the input pixel whose half-open span holds its centre."""
    ys = [min(int(Fraction(2 * i + 1, 2) * mask.shape[0] / h), mask.shape[0] - 1) for i in range(h)]
    xs = [min(int(Fraction(2 * j + 1, 2) * mask.shape[1] / w), mask.shape[1] - 1) for j in range(w)]
    return mask[np.ix_(ys, xs)]


def test_resize_mask_is_nearest_at_pixel_centres():
    rng = np.random.default_rng(0)
    for _ in range(60):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 50, 4))
        mask = rng.integers(0, 21, (h, w)).astype(np.uint8)
        np.testing.assert_array_equal(resize_mask(mask, ow, oh), _nearest_ref(mask, ow, oh),
                                      err_msg=f"{h}x{w}->{oh}x{ow}")


def _scene():
    """A 64x80 mask of four blocks and an image painting each class its own colour."""
    mask = np.zeros((64, 80), np.uint8)
    mask[:, 40:] = 1
    mask[32:, :40] = 2
    mask[32:, 40:] = 3
    return COLOURS[mask], mask


def _pixels(x):
    return (x.transpose(1, 2, 0) * STD + MEAN) * 255


@pytest.mark.parametrize("index", range(12))
def test_image_and_mask_move_together(index):
    img, mask = _scene()
    t = SegmentationTransform(True, IMAGENET_MEAN, IMAGENET_STD, crop=48, scale=(0.5, 2.0))
    x, m = t(img, mask, sample_rng(3, 0, index))
    assert x.shape == (3, 48, 48) and m.shape == (48, 48) and x.dtype == np.float32 and m.dtype == np.uint8
    assert set(np.unique(m)) <= {0, 1, 2, 3, 255}  # never an interpolated value
    px = _pixels(x)
    # away from block edges (5x5 neighbourhood of one class) the pixel shows its class's colour
    pad = np.pad(m, 2, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(pad, (5, 5))
    inside = (windows == m[:, :, None, None]).all(axis=(2, 3)) & (m != 255)
    assert inside.sum() > 48 * 48 // 3
    np.testing.assert_allclose(px[inside], COLOURS[m[inside]].astype(np.float32), atol=0.01)
    # padding (crop larger than the scaled image) is 0 after normalizing, ignore in the mask
    np.testing.assert_allclose(x[:, m == 255], 0, atol=1e-6)


def test_flip_moves_both():
    img, mask = _scene()
    t = SegmentationTransform(True, IMAGENET_MEAN, IMAGENET_STD, crop=(64, 80), scale=(1.0, 1.0))
    seen = set()
    for index in range(16):
        x, m = t(img, mask, sample_rng(0, 0, index))
        flipped = bool(m[0, 0] == 1)
        np.testing.assert_array_equal(m, mask[:, ::-1] if flipped else mask)
        np.testing.assert_allclose(_pixels(x), (img[:, ::-1] if flipped else img).astype(np.float32), atol=0.01)
        seen.add(flipped)
    assert seen == {True, False}


def test_crop_larger_than_the_image_pads_mask_with_ignore():
    img, mask = _scene()
    t = SegmentationTransform(True, IMAGENET_MEAN, IMAGENET_STD, crop=100, scale=(0.5, 0.5), flip=False)
    x, m = t(img, mask, sample_rng(0, 0, 0))
    assert m.shape == (100, 100)
    np.testing.assert_array_equal(m[:32, :40], resize_mask(mask, 40, 32))
    assert (m[32:] == 255).all() and (m[:, 40:] == 255).all()
    assert not x[:, 32:].any() and not x[:, :, 40:].any()


def test_same_sample_same_augmentation_other_epoch_other():
    img, mask = _scene()
    t = SegmentationTransform(True, IMAGENET_MEAN, IMAGENET_STD, crop=40)
    a, b = t(img, mask, sample_rng(9, 2, 5)), t(img, mask, sample_rng(9, 2, 5))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    others = [t(img, mask, sample_rng(9, e, 5))[1] for e in range(3, 7)]
    assert any(not np.array_equal(a[1], o) for o in others)
    with pytest.raises(ValueError, match="sample_rng"):
        t(img, mask)


def test_sizes_that_are_not_multiples_of_the_stride_are_padded_with_ignore():
    """gluon-cv #1173: a 100 px crop for a stride-8 network; outputs are padded to 104, the pad
    ignored by loss and metric, and ``unpad`` gives the prediction back at the image's size."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (100, 60, 3), dtype=np.uint8)
    mask = rng.integers(0, 3, (100, 60)).astype(np.uint8)
    x, m = SegmentationTransform(False, IMAGENET_MEAN, IMAGENET_STD, stride=8)(img, mask)
    assert x.shape == (3, 104, 64) and m.shape == (104, 64)
    np.testing.assert_array_equal(unpad(m, mask.shape), mask)
    np.testing.assert_allclose(_pixels(unpad(x, mask.shape)), img.astype(np.float32), atol=0.01)
    assert (m[100:] == 255).all() and (m[:, 60:] == 255).all() and not x[:, 100:].any()
    t = SegmentationTransform(True, IMAGENET_MEAN, IMAGENET_STD, crop=(50, 36), stride=8)
    x, m = t(img, mask, sample_rng(0, 0, 0))
    assert x.shape == (3, 56, 40) and (m[50:] == 255).all() and (m[:, 36:] == 255).all()


def test_eval_resizes_mask_nearest_to_the_given_size():
    img, mask = _scene()
    x, m = SegmentationTransform(False, IMAGENET_MEAN, IMAGENET_STD, size=(48, 40))(img, mask)
    assert x.shape == (3, 48, 40)
    np.testing.assert_array_equal(m, _nearest_ref(mask, 40, 48))
