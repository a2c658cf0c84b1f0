"""Predicted masks as pictures: VOC colours per class, and the colours laid over the image.

Colours are the VOC devkit's (:func:`~gluontl.segment.formats.voc_colormap`), so a predicted
mask looks like the dataset's own ``SegmentationClass/`` PNGs; the ignore label is white
(VOC's own colour for it, cream, is hard to tell from the image under an overlay).
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from .augment import resize_mask
from .formats import IGNORE, voc_colormap

WHITE = (255, 255, 255)


def palette(ignore: int = IGNORE) -> np.ndarray:
    """(256, 3) uint8: class id -> RGB, ``ignore`` white."""
    cmap = voc_colormap(256)
    if 0 <= ignore < 256:
        cmap[ignore] = WHITE
    return cmap


def colour_mask(mask: np.ndarray, ignore: int = IGNORE) -> Image.Image:
    """An (H, W) mask of class ids as an RGB picture."""
    mask = np.asarray(mask)
    if mask.ndim != 2 or mask.dtype.kind not in "iu" or mask.size and (mask.min() < 0 or mask.max() > 255):
        raise ValueError(f"a mask is an (H, W) array of class ids 0..255, got {mask.dtype} {mask.shape}")
    return Image.fromarray(palette(ignore)[mask.astype(np.intp)], "RGB")


def overlay(image: np.ndarray | Image.Image, mask: np.ndarray, alpha: float = 0.5, *,
            background: int | None = 0, ignore: int = IGNORE) -> Image.Image:
    """``image`` (HWC uint8 RGB, or a PIL image) with the mask's colours blended in at ``alpha``;
    pixels of class ``background`` keep the image (None: every pixel is tinted). A mask of another
    size (the network's input) is resized nearest-neighbour to the image's."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is {alpha}; give a weight in [0, 1]")
    img = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"image is an (H, W, 3) uint8 RGB array, got {img.dtype} {img.shape}")
    mask = np.asarray(mask)
    if mask.shape != img.shape[:2]:
        mask = resize_mask(mask, img.shape[1], img.shape[0])
    colours = np.asarray(colour_mask(mask, ignore), np.float32)
    blend = (1 - alpha) * img.astype(np.float32) + alpha * colours
    keep = np.zeros(mask.shape, bool) if background is None else mask == background
    out = np.where(keep[..., None], img, np.rint(blend).astype(np.uint8))
    return Image.fromarray(out.astype(np.uint8), "RGB")
