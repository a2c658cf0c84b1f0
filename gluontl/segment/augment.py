"""Augmentation that moves an image and its mask together, seeded per sample.

Random steps draw only from ``gluontl.data.transforms.sample_rng(seed, epoch, index)``, so a
sample's augmentation is independent of the worker count and a resume reproduces it (as
detection's). Train, after GluonCV's ``SegmentationDataset._sync_transform``:

1. Random scale: both sides times ``s`` in ``scale`` (image area/bilinear, mask nearest). The
   image goes through OpenCV (``resize_image``), 50x faster than ``deploy_preprocess``'s numpy
   copy of the same kernels, which gives the same bytes.
2. Pad to at least ``crop`` (the normalized image with 0, i.e. the mean colour; the mask with
   the ignore label, so padding never counts in loss or metric), then a random ``crop``.
3. Left-right flip with probability 1/2.

Validation and predict resize to ``size`` when given (mask nearest), else keep the image.
Masks are only ever resized nearest-neighbour, so their values stay a subset of the input's.

Output stride (gluon-cv #1173: a crop that is not a multiple of the network's stride gives
feature maps whose upsampled size misses the label's): every output is padded at the bottom
and right to a multiple of ``stride``, the mask with the ignore label; :func:`unpad` cuts a
prediction back to the image's own size.
"""
from __future__ import annotations

import numpy as np

from ..data.transforms import resize_image
from .formats import IGNORE


def resize_mask(mask: np.ndarray, w: int, h: int) -> np.ndarray:
    """Nearest-neighbour at pixel centres: every output value is an input value."""
    ys = np.minimum(((np.arange(h) + 0.5) * mask.shape[0] / h).astype(int), mask.shape[0] - 1)
    xs = np.minimum(((np.arange(w) + 0.5) * mask.shape[1] / w).astype(int), mask.shape[1] - 1)
    return mask[ys[:, None], xs[None, :]]


def pad_to(img: np.ndarray, mask: np.ndarray, h: int, w: int, fill: float,
           ignore: int) -> tuple[np.ndarray, np.ndarray]:
    """Both padded at the bottom and right to at least (h, w)."""
    ih, iw = mask.shape
    if ih >= h and iw >= w:
        return img, mask
    oh, ow = max(h, ih), max(w, iw)
    canvas = np.empty((oh, ow, img.shape[2]), img.dtype)
    canvas[:] = fill
    canvas[:ih, :iw] = img
    out = np.full((oh, ow), ignore, mask.dtype)
    out[:ih, :iw] = mask
    return canvas, out


def unpad(pred: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """A (..., H', W') prediction of a padded input cut back to the image's (H, W)."""
    return pred[..., :hw[0], :hw[1]]


class SegmentationTransform:
    """``t(img_hwc_uint8, mask_hw_uint8, rng) -> (float32 CHW, uint8 HW)``."""

    def __init__(self, train: bool, mean: tuple[float, ...], std: tuple[float, ...], *,
                 crop: int | tuple[int, int] | None = None, scale: tuple[float, float] = (0.5, 2.0),
                 flip: bool = True, size: tuple[int, int] | None = None, stride: int = 1,
                 ignore: int = IGNORE) -> None:
        if train and crop is None:
            raise ValueError("a train transform needs a crop size")
        self.train, self.ignore, self.stride, self.flip = train, ignore, int(stride), flip
        self.crop = None if crop is None else ((crop, crop) if isinstance(crop, int) else tuple(crop))
        self.scale, self.size = scale, size
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)

    def __call__(self, img: np.ndarray, mask: np.ndarray,
                 rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        if img.shape[:2] != mask.shape:
            raise ValueError(f"image {img.shape[:2]} and mask {mask.shape} differ in size")
        if self.train:
            if rng is None:
                raise ValueError("this transform is random; pass rng=sample_rng(seed, epoch, index)")
            s = rng.uniform(*self.scale)
            h, w = max(1, round(mask.shape[0] * s)), max(1, round(mask.shape[1] * s))
            img, mask = self._normalize(resize_image(img, w, h)), resize_mask(mask, w, h)
            ch, cw = self.crop
            img, mask = pad_to(img, mask, ch, cw, 0, self.ignore)
            y, x = int(rng.integers(mask.shape[0] - ch + 1)), int(rng.integers(mask.shape[1] - cw + 1))
            img, mask = img[y:y + ch, x:x + cw], mask[y:y + ch, x:x + cw]
            if self.flip and rng.random() < 0.5:
                img, mask = img[:, ::-1], mask[:, ::-1]
        else:
            if self.size is not None and mask.shape != tuple(self.size):
                h, w = self.size
                img, mask = resize_image(img, w, h), resize_mask(mask, w, h)
            img = self._normalize(img)
        h, w = (-(-n // self.stride) * self.stride for n in mask.shape)
        img, mask = pad_to(img, mask, h, w, 0, self.ignore)
        return np.ascontiguousarray(img.transpose(2, 0, 1)), np.ascontiguousarray(mask)

    def _normalize(self, img: np.ndarray) -> np.ndarray:
        return (img.astype(np.float32) / 255 - self.mean) / self.std
