"""Segmentation datasets on disk: the VOC layout and a plain ``images/`` + ``masks/`` pair.

A mask is a single-channel PNG whose pixel values are class ids ``0..n-1`` or the ignore label
(255 by default: VOC draws object borders with it). VOC stores masks as palette PNGs whose
indices are the ids and whose colours are the VOC colormap, so they are readable ids and
viewable pictures at once; :func:`write_mask` writes that form, :func:`read_mask` reads it (or a
plain 8-bit grey PNG). A value that is neither a class nor the ignore label is an error naming
the file and the value: silently training on it would corrupt the loss (gluon-cv #969).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..atomic import atomic_write, write_text
from ..data.transforms import open_image
from ..errors import DataError
from ..readers import read_text

IGNORE = 255
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class Sample:
    image: Path
    mask: Path


def voc_colormap(n: int = 256) -> np.ndarray:
    """The VOC devkit's ``labelcolormap``: the bits of the class id, three at a time, spread
    over the high bits of R, G and B (id 0 black, 1 dark red, 255 cream)."""
    ids = np.arange(n)
    cmap = np.zeros((n, 3), np.uint8)
    for j in range(8):
        for c in range(3):
            cmap[:, c] |= (((ids >> (3 * j + c)) & 1) << (7 - j)).astype(np.uint8)
    return cmap


def mask_image(mask: np.ndarray) -> Image.Image:
    """``mask`` (H, W uint8 ids) as a VOC palette image: ids as indices, the VOC colours."""
    if mask.ndim != 2 or mask.dtype != np.uint8:
        raise ValueError(f"a mask is an (H, W) uint8 array of class ids, got {mask.dtype} {mask.shape}")
    im = Image.fromarray(mask, mode="P")
    im.putpalette(voc_colormap().tobytes())
    return im


def write_mask(path: str | Path, mask: np.ndarray) -> Path:
    """``mask`` as a VOC palette PNG, atomically."""
    im = mask_image(mask)
    return atomic_write(path, lambda p: im.save(p, format="PNG"), DataError)


def read_mask(path: str | Path, num_classes: int, ignore: int = IGNORE) -> np.ndarray:
    """The (H, W) uint8 class ids of a palette or grey PNG, checked against ``num_classes``."""
    path = Path(path)
    with open_image(path, what="the mask", hint="Masks are single-channel PNGs of class ids; replace or remove "
                                                "the file.") as im:
        mode = im.mode
        mask = np.asarray(im) if mode in ("P", "L") else None
    if mask is None:
        raise DataError(f"The mask '{path}' is a {mode} image; masks are single-channel PNGs (palette or "
                        f"8-bit grey) whose pixel values are class ids. Convert colour masks to ids "
                        f"first (the VOC palette PNGs of SegmentationClass/ are already ids).")
    values = np.unique(mask)
    bad = values[(values >= num_classes) & (values != ignore)]
    if len(bad):
        shown = ", ".join(str(int(v)) for v in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise DataError(f"The mask '{path}' holds pixel value(s) {shown}, which are neither a class id "
                        f"(0..{num_classes - 1} for {num_classes} classes) nor the ignore label {ignore}. "
                        f"Check data.classes (is a class missing?) and the ignore label, or fix the mask.")
    return mask


def read_voc(root: str | Path, split: str) -> list[Sample]:
    """The samples of ``ImageSets/Segmentation/<split>.txt`` under a VOC root."""
    root = Path(root)
    listing = root / "ImageSets" / "Segmentation" / f"{split}.txt"
    if not listing.is_file():
        raise DataError(f"Cannot read the VOC split list '{listing}': it does not exist. A VOC segmentation "
                        f"root holds JPEGImages/, SegmentationClass/ and ImageSets/Segmentation/"
                        f"{{train,val}}.txt.")
    ids = read_text(listing, DataError, "the VOC split list").split()
    samples = [Sample(root / "JPEGImages" / f"{i}.jpg", root / "SegmentationClass" / f"{i}.png") for i in ids]
    missing = [str(p) for s in samples for p in (s.image, s.mask) if not p.is_file()]
    if missing:
        raise DataError(f"{listing} lists {len(missing)} file(s) that do not exist, e.g. "
                        f"{', '.join(missing[:3])}. Remove their ids from the list or restore the files.")
    if not samples:
        raise DataError(f"The VOC split list '{listing}' is empty; it needs one image id per line.")
    return samples


def read_pairs(root: str | Path) -> list[Sample]:
    """``root/images/<stem>.<jpg|png|...>`` paired with ``root/masks/<stem>.png``, by stem."""
    root = Path(root)
    found = {}
    for sub in ("images", "masks"):
        folder = root / sub
        if not folder.is_dir():
            raise DataError(f"'{root}' has no {sub}/ folder; a plain segmentation dataset is images/ and "
                            f"masks/ side by side, a mask named like its image (stem) with .png.")
        suffixes = IMAGE_SUFFIXES if sub == "images" else (".png",)
        found[sub] = {p.stem: p for p in sorted(folder.iterdir()) if p.suffix.lower() in suffixes}
    images, masks = found["images"], found["masks"]
    lone = sorted(set(images) ^ set(masks))
    if lone:
        where = lambda s: "images/" if s in images else "masks/"  # noqa: E731
        shown = ", ".join(f"{where(s)}{s}" for s in lone[:5]) + (", ..." if len(lone) > 5 else "")
        raise DataError(f"In '{root}', {len(lone)} file(s) have no partner with the same stem: {shown}. "
                        f"Every image needs a mask (masks/<stem>.png) and every mask an image.")
    if not images:
        raise DataError(f"'{root}/images' holds no images ({', '.join(IMAGE_SUFFIXES)}).")
    return [Sample(images[s], masks[s]) for s in sorted(images)]


def write_voc_lists(root: str | Path, splits: dict[str, list[str]]) -> None:
    """``ImageSets/Segmentation/<split>.txt`` for each split's image ids."""
    folder = Path(root) / "ImageSets" / "Segmentation"
    folder.mkdir(parents=True, exist_ok=True)
    for split, ids in splits.items():
        write_text(folder / f"{split}.txt", "".join(f"{i}\n" for i in ids), DataError)
