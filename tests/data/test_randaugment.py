"""RandAugment / TrivialAugmentWide ops against PIL's own (ImageOps, ImageEnhance, Image.transform and
Image.rotate) on the same image: byte for byte, except bilinear resampling (within 1 level, see
``_close``); the magnitude maps against timm's and torchvision's
formulas worked by hand; the recipe keys' bounds."""
import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

from gluontl.data import randaugment as ra
from gluontl.data.transforms import build, sample_rng
from gluontl.recipe import RandAugmentSpec, TransformSpec
from pydantic import ValidationError

FILL = (128, 100, 7)


def _image(h=41, w=57, seed=1) -> np.ndarray:
    """Gradients plus noise: every level present, edges for the filters, no flat regions."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([(xx * 3 + yy) % 256, (yy * 4) % 256, ((xx + yy) * 2) % 256], -1) * 0.6
    return np.clip(img + rng.normal(0, 20, img.shape) + 40, 0, 255).astype(np.uint8)


IMG = _image()
PIL_IMG = Image.fromarray(IMG)


def _same(mine: np.ndarray, ref: Image.Image) -> None:
    ref = np.asarray(ref)
    assert mine.dtype == np.uint8 and mine.shape == ref.shape
    np.testing.assert_array_equal(mine, ref)


def _close(mine: np.ndarray, ref: Image.Image) -> None:
    """Bilinear: PIL truncates a float64 interpolant, so where the exact value is an integer to within
    an ulp (here 62.99999999999999 against PIL's 63, from how its compiled C rounds or fuses the same
    products), the last bit decides the level. The bound: every uncovered pixel takes the fill in both,
    no value differs by more than 1, and at most 1 in 1,000 differ at all."""
    ref = np.asarray(ref)
    assert mine.dtype == np.uint8 and mine.shape == ref.shape
    diff = np.abs(mine.astype(int) - ref.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3, (diff.max(), (diff > 0).sum())


def test_lookup_table_ops_equal_pil():
    _same(ra.invert(IMG), ImageOps.invert(PIL_IMG))
    _same(ra.auto_contrast(IMG), ImageOps.autocontrast(PIL_IMG))
    _same(ra.equalize(IMG), ImageOps.equalize(PIL_IMG))
    for bits in range(1, 9):
        _same(ra.posterize(IMG, bits), ImageOps.posterize(PIL_IMG, bits))
    assert not ra.posterize(IMG, 0).any()  # timm's level 0 keeps no bit (Pillow 13 refuses bits=0)
    for thresh in (0, 77, 128, 230, 256):
        _same(ra.solarize(IMG, thresh), ImageOps.solarize(PIL_IMG, thresh))
    for add in (0, 37, 110):  # timm's SolarizeAdd is a PIL point table: below 128, + add capped at 255
        _same(ra.solarize_add(IMG, add), PIL_IMG.point([min(255, i + add) if i < 128 else i for i in range(256)] * 3))
    _same(ra.gray(IMG), PIL_IMG.convert("L"))


def test_lookup_ops_on_a_flat_channel_are_pil_identities():
    flat = IMG.copy()
    flat[..., 1] = 77  # one level only: autocontrast and equalize leave the channel alone
    _same(ra.auto_contrast(flat), ImageOps.autocontrast(Image.fromarray(flat)))
    _same(ra.equalize(flat), ImageOps.equalize(Image.fromarray(flat)))


@pytest.mark.parametrize("factor", [0.0, 0.1, 0.5, 1.0, 1.3, 1.72, 1.9, 1.99])
def test_enhance_ops_equal_pil(factor):
    _same(ra.color(IMG, factor), ImageEnhance.Color(PIL_IMG).enhance(factor))
    _same(ra.contrast(IMG, factor), ImageEnhance.Contrast(PIL_IMG).enhance(factor))
    _same(ra.brightness(IMG, factor), ImageEnhance.Brightness(PIL_IMG).enhance(factor))
    _same(ra.sharpness(IMG, factor), ImageEnhance.Sharpness(PIL_IMG).enhance(factor))


def _pil_affine(matrix, nearest):
    return PIL_IMG.transform(PIL_IMG.size, Image.AFFINE, matrix, resample=Image.NEAREST if nearest else Image.BILINEAR,
                             fillcolor=FILL)


@pytest.mark.parametrize("nearest", [False, True])
def test_geometric_ops_equal_pil(nearest):
    resample = Image.NEAREST if nearest else Image.BILINEAR
    same = _same if nearest else _close
    for degrees in (0.0, 13.5, -27.0, 30.0, 90.0, -134.9):
        same(ra.rotate(IMG, degrees, FILL, nearest), PIL_IMG.rotate(degrees, resample=resample, fillcolor=FILL))
    for factor in (0.3, -0.17, 0.99, -0.99):
        same(ra.shear_x(IMG, factor, FILL, nearest), _pil_affine((1, factor, 0, 0, 1, 0), nearest))
        same(ra.shear_y(IMG, factor, FILL, nearest), _pil_affine((1, 0, 0, factor, 1, 0), nearest))
    for pixels in (10.3, -20.0, 7.0, 0.45 * IMG.shape[1], -32.0):
        same(ra.translate_x(IMG, pixels, FILL, nearest), _pil_affine((1, 0, pixels, 0, 1, 0), nearest))
        same(ra.translate_y(IMG, pixels, FILL, nearest), _pil_affine((1, 0, 0, 0, 1, pixels), nearest))


class _Sign:
    """A stand-in generator whose one draw (timm's ``_randomly_negate``) is fixed: > 0.5 negates."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize("m", [0.0, 4.5, 9.0, 10.0])
def test_rand_augment_magnitudes_are_timms(m):
    """timm's level -> argument maps at magnitude m (of 10), by hand, through PIL."""
    op = ra.RAND_OPS
    keep, flip = _Sign(0.0), _Sign(1.0)
    _close(op["Rotate"](IMG, m, keep, FILL), PIL_IMG.rotate(m / 10 * 30, resample=Image.BILINEAR, fillcolor=FILL))
    _close(op["Rotate"](IMG, m, flip, FILL), PIL_IMG.rotate(-m / 10 * 30, resample=Image.BILINEAR, fillcolor=FILL))
    _close(op["ShearX"](IMG, m, flip, FILL), _pil_affine((1, -m / 10 * 0.3, 0, 0, 1, 0), False))
    _close(op["ShearY"](IMG, m, keep, FILL), _pil_affine((1, 0, 0, m / 10 * 0.3, 1, 0), False))
    _close(op["TranslateXRel"](IMG, m, keep, FILL), _pil_affine((1, 0, m / 10 * 0.45 * IMG.shape[1], 0, 1, 0), False))
    _close(op["TranslateYRel"](IMG, m, flip, FILL), _pil_affine((1, 0, 0, 0, 1, -m / 10 * 0.45 * IMG.shape[0]), False))
    for name, enhance in (("Color", ImageEnhance.Color), ("Contrast", ImageEnhance.Contrast),
                          ("Brightness", ImageEnhance.Brightness), ("Sharpness", ImageEnhance.Sharpness)):
        _same(op[name](IMG, m, keep, FILL), enhance(PIL_IMG).enhance(m / 10 * 1.8 + 0.1))
    bits = int(m / 10 * 4)  # 0, 1, 3, 4
    if bits:
        _same(op["Posterize"](IMG, m, keep, FILL), ImageOps.posterize(PIL_IMG, bits))
    _same(op["Solarize"](IMG, m, keep, FILL), ImageOps.solarize(PIL_IMG, int(m / 10 * 256)))
    add = int(m / 10 * 110)
    _same(op["SolarizeAdd"](IMG, m, keep, FILL), PIL_IMG.point([min(255, i + add) if i < 128 else i
                                                                for i in range(256)] * 3))
    assert sorted(op) == sorted(["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                                 "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
                                 "TranslateXRel", "TranslateYRel"])  # timm's _RAND_TRANSFORMS


def test_trivial_augment_wide_ops_are_torchvisions():
    """torchvision's 31-bin magnitudes (bin 30 and 10 by hand) through PIL, nearest resampling."""
    _same(ra.wide_op(IMG, "Identity", 0.0, FILL), PIL_IMG)
    _same(ra.wide_op(IMG, "ShearX", -0.99, FILL), _pil_affine((1, -0.99, 0, 0, 1, 0), True))
    _same(ra.wide_op(IMG, "TranslateY", 32.0 / 3, FILL), _pil_affine((1, 0, 0, 0, 1, 10), True))  # int() pixels
    _same(ra.wide_op(IMG, "Rotate", 135.0, FILL), PIL_IMG.rotate(135.0, resample=Image.NEAREST, fillcolor=FILL))
    _same(ra.wide_op(IMG, "Contrast", -0.33, FILL), ImageEnhance.Contrast(PIL_IMG).enhance(0.67))
    _same(ra.wide_op(IMG, "Sharpness", 0.99, FILL), ImageEnhance.Sharpness(PIL_IMG).enhance(1.99))
    mags = {name: m for name, (m, _) in ra._WIDE.items()}
    assert mags["Posterize"][0] == 8 and mags["Posterize"][30] == 2 and mags["Posterize"][10] == 6
    assert mags["Solarize"][30] == 0.0 and mags["Rotate"][30] == 135.0 and mags["TranslateX"][10] == pytest.approx(32 / 3)
    _same(ra.wide_op(IMG, "Posterize", 6, FILL), ImageOps.posterize(PIL_IMG, 6))
    _same(ra.wide_op(IMG, "Solarize", 170.0, FILL), ImageOps.solarize(PIL_IMG, 170.0))


def test_rand_augment_draws_are_seeded_and_vary():
    spec = RandAugmentSpec(n=3, m=9, mstd=0.5, p=1.0)
    a = ra.rand_augment(IMG, spec, np.random.default_rng(5), FILL)
    np.testing.assert_array_equal(a, ra.rand_augment(IMG, spec, np.random.default_rng(5), FILL))
    # p = 0: no op applies whatever is drawn
    np.testing.assert_array_equal(ra.rand_augment(IMG, RandAugmentSpec(n=4, p=0.0), np.random.default_rng(0), FILL), IMG)
    # m = 10 with a wide mstd (clipped to [0, 10]): the draws differ from image to image
    seen = set()
    for seed in range(40):
        rng = np.random.default_rng(seed)
        out = ra.rand_augment(IMG, RandAugmentSpec(n=1, m=10, mstd=5.0, p=1.0), rng, FILL)
        seen.add(out.tobytes())
    assert len(seen) > 10


def test_transform_applies_them_per_sample_and_views_are_reproducible():
    spec = TransformSpec(resize=32, flip=True, randaugment={"n": 2, "m": 9}, random_erasing={"prob": 1.0},
                         normalize="none")
    t = build(spec, train=True)
    assert t.random
    img = _image(40, 48)
    first = [t(img, sample_rng(0, 1, i)) for i in range(6)]
    again = [t(img, sample_rng(0, 1, i)) for i in range(6)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert len({a.tobytes() for a in first}) == 6
    np.testing.assert_array_equal(build(spec, train=False)(img), build(TransformSpec(resize=32, normalize="none"),
                                                                          train=False)(img))  # evaluation: none


def test_random_erasing_is_timms_box():
    x = np.ones((3, 20, 30), np.float32)
    out = ra.random_erasing(x, 1.0, "const", 1, 0.1, 0.1, 1.0, np.random.default_rng(0))
    zero = np.argwhere(out[0] == 0)
    h, w = np.ptp(zero[:, 0]) + 1, np.ptp(zero[:, 1]) + 1
    assert (h, w) == (8, 8) and len(zero) == 64  # aspect 1, area 0.1 x 600 = 60: round(sqrt 60) = 8
    assert (out[:, zero[:, 0], zero[:, 1]] == 0).all() and out.sum() == 3 * (600 - 64)
    np.testing.assert_array_equal(ra.random_erasing(x, 0.0, "pixel", 1, 0.02, 0.3, 0.3, np.random.default_rng(0)), x)


@pytest.mark.parametrize("bad", [{"m": 10.5}, {"m": -1}, {"n": 0}, {"p": 1.5}, {"mstd": -0.1}])
def test_out_of_range_magnitudes_are_refused(bad):
    with pytest.raises(ValidationError):
        TransformSpec(randaugment=bad)
