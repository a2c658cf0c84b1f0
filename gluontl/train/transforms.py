"""Image decoding and the train/val transform pipeline, in numpy/cv2.

Transforms are our own numpy code rather than ``gluon.data.vision.transforms`` because the
random ones must draw from a generator we hand them: the loader seeds one generator per
sample from ``(seed, epoch, index)`` (see :func:`sample_rng`), so a sample's crop, flip and
jitter are the same whichever worker process computes it and however many workers there are.
Working on numpy arrays also keeps MXNet's engine out of forked DataLoader workers.

Pipeline, in this order (``train=False`` skips the random steps or replaces them with a
deterministic stand-in):

1. ``resize: N`` scales the *shorter side* to N, keeping the aspect ratio (the ImageNet
   evaluation convention pretrained models expect). With no crop configured, the centre
   N x N is then taken, so ``resize`` alone always yields N x N and batches stack.
2. ``random_resized_crop: S`` takes a random area in [8 %, 100 %], aspect in [3/4, 4/3] crop
   and resizes it to S x S (Inception style). Without ``train``: the centre S x S, after
   scaling the shorter side to S when no ``resize`` is set.
3. ``center_crop: C`` takes the centre C x C (scaling the shorter side up to C first if the
   image is smaller).
4. ``flip`` mirrors left-right with probability 1/2 (train only).
5. ``color_jitter: f`` scales brightness, contrast and saturation by factors drawn from
   [1-f, 1+f], in random order (train only).
6. To a float32 CHW tensor in [0, 1], then ``normalize``: ``imagenet`` mean/std, ``none``, or
   ``((mean), (std))`` given as fractions of 255 like the ImageNet values.

Shrinking uses area interpolation (no aliasing), enlarging bilinear.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import BinaryIO, Iterator

import cv2
import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from ..errors import DataError
from ..recipe import TransformSpec

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_SAMPLE_TAG = 0x5A3E  # keeps per-sample streams apart from the loader's order stream


# ---------------------------------------------------------------- image files

def image_problem(source: str | Path | bytes) -> str | None:
    """Why ``source`` (a path or encoded bytes) cannot be used as an image, or None.

    Fast enough to run over a whole split before training: PNG is checked by ``verify``
    (all chunk CRCs), JPEG is decoded at 1/8 scale (which still reads every byte, so
    truncation shows), anything else is decoded fully.
    """
    if (len(source) if isinstance(source, bytes) else Path(source).stat().st_size) == 0:
        return "empty file (0 bytes)"
    try:
        with _strict_decoding(), _open(source) as im:
            if im.format == "PNG":
                im.verify()
            else:
                if im.format == "JPEG":
                    im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
    except UnidentifiedImageError:
        return "not an image file (no known image format)"
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, struct.error...)
        return f"corrupt or truncated image ({e})"
    return None


def decode_image(source: str | Path | bytes, name: str | None = None) -> np.ndarray:
    """Decode to HWC uint8 RGB whatever the file's mode.

    Grayscale, palette, RGBA/LA (alpha dropped), CMYK and 1-bit go through PIL's RGB
    conversion; 16-bit grayscale is scaled by 255/65535 (PIL's own conversion would clip it).
    EXIF orientation is applied so phone photos are upright.
    """
    try:
        with _strict_decoding(), _open(source) as im:
            im = ImageOps.exif_transpose(im)
            if im.mode in _SIXTEEN_BIT:
                gray = np.clip(np.rint(np.asarray(im, np.float64) / 257.0), 0, 255).astype(np.uint8)
                return np.repeat(gray[:, :, None], 3, axis=2)
            if im.mode in ("P", "PA"):
                im = im.convert("RGBA")
            return np.array(im.convert("RGB") if im.mode != "RGB" else im, np.uint8)
    except Exception as e:
        where = name or str(source)
        raise DataError(f"Cannot read image '{where}': {e}. Replace or delete the file (datasets are "
                        f"checked when loaded, so a file failing later was changed or removed since).") from None


def load_image(path: str | Path) -> np.ndarray:
    """Read one image file as HWC uint8 RGB; a missing or unreadable file is a DataError."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"Image file '{p}' does not exist. Pass the path of an existing image.")
    problem = image_problem(p)
    if problem:
        raise DataError(f"Cannot read image '{p}': {problem}. Pass a JPEG, PNG, BMP, TIFF, GIF "
                        f"or WebP file.")
    return decode_image(p)


@contextlib.contextmanager
def _strict_decoding() -> Iterator[None]:
    """Truncated files must fail: some libraries (gluoncv.data) switch PIL's global
    ``LOAD_TRUNCATED_IMAGES`` on at import, which would let them through silently."""
    old = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = old


def _open(source: str | Path | bytes | BinaryIO) -> Image.Image:
    return Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)


# ---------------------------------------------------------------- transforms

def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's random transforms: a pure function of its identity."""
    return np.random.default_rng([_SAMPLE_TAG, seed % 2**64, epoch, index])


class Transform:
    """A built pipeline: ``t(img_hwc_uint8, rng) -> float32 CHW``.

    ``rng`` is needed only when ``random`` is true (training with crop/flip/jitter).
    """

    def __init__(self, spec: TransformSpec, train: bool) -> None:
        self.spec = spec
        self.train = train
        self.random = train and bool(spec.random_resized_crop or spec.flip or spec.color_jitter)
        mean, std = _mean_std(spec)
        self._mean = np.array(mean, np.float32).reshape(3, 1, 1)
        self._std = np.array(std, np.float32).reshape(3, 1, 1)

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        if self.random and rng is None:
            raise ValueError("this transform is random; pass rng=sample_rng(seed, epoch, index)")
        s = self.spec
        if s.resize:
            img = _shorter_side(img, s.resize)
        if s.random_resized_crop:
            if self.train:
                img = _random_resized_crop(img, s.random_resized_crop, rng)
            else:
                img = _center_crop(img if s.resize else _shorter_side(img, s.random_resized_crop),
                                   s.random_resized_crop)
        if s.center_crop:
            img = _center_crop(img, s.center_crop)
        elif s.resize and not s.random_resized_crop:
            img = _center_crop(img, s.resize)
        img = img.astype(np.float32)
        if self.train and s.flip and rng.random() < 0.5:
            img = img[:, ::-1]
        if self.train and s.color_jitter:
            img = _color_jitter(img, s.color_jitter, rng)
        chw = np.ascontiguousarray(img.transpose(2, 0, 1)) / np.float32(255.0)
        return (chw - self._mean) / self._std


def build(spec: TransformSpec, train: bool) -> Transform:
    """The pipeline for ``spec``; ``train=False`` makes it deterministic (val, predict)."""
    return Transform(spec, train)


def _mean_std(spec: TransformSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if spec.normalize == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    if spec.normalize == "none":
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    mean, std = spec.normalize
    if min(std) <= 0:
        raise DataError(f"normalize std {tuple(std)} has a value <= 0; give std as positive fractions "
                        f"of 255, e.g. normalize: [[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]].")
    return tuple(mean), tuple(std)


def _resize(img: np.ndarray, w: int, h: int) -> np.ndarray:
    shrink = w * h < img.shape[0] * img.shape[1]
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def _shorter_side(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    if min(h, w) == size:
        return img
    if h <= w:
        return _resize(img, max(1, round(w * size / h)), size)
    return _resize(img, size, max(1, round(h * size / w)))


def _center_crop(img: np.ndarray, size: int) -> np.ndarray:
    if min(img.shape[:2]) < size:
        img = _shorter_side(img, size)
    h, w = img.shape[:2]
    y, x = (h - size) // 2, (w - size) // 2
    return img[y:y + size, x:x + size]


def _random_resized_crop(img: np.ndarray, size: int, rng: np.random.Generator,
                         scale: tuple[float, float] = (0.08, 1.0),
                         ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> np.ndarray:
    h, w = img.shape[:2]
    for _ in range(10):
        area = h * w * rng.uniform(*scale)
        aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1])))
        cw, ch = round(np.sqrt(area * aspect)), round(np.sqrt(area / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return _resize(img[y:y + ch, x:x + cw], size, size)
    side = min(h, w)
    return _resize(_center_crop(img, side), size, size)


def _color_jitter(img: np.ndarray, f: float, rng: np.random.Generator) -> np.ndarray:
    factors = rng.uniform(1 - f, 1 + f, size=3)
    for op in rng.permutation(3):
        a = np.float32(factors[op])
        if op == 0:  # brightness
            img = img * a
        elif op == 1:  # contrast: towards the mean luma
            m = np.float32((img @ _LUMA).mean())
            img = (img - m) * a + m
        else:  # saturation: towards each pixel's luma
            g = (img @ _LUMA)[:, :, None]
            img = (img - g) * a + g
        img = np.clip(img, 0, 255)
    return img
