"""SSD anchors fitted to the feature maps the network makes (``model.anchors: fit``, the default),
against centres and sizes computed by hand; ``anchors: zoo`` keeps GluonCV's."""
import mxnet as mx
import numpy as np
import pytest

from gluontl.detect.models import build_detector
from gluontl.recipe import parse_recipe

SSD = "ssd_300_mobilenet0.25_custom"


def _anchors(size: int, anchors: str = "fit"):
    rec = parse_recipe({"name": "t", "task": "detection",
                        "model": {"source": f"zoo:{SSD}", "input_shape": [3, size, size], "anchors": anchors}})
    net, _ = build_detector(rec, ["a", "b"])
    x = mx.nd.zeros((1, 3, size, size))
    with mx.autograd.train_mode():
        maps = [f.shape[2] for f in net.features(x)]
        anchors = net(x)[2].asnumpy()[0]
    return maps, anchors


@pytest.mark.parametrize("size", [128, 300])
def test_fitted_anchor_centres_tile_each_map_over_the_whole_image(size):
    maps, anchors = _anchors(size)
    per_cell = [4, 6, 6, 6, 4, 4]  # 2 sizes + ratios - 1, as ssd_300_mobilenet0.25 declares them
    start = 0
    base_sizes = [21, 45, 99, 153, 207, 261, 315]  # GluonCV's, in pixels of 300
    for k, (m, n) in enumerate(zip(maps, per_cell)):
        block = anchors[start:start + m * m * n].reshape(m, m, n, 4)
        start += m * m * n
        step = size / m
        want = (np.arange(m) + 0.5) * step
        np.testing.assert_allclose(block[0, :, 0, 0], want, rtol=1e-6)  # cx along a row
        np.testing.assert_allclose(block[:, 0, 0, 1], want, rtol=1e-6)  # cy down a column
        small = base_sizes[k] * size / 300
        np.testing.assert_allclose(block[0, 0, 0, 2:], [small, small], rtol=1e-5)
        big = np.sqrt(base_sizes[k] * base_sizes[k + 1]) * size / 300
        np.testing.assert_allclose(block[0, 0, 1, 2:], [big, big], rtol=1e-5)
    assert start == len(anchors)


def test_zoo_anchors_are_gluoncvs_own():
    """``anchors: zoo`` keeps VGG-SSD's steps 8, 16, 32 on maps of stride 16, 32, 64 (the
    top-left-quarter fact tests/detect/test_models.py pins)."""
    maps, anchors = _anchors(300, "zoo")
    assert maps[0] == 19
    first = anchors[:19 * 19 * 4].reshape(19, 19, 4, 4)
    np.testing.assert_allclose(first[0, :, 0, 0], (np.arange(19) + 0.5) * 8, rtol=1e-6)
