"""Transforms and preprocessing give the same bytes on numpy 1.23 and numpy 2 (NEP 50).

numpy 2 changed scalar promotion (NEP 50): ``np.float32(x) * 0.5`` stays float32 where numpy 1
gave float64, and ``uint8 + 300`` raises. A pipeline touched by that would drift by an ulp or
a rounding step, so each output's SHA-256 is pinned here. The hashes were computed on numpy 1.23.5
(Python 3.11, the numpy every README number was measured on) and this file passes unchanged on
numpy 2.3 (Python 3.13), so both compute the same bytes. OpenCV's resize is part of some steps:
a hash change after an OpenCV upgrade is OpenCV's, not numpy's (tests/test_deploy_preprocess.py
compares gluontl's own resize with OpenCV's).

Small images alone are not enough: numpy's float32 reductions take other code paths on long
arrays, and numpy 2.x rounds ``a.mean()`` of a 224x224 float32 array differently from 1.23 (the
colour jitter's mean luma, issue 31: the ELPV demo's first loss differed in the 3rd digit). So
the demo's own transform runs at its own size here too, and the two helpers that made the
jitter numpy-independent are checked against float64 references.
"""
import hashlib
import math

import numpy as np
import pytest

from gluontl import deploy_preprocess
from gluontl.data.transforms import Preprocess, build, luma, mean_f32, sample_rng
from gluontl.detect.augment import DetectionTransform
from gluontl.recipe import TransformSpec
from gluontl.segment.augment import SegmentationTransform

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _image(h: int = 45, w: int = 61) -> np.ndarray:
    """Noise on gradients: every value 0..255 occurs, and edges clip."""
    rs = np.random.RandomState(50)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) % 256], axis=2)
    return np.clip(base + rs.randint(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _classification_train() -> list[np.ndarray]:
    t = build(TransformSpec(random_resized_crop=24, flip=True, color_jitter=0.4), train=True)
    return [t(_image(), sample_rng(7, epoch, i)) for epoch in (0, 3) for i in range(4)]


def _classification_train_224() -> list[np.ndarray]:
    """recipes/elpv_efficientnet_lite0.yaml's train transform on a 300x300 image, as the demo runs it."""
    spec = TransformSpec(resize=224, flip=True, color_jitter=0.2, normalize=((0.498,) * 3, (0.502,) * 3))
    t = build(spec, train=True)
    return [t(_image(300, 300), sample_rng(0, 0, i)) for i in range(6)]


def _classification_eval() -> list[np.ndarray]:
    spec = TransformSpec(resize=40, center_crop=32, normalize=((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)))
    return [build(spec, train=False)(_image()), Preprocess.from_spec(TransformSpec(resize=19))(_image())]


def _deploy() -> list[np.ndarray]:
    record = deploy_preprocess.make_record("data", (None, 3, 32, 32), (("resize_shorter", 37), ("center_crop", 32)),
                                           *IMAGENET)
    return [deploy_preprocess.preprocess(_image(), record), deploy_preprocess.preprocess(_image()[:, :, 0], record)]


def _segmentation() -> list[np.ndarray]:
    mask = (_image()[:, :, 0] // 64).astype(np.uint8)
    train = SegmentationTransform(True, *IMAGENET, crop=32, stride=8)
    val = SegmentationTransform(False, *IMAGENET, size=(40, 48))
    out = [a for i in range(3) for a in train(_image(), mask, sample_rng(3, 1, i))]
    return out + list(val(_image(), mask))


def _detection() -> list[np.ndarray]:
    labels = np.array([[5, 4, 30, 25, 1, 0], [20, 10, 58, 44, 0, 0]], np.float32)
    spec = TransformSpec(flip=True, color_jitter=0.3)
    train = DetectionTransform(spec, (32, 40), True, expand=2.0)
    out = [a for i in range(4) for a in train(_image(), labels, sample_rng(11, 0, i))]
    return out + list(DetectionTransform(spec, (32, 40), False)(_image(), labels))


# computed on numpy 1.23.5 (Python 3.11), checked on every numpy; classification_train and detection
# changed when the jitter's luma and mean became numpy-independent (issue 31)
GOLDEN = {
    "classification_train": "9588fb0e6b14c1c2",
    "classification_train_224": "de41eb2aded943ce",
    "classification_eval": "d187d82b2dbf0f57",
    "deploy_preprocess": "585f30cb4bbd10ad",
    "segmentation": "faebb3b748f8193a",
    "detection": "b8c5952e53592fce",
}
PIPELINES = {"classification_train": _classification_train, "classification_train_224": _classification_train_224,
             "classification_eval": _classification_eval,
             "deploy_preprocess": _deploy, "segmentation": _segmentation, "detection": _detection}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_bytes_are_the_ones_numpy_1_23_computes(name):
    outputs = PIPELINES[name]()
    assert all(o.dtype in (np.float32, np.uint8) for o in outputs)  # no float64 leaked in by promotion
    assert _digest(*outputs) == GOLDEN[name]


def _pixels() -> np.ndarray:
    """A mirrored 224x224 RGB image: the jitter's input after the demo's flip."""
    return np.round(np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.float32)[:, ::-1]


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def test_luma_rounds_each_float32_step_as_ieee_does():
    img = _pixels()
    # float64 holds a float32 product or sum of these exactly, so rounding it once is IEEE float32
    r, g, b = (img[..., c].astype(np.float64) for c in range(3))
    w = [float(v) for v in np.array([0.299, 0.587, 0.114], np.float32)]
    want = _f32(_f32(_f32(r * w[0]) + _f32(g * w[1])) + _f32(b * w[2])).astype(np.float32)
    got = luma(img)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()


def test_mean_f32_is_the_correctly_rounded_mean_of_a_demo_sized_image():
    values = luma(_pixels())
    exact = np.float32(math.fsum(values.astype(np.float64).ravel().tolist()) / values.size)
    got = mean_f32(values)
    assert type(got) is np.float32 and got == exact
    # float32 values.mean() is 0x1.fd3224p+6 on numpy 1.23.5 and 0x1.fd322p+6 on 2.3.5, one ulp either side:
    # the issue-31 divergence
    assert got == np.float32(float.fromhex("0x1.fd3222p+6"))
