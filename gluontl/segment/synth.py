"""``demo:digits_seg``: the pixel masks of ``demo:digits_det``'s digits, on the same images.

Every image of ``demo:digits_det`` (same pixels, same train/val split, all 1600 images, so
all ten digits) with a mask of 11 classes: ``background`` (0) and digit ``d`` (``d + 1``). A
pixel belongs to a digit where that glyph's ink weight in the final picture is at least
``INK`` (1/2: the pixel shows more of the digit than of anything under it); later glyphs cover
earlier ones as in the picture. The rest of each pasted box, and everything else, is
background.

Written once to ``$GLUONTL_HOME/datasets/digits_seg/v1/`` in the VOC layout
(``JPEGImages``, ``SegmentationClass`` palette PNGs, ``ImageSets/Segmentation/{train,val}.txt``),
filled in a temporary folder and renamed into place.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..detect.synth import SIZE, layout, paste
from ..data.demo import materialize
from .formats import mask_image, write_voc_lists

CLASSES = ["background"] + [str(d) for d in range(10)]
INK = 0.5
_LAYOUT = "v1"  # bump when pixels or layout change, so stale caches are not reused


def render(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Image ``index``: (128x128x3 uint8 RGB, 128x128 uint8 class ids)."""
    img, _, _, glyphs = paste(index)
    weight = np.zeros((SIZE, SIZE), np.float32)  # ink weight of the glyph on top so far
    owner = np.zeros((SIZE, SIZE), np.uint8)
    for x, y, alpha, digit in glyphs:
        s = alpha.shape[0]
        w, o = weight[y:y + s, x:x + s], owner[y:y + s, x:x + s]
        w *= 1 - alpha  # what shows of earlier glyphs under this one's ink
        top = alpha >= w
        w[top], o[top] = alpha[top], digit + 1
    return img, np.where(weight >= INK, owner, 0).astype(np.uint8)


def _fill(root: Path) -> None:
    images, masks = root / "JPEGImages", root / "SegmentationClass"
    images.mkdir(parents=True)
    masks.mkdir()
    splits: dict[str, list[str]] = {"train": [], "val": []}
    for index, split, _ in layout():
        img, mask = render(index)
        name = f"{index:05d}"
        Image.fromarray(img).save(images / f"{name}.jpg", format="JPEG", quality=90)
        mask_image(mask).save(masks / f"{name}.png", format="PNG")  # the folder is renamed in whole
        splits[split].append(name)
    write_voc_lists(root, splits)


def digits_seg_folder(home: Path) -> Path:
    """The demo's VOC root under ``home`` (``gluontl_home()``), written on first use."""
    return materialize(Path(home) / "datasets" / "digits_seg" / _LAYOUT, "digits_seg", _fill)
