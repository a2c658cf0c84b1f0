"""RandAugment (timm's ``rand-mM-nN-mstdS``) and TrivialAugmentWide (torchvision's), on HWC uint8 RGB arrays.

The ops are numpy reimplementations of the PIL calls timm and torchvision make (ImageOps,
ImageEnhance, ``Image.transform``), so they draw from the per-sample generator the loader hands
every transform (``transforms.sample_rng(seed, epoch, index)``) instead of Python's global
``random``, and need no PIL round trip. Tests hold each op to PIL's own on the same
image, byte for byte but for the last bit of bilinear resampling (tests/data/test_randaugment.py).

Magnitudes follow timm: ``m`` on a 0..10 scale (``_LEVEL_DENOM``), per op jittered by a normal of
std ``mstd`` (> 100: uniform in [0, m]) and clipped to [0, 10]; signed ops are negated with
probability 1/2. TrivialAugmentWide draws one op of 14 and one of 31 magnitude bins uniformly.
Geometric ops fill uncovered pixels with the normalisation mean (timm's ``img_mean``); RandAugment
resamples bilinearly (timm's fixed-``interpolation`` form), TrivialAugmentWide nearest (torchvision's
default).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..recipe import RandAugmentSpec

LEVEL_DENOM = 10.0
Fill = tuple[int, int, int]


# ---------------------------------------------------------------- lookup-table ops (ImageOps)

def _lut(img: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per channel when ``table`` is 3 x 256, else one table for all."""
    if table.ndim == 1:
        return table.astype(np.uint8)[img]
    return np.stack([table[c].astype(np.uint8)[img[..., c]] for c in range(3)], axis=-1)


def invert(img: np.ndarray) -> np.ndarray:
    return 255 - img


def posterize(img: np.ndarray, bits: int) -> np.ndarray:
    """Keep the ``bits`` high bits (8 or more: unchanged, as timm)."""
    if bits >= 8:
        return img
    return img & np.uint8((~(2 ** (8 - bits) - 1)) & 0xFF)


def solarize(img: np.ndarray, thresh: float) -> np.ndarray:
    """Invert every value at or above ``thresh``."""
    return np.where(img < thresh, img, 255 - img).astype(np.uint8)


def solarize_add(img: np.ndarray, add: int, thresh: int = 128) -> np.ndarray:
    i = np.arange(256)
    return _lut(img, np.where(i < thresh, np.minimum(255, i + add), i))


def auto_contrast(img: np.ndarray) -> np.ndarray:
    """Each channel's present range stretched to 0..255 (ImageOps.autocontrast, no cutoff)."""
    tables = []
    for c in range(3):
        present = np.flatnonzero(np.bincount(img[..., c].ravel(), minlength=256))
        lo, hi = int(present[0]), int(present[-1])
        if hi <= lo:
            tables.append(np.arange(256))
            continue
        scale = 255.0 / (hi - lo)
        tables.append(np.clip(np.trunc(np.arange(256) * scale + -lo * scale), 0, 255))
    return _lut(img, np.array(tables))


def equalize(img: np.ndarray) -> np.ndarray:
    """Histogram equalisation per channel, PIL's integer steps (ImageOps.equalize)."""
    tables = []
    for c in range(3):
        h = np.bincount(img[..., c].ravel(), minlength=256).astype(np.int64)
        nonzero = h[h > 0]
        step = 0 if len(nonzero) <= 1 else (int(nonzero.sum()) - int(nonzero[-1])) // 255
        if not step:
            tables.append(np.arange(256))
            continue
        n = step // 2 + np.concatenate([[0], np.cumsum(h)[:-1]])
        tables.append(n // step)
    return _lut(img, np.clip(np.array(tables), 0, 255))


# ---------------------------------------------------------------- blend ops (ImageEnhance)

def _blend(degenerate: np.ndarray, img: np.ndarray, factor: float) -> np.ndarray:
    """PIL's Image.blend in its float32 arithmetic: truncated, clipped when extrapolating."""
    a = np.float32(factor)
    d = degenerate.astype(np.float32)
    out = d + a * (img.astype(np.float32) - d)
    return np.clip(np.trunc(out), 0, 255).astype(np.uint8)


def gray(img: np.ndarray) -> np.ndarray:
    """PIL's RGB -> L: ITU-R 601-2 luma in 16-bit fixed point, rounded."""
    i = img.astype(np.int32)
    return ((i[..., 0] * 19595 + i[..., 1] * 38470 + i[..., 2] * 7471 + 0x8000) >> 16).astype(np.uint8)


def color(img: np.ndarray, factor: float) -> np.ndarray:
    return _blend(np.repeat(gray(img)[..., None], 3, axis=2), img, factor)


def contrast(img: np.ndarray, factor: float) -> np.ndarray:
    """Towards the mean luma, rounded to an integer (ImageEnhance.Contrast)."""
    h = np.bincount(gray(img).ravel(), minlength=256)
    mean = int(float((np.arange(256) * h).sum()) / h.sum() + 0.5)
    return _blend(np.full_like(img, mean), img, factor)


def brightness(img: np.ndarray, factor: float) -> np.ndarray:
    return _blend(np.zeros_like(img), img, factor)


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / np.float32(13)


def sharpness(img: np.ndarray, factor: float) -> np.ndarray:
    """Away from (or towards) PIL's SMOOTH filter of the image, whose border pixels are the image's."""
    f = img.astype(np.float32)
    smooth = f.copy()
    inner = np.zeros_like(f[1:-1, 1:-1])
    for dy in range(3):
        for dx in range(3):
            inner += f[dy:dy + f.shape[0] - 2, dx:dx + f.shape[1] - 2] * _SMOOTH[dy, dx]
    smooth[1:-1, 1:-1] = np.clip(np.trunc(inner + np.float32(0.5)), 0, 255)
    return _blend(smooth.astype(np.uint8), img, factor)


# ---------------------------------------------------------------- geometric ops (Image.transform)

def affine(img: np.ndarray, matrix: tuple[float, ...], fill: Fill, nearest: bool) -> np.ndarray:
    """PIL's ``Image.transform(size, AFFINE, matrix)``: output pixel (x, y) samples the input at
    ``(a (x+.5) + b (y+.5) + c, d (x+.5) + e (y+.5) + f)``, in PIL's arithmetic (nearest: its 16.16
    fixed-point walk; bilinear: float64, about pixel centres, edge pixels repeated, truncated), so the
    samples land where PIL's do (bilinear values can differ by 1 where PIL's compiled float64 rounds the
    last bit the other way before truncating); samples outside the image take ``fill``."""
    a, b, c, d, e, f = (float(v) for v in matrix)
    h, w = img.shape[:2]
    ys, xs = np.mgrid[0:h, 0:w]
    if nearest:  # PIL's fast path: 16.16 fixed point, exact in integers
        fix = lambda v: np.int64(math.floor(v * 65536.0 + 0.5))  # noqa: E731
        xi = (fix(c + a * 0.5 + b * 0.5) + ys * fix(b) + xs * fix(a)) >> 16
        yi = (fix(f + d * 0.5 + e * 0.5) + ys * fix(e) + xs * fix(d)) >> 16
        inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
        out = img[np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]
    else:  # PIL's generic path: each sample point computed directly in float64
        xin, yin = a * (xs + 0.5) + b * (ys + 0.5) + c, d * (xs + 0.5) + e * (ys + 0.5) + f
        inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
        xs, ys = xin - 0.5, yin - 0.5
        x0, y0 = np.floor(xs), np.floor(ys)
        dx, dy = (xs - x0)[..., None], (ys - y0)[..., None]
        x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
        xa, xb = np.clip(x0, 0, w - 1), np.clip(x0 + 1, 0, w - 1)
        ya, yb = np.clip(y0, 0, h - 1), np.clip(y0 + 1, 0, h - 1)
        src = img.astype(np.float64)
        top = src[ya, xa] + (src[ya, xb] - src[ya, xa]) * dx
        below = (y0 + 1 >= 0) & (y0 + 1 < h)
        bottom = np.where(below[..., None], src[yb, xa] + (src[yb, xb] - src[yb, xa]) * dx, top)
        out = (top + (bottom - top) * dy).astype(np.uint8)  # C's (UINT8) cast: truncation
    out = out.copy()
    out[~inside] = np.array(fill, np.uint8)
    return out


def rotate_matrix(degrees: float, w: int, h: int) -> tuple[float, ...]:
    """PIL's ``Image.rotate`` (counter-clockwise about the centre) as the affine it samples by."""
    angle = -math.radians(degrees)
    a, b, d, e = (round(math.cos(angle), 15), round(math.sin(angle), 15),
                  round(-math.sin(angle), 15), round(math.cos(angle), 15))
    cx, cy = w / 2.0, h / 2.0
    return a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy


def rotate(img: np.ndarray, degrees: float, fill: Fill, nearest: bool = False) -> np.ndarray:
    return affine(img, rotate_matrix(degrees, img.shape[1], img.shape[0]), fill, nearest)


def shear_x(img: np.ndarray, factor: float, fill: Fill, nearest: bool = False) -> np.ndarray:
    return affine(img, (1, factor, 0, 0, 1, 0), fill, nearest)


def shear_y(img: np.ndarray, factor: float, fill: Fill, nearest: bool = False) -> np.ndarray:
    return affine(img, (1, 0, 0, factor, 1, 0), fill, nearest)


def translate_x(img: np.ndarray, pixels: float, fill: Fill, nearest: bool = False) -> np.ndarray:
    return affine(img, (1, 0, pixels, 0, 1, 0), fill, nearest)


def translate_y(img: np.ndarray, pixels: float, fill: Fill, nearest: bool = False) -> np.ndarray:
    return affine(img, (1, 0, 0, 0, 1, pixels), fill, nearest)


# ---------------------------------------------------------------- RandAugment (timm)

def _signed(v: float, rng: np.random.Generator) -> float:
    return -v if rng.random() > 0.5 else v


Op = Callable[[np.ndarray, float, np.random.Generator, Fill], np.ndarray]

_ENHANCE = lambda m: m / LEVEL_DENOM * 1.8 + 0.1  # noqa: E731  timm's [0.1, 1.9]

# timm's _RAND_TRANSFORMS with its level -> argument maps (magnitude m in 0..10)
RAND_OPS: dict[str, Op] = {
    "AutoContrast": lambda x, m, r, f: auto_contrast(x),
    "Equalize": lambda x, m, r, f: equalize(x),
    "Invert": lambda x, m, r, f: invert(x),
    "Rotate": lambda x, m, r, f: rotate(x, _signed(m / LEVEL_DENOM * 30.0, r), f),
    "Posterize": lambda x, m, r, f: posterize(x, int(m / LEVEL_DENOM * 4)),
    "Solarize": lambda x, m, r, f: solarize(x, int(m / LEVEL_DENOM * 256)),
    "SolarizeAdd": lambda x, m, r, f: solarize_add(x, int(m / LEVEL_DENOM * 110)),
    "Color": lambda x, m, r, f: color(x, _ENHANCE(m)),
    "Contrast": lambda x, m, r, f: contrast(x, _ENHANCE(m)),
    "Brightness": lambda x, m, r, f: brightness(x, _ENHANCE(m)),
    "Sharpness": lambda x, m, r, f: sharpness(x, _ENHANCE(m)),
    "ShearX": lambda x, m, r, f: shear_x(x, _signed(m / LEVEL_DENOM * 0.3, r), f),
    "ShearY": lambda x, m, r, f: shear_y(x, _signed(m / LEVEL_DENOM * 0.3, r), f),
    "TranslateXRel": lambda x, m, r, f: translate_x(x, _signed(m / LEVEL_DENOM * 0.45, r) * x.shape[1], f),
    "TranslateYRel": lambda x, m, r, f: translate_y(x, _signed(m / LEVEL_DENOM * 0.45, r) * x.shape[0], f),
}


def rand_augment(img: np.ndarray, spec: RandAugmentSpec, rng: np.random.Generator, fill: Fill) -> np.ndarray:
    """``spec.n`` ops drawn with replacement, each applied with probability ``spec.p``."""
    names = list(RAND_OPS)
    for k in rng.integers(0, len(names), size=spec.n):
        if spec.p < 1.0 and rng.random() > spec.p:
            continue
        m = spec.m
        if spec.mstd > 100:
            m = rng.uniform(0, m)
        elif spec.mstd > 0:
            m = rng.normal(m, spec.mstd)
        img = RAND_OPS[names[k]](img, max(0.0, min(m, LEVEL_DENOM)), rng, fill)
    return img


# ---------------------------------------------------------------- TrivialAugmentWide (torchvision)

BINS = 31
_WIDE = {  # name: (magnitudes over the bins, signed)
    "Identity": (None, False),
    "ShearX": (np.linspace(0.0, 0.99, BINS), True),
    "ShearY": (np.linspace(0.0, 0.99, BINS), True),
    "TranslateX": (np.linspace(0.0, 32.0, BINS), True),
    "TranslateY": (np.linspace(0.0, 32.0, BINS), True),
    "Rotate": (np.linspace(0.0, 135.0, BINS), True),
    "Brightness": (np.linspace(0.0, 0.99, BINS), True),
    "Color": (np.linspace(0.0, 0.99, BINS), True),
    "Contrast": (np.linspace(0.0, 0.99, BINS), True),
    "Sharpness": (np.linspace(0.0, 0.99, BINS), True),
    "Posterize": (8 - np.round(np.arange(BINS) / ((BINS - 1) / 6)).astype(int), False),
    "Solarize": (np.linspace(255.0, 0.0, BINS), False),
    "AutoContrast": (None, False),
    "Equalize": (None, False),
}


def wide_op(img: np.ndarray, name: str, v: float, fill: Fill) -> np.ndarray:
    """One TrivialAugmentWide op at signed magnitude ``v`` (nearest resampling, as torchvision's default)."""
    if name == "Identity":
        return img
    if name in ("ShearX", "ShearY"):
        return (shear_x if name == "ShearX" else shear_y)(img, v, fill, nearest=True)
    if name in ("TranslateX", "TranslateY"):
        return (translate_x if name == "TranslateX" else translate_y)(img, int(v), fill, nearest=True)
    if name == "Rotate":
        return rotate(img, v, fill, nearest=True)
    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        return {"Brightness": brightness, "Color": color, "Contrast": contrast, "Sharpness": sharpness}[name](
            img, 1.0 + v)
    if name == "Posterize":
        return posterize(img, int(v))
    if name == "Solarize":
        return solarize(img, v)
    return auto_contrast(img) if name == "AutoContrast" else equalize(img)


def trivial_augment(img: np.ndarray, rng: np.random.Generator, fill: Fill) -> np.ndarray:
    names = list(_WIDE)
    name = names[int(rng.integers(0, len(names)))]
    mags, signed = _WIDE[name]
    v = 0.0 if mags is None else float(mags[int(rng.integers(0, BINS))])
    if signed and rng.integers(0, 2):
        v = -v
    return wide_op(img, name, v, fill)


# ---------------------------------------------------------------- random erasing (timm)

def random_erasing(x: np.ndarray, prob: float, mode: str, count: int, min_area: float, max_area: float,
                   min_aspect: float, rng: np.random.Generator) -> np.ndarray:
    """timm's RandomErasing on a normalised CHW float32 tensor (``count`` boxes sharing the area)."""
    if rng.random() > prob:
        return x
    c, h, w = x.shape
    x = x.copy()
    log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))
    for _ in range(count):
        for _attempt in range(10):
            area = rng.uniform(min_area, max_area) * h * w / count
            aspect = math.exp(rng.uniform(*log_aspect))
            eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if ew < w and eh < h:
                top, left = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
                shape = (c, eh, ew) if mode == "pixel" else (c, 1, 1)
                x[:, top:top + eh, left:left + ew] = 0.0 if mode == "const" else \
                    rng.standard_normal(shape).astype(np.float32)
                break
    return x
