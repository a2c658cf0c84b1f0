"""Random augmentation draws against the distributions the docs state, over many seeded samples."""
import math

import numpy as np
import pytest

from gluontl.detect.augment import DetectionTransform
from gluontl.recipe import TransformSpec
from gluontl.data.transforms import build, sample_rng

N = 2000
GRAY = 100  # brightness x (1 + f) stays below 255: no clipping


def _binomial_bounds(n: int, p: float, z: float = 5.0) -> tuple[float, float]:
    """n·p ± z standard deviations (z = 5: a fixed-seed test that a fair draw fails about once in 10^6)."""
    sd = math.sqrt(n * p * (1 - p))
    return n * p - z * sd, n * p + z * sd


def _brightness_factors(f: float) -> np.ndarray:
    """The colour-jitter factor each sample's image was scaled by. A uniform gray image makes
    contrast (towards the mean) and saturation (towards each pixel's luma) identities, so only the
    brightness factor shows: output = GRAY x factor."""
    t = build(TransformSpec(color_jitter=f, normalize="none"), train=True)
    img = np.full((4, 4, 3), GRAY, np.uint8)
    return np.array([t(img, sample_rng(7, 0, i))[0, 0, 0] * 255 / GRAY for i in range(N)])


@pytest.mark.parametrize("f", [0.2, 0.5])
def test_colour_jitter_factors_are_uniform_on_both_sides_of_one(f):
    factors = _brightness_factors(f)
    assert factors.min() >= 1 - f - 1e-4 and factors.max() <= 1 + f + 1e-4
    lo, hi = _binomial_bounds(N, 0.5)
    assert lo <= int(np.sum(factors > 1)) <= hi  # as often brighter as darker
    # uniform on [1 - f, 1 + f]: each tenth of the range holds N / 10 draws
    counts, _ = np.histogram(factors, bins=10, range=(1 - f, 1 + f))
    lo, hi = _binomial_bounds(N, 0.1)
    assert all(lo <= c <= hi for c in counts), counts
    # and the range is covered: draws within 2 % of f of both ends
    assert factors.min() < 1 - 0.98 * f and factors.max() > 1 + 0.98 * f


RAMP = np.repeat(np.repeat(np.arange(8, dtype=np.uint8)[None, :, None] * 30, 8, axis=0), 3, axis=2)  # left to right


def _flipped(run, n: int) -> int:
    """How many of ``n`` seeded samples ``run(img, rng) -> CHW`` returned mirrored."""
    return sum(bool(x[0, 0, 0] > x[0, 0, -1]) for x in (run(RAMP, sample_rng(3, 0, i)) for i in range(n)))


def test_flip_happens_half_the_time():
    lo, hi = _binomial_bounds(N, 0.5)
    assert lo <= _flipped(build(TransformSpec(flip=True, normalize="none"), train=True), N) <= hi
    assert _flipped(build(TransformSpec(normalize="none"), train=True), 50) == 0
    assert _flipped(build(TransformSpec(flip=True, normalize="none"), train=False), 50) == 0  # evaluation


def test_detection_flip_happens_half_the_time():
    t = DetectionTransform(TransformSpec(flip=True, normalize="none"), (8, 8), True, crop=False)
    lo, hi = _binomial_bounds(N, 0.5)
    assert lo <= _flipped(lambda img, rng: t(img, np.zeros((0, 6), np.float32), rng)[0], N) <= hi
