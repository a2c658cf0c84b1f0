"""Offline demo data: scikit-learn's handwritten digits as an ImageFolder cache.

The 1797 real 8x8 scans ship with scikit-learn, so a fine-tuning demo runs without any
download. They are written once to ``$GLUONTL_HOME/datasets/digits/v1-val<fraction>/``
(default home ``~/.cache/gluontl``) as ``<split>/<digit>/<row>.png``, ``row`` being the index
in ``load_digits()``; after that ``demo:digits`` is an ordinary folder source, and
``data.classes`` picks a task (``["0".."4"]`` source task, ``["5".."9"]`` target task).

Pixels (see :func:`digits_image`): ink levels 0..16 are scaled by 255/16, upscaled 4x to
32x32 with OpenCV bilinear interpolation (half-pixel centres, edges clamped) in float32,
rounded to uint8 and repeated into 3 equal RGB channels; white digits on black, as in the
source. The train/val split is ``stratified_holdout`` with its fixed seed, so it never moves
with the run seed.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from ..errors import DataError
from .data import stratified_holdout

DEMOS = ("digits",)
DIGITS_SIZE = 32
_LAYOUT = "v1"  # bump when the pixels or the layout change, so stale caches are not reused


def gluontl_home() -> Path:
    return Path(os.environ.get("GLUONTL_HOME") or "~/.cache/gluontl").expanduser()


def digits_image(ink: np.ndarray) -> np.ndarray:
    """One 8x8 sklearn digit (values 0..16) as the cached 32x32x3 uint8 RGB image."""
    gray = ink.astype(np.float32) * np.float32(255 / 16)
    big = cv2.resize(gray, (DIGITS_SIZE, DIGITS_SIZE), interpolation=cv2.INTER_LINEAR)
    return np.repeat(np.clip(np.rint(big), 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)


def digits_folder(val_fraction: float, home: Path | None = None) -> Path:
    """The digits ImageFolder for this split fraction, written on first use.

    Written into a temporary sibling folder and renamed into place, so an interrupted write
    never leaves a half-filled cache that later runs would trust.
    """
    final = (home or gluontl_home()) / "datasets" / "digits" / f"{_LAYOUT}-val{val_fraction:g}"
    if final.is_dir():
        return final
    from sklearn.datasets import load_digits

    digits = load_digits()
    is_val = stratified_holdout(digits.target, val_fraction)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    except OSError as e:
        raise DataError(f"Cannot create the digits demo cache in '{final.parent}': {e}. Set "
                        f"GLUONTL_HOME to a writable folder.") from None
    try:
        for row, (ink, label) in enumerate(zip(digits.images, digits.target)):
            folder = tmp / ("val" if is_val[row] else "train") / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            _write_png(folder / f"{row:04d}.png", digits_image(ink))
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race with another process: a real failure
                raise
    except OSError as e:
        raise DataError(f"Cannot write the digits demo cache '{final}': {e}. Set GLUONTL_HOME to a "
                        f"writable folder with a few MB free.") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_png(path: Path, rgb: np.ndarray) -> None:
    Image.fromarray(rgb).save(path, format="PNG")


def demo_folder(name: str, val_fraction: float) -> Path:
    """The ImageFolder root behind ``demo:NAME``."""
    if name not in DEMOS:
        raise DataError(f"Unknown demo dataset 'demo:{name}'. Available: "
                        f"{', '.join('demo:' + d for d in DEMOS)}.")
    return digits_folder(val_fraction)
