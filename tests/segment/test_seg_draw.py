"""Mask pictures (gluontl.segment.draw): VOC colours written out by hand from the devkit's
bit-spreading rule, the ignore label white, overlays blended per pixel (background untouched), a
mask of the network's size resized nearest onto the image."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gluontl.segment.draw import colour_mask, overlay

# VOC devkit colours: 0 background, 1 aeroplane, 2 bicycle, 3 bird, 15 person
VOC = {0: (0, 0, 0), 1: (128, 0, 0), 2: (0, 128, 0), 3: (128, 128, 0), 15: (192, 128, 128)}


def test_colour_mask_uses_voc_colours_and_white_for_ignore():
    mask = np.array([[0, 1, 2], [3, 15, 255]], np.uint8)
    got = np.asarray(colour_mask(mask))
    assert got.shape == (2, 3, 3) and got.dtype == np.uint8
    for (i, j), v in np.ndenumerate(mask):
        assert tuple(got[i, j]) == (VOC[int(v)] if v != 255 else (255, 255, 255))
    assert tuple(np.asarray(colour_mask(mask, ignore=15))[1, 1]) == (255, 255, 255)


def test_overlay_blends_classes_and_leaves_background():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    mask = np.zeros((4, 5), np.int64)
    mask[1:3, 2:4] = 1
    mask[0, 0] = 255
    got = np.asarray(overlay(image, mask, alpha=0.25))
    for (i, j), v in np.ndenumerate(mask):
        if v == 0:
            assert np.array_equal(got[i, j], image[i, j])
        else:
            colour = np.array((255, 255, 255) if v == 255 else VOC[1], np.float64)
            assert np.array_equal(got[i, j], np.rint(0.75 * image[i, j] + 0.25 * colour).astype(np.uint8))
    tinted = np.asarray(overlay(Image.fromarray(image), mask, alpha=1.0, background=None))
    assert np.array_equal(tinted, np.asarray(colour_mask(mask.astype(np.uint8))))


def test_a_mask_of_another_size_is_resized_nearest_to_the_image():
    image = np.full((4, 6, 3), 200, np.uint8)
    small = np.array([[0, 1], [2, 0]], np.uint8)  # each value covers a 2 x 3 block of the image
    got = np.asarray(overlay(image, small, alpha=1.0, background=None))
    want = np.asarray(colour_mask(np.kron(small, np.ones((2, 3), np.uint8))))
    assert np.array_equal(got, want)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="class ids"):
        colour_mask(np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match="class ids"):
        colour_mask(np.full((2, 2), 300))
    with pytest.raises(ValueError, match="alpha"):
        overlay(np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2), np.uint8), alpha=1.5)
    with pytest.raises(ValueError, match="RGB"):
        overlay(np.zeros((2, 2), np.uint8), np.zeros((2, 2), np.uint8))
