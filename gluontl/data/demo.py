"""Offline demo data, materialized once as ImageFolder caches under ``$GLUONTL_HOME/datasets``.

``demo:digits``: scikit-learn's 1797 real 8x8 handwritten digits, so a fine-tuning demo runs
without any download. Written to ``datasets/digits/v1-val<fraction>/<split>/<digit>/<row>.png``,
``row`` being the index in ``load_digits()``; ``data.classes`` picks a task (``["0".."4"]``
source task, ``["5".."9"]`` target task). Pixels (see :func:`digits_image`): ink levels 0..16
are scaled by 255/16, upscaled 4x to 32x32 with OpenCV bilinear interpolation (half-pixel
centres, edges clamped) in float32, rounded to uint8 and repeated into 3 equal RGB channels.

``demo:elpv``: the 2,624 300x300 grayscale electroluminescence images of solar cells from the
``elpv-dataset`` package (Buerhop-Lutz et al.; data licence CC BY-NC-SA 4.0), each rated with a
defect probability 0, 1/3, 2/3 or 1 by an expert. The task is ``functional`` (p < 0.5) vs
``defective`` (p >= 0.5). The original PNGs are hard-linked (copied across file systems, never
re-encoded) to ``datasets/elpv/v1-val<fraction>/<split>/<class>/cellNNNN.png``.

``demo:elpv_graded``: the same images and the same split, in four classes by the defect
probability itself (``p0``, ``p33``, ``p67``, ``p100`` for 0, 1/3, 2/3, 1; 1508 / 295 / 106 / 715
images): a real imbalanced problem, the one ``data.sampler`` and ``train.loss`` are for.

Both splits are ``stratified_holdout`` with its fixed seed, so they never move with the run
seed; ELPV is stratified on the probability level and the cell type (mono/poly) together, so
train and val see the same mix of uncertain ratings and of both cell types.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
from PIL import Image

from ..atomic import link_or_copy
from ..errors import DataError
from ..home import gluontl_home
from .splits import stratified_holdout

DEMOS = ("digits", "elpv", "elpv_graded")
DIGITS_SIZE = 32
ELPV_CLASSES = ("functional", "defective")
ELPV_GRADES = ("p0", "p33", "p67", "p100")  # defect probability 0, 1/3, 2/3, 1 in percent
_LAYOUT = "v1"  # bump when the pixels or the layout change, so stale caches are not reused


def materialize(final: Path, name: str, fill: Callable[[Path], None]) -> Path:
    """``final``, filled by ``fill(tmp)`` on first use.

    Written into a temporary sibling folder and renamed into place, so an interrupted write
    never leaves a half-filled cache that later runs would trust.
    """
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    except OSError as e:
        raise DataError(f"Cannot create the {name} demo cache in '{final.parent}': {e}. Set "
                        f"GLUONTL_HOME to a writable folder.") from None
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race with another process: a real failure
                raise
    except OSError as e:
        raise DataError(f"Cannot write the {name} demo cache '{final}': {e}. Set GLUONTL_HOME to a "
                        f"writable folder with enough free space.") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _cache_dir(name: str, val_fraction: float, home: Path | None) -> Path:
    return (home or gluontl_home()) / "datasets" / name / f"{_LAYOUT}-val{val_fraction:g}"


# ---------------------------------------------------------------- digits

def digits_image(ink: np.ndarray) -> np.ndarray:
    """One 8x8 sklearn digit (values 0..16) as the cached 32x32x3 uint8 RGB image."""
    gray = ink.astype(np.float32) * np.float32(255 / 16)
    big = cv2.resize(gray, (DIGITS_SIZE, DIGITS_SIZE), interpolation=cv2.INTER_LINEAR)
    return np.repeat(np.clip(np.rint(big), 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)


def digits_folder(val_fraction: float, home: Path | None = None) -> Path:
    """The digits ImageFolder for this split fraction, written on first use."""
    def fill(tmp: Path) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        is_val = stratified_holdout(digits.target, val_fraction)
        for row, (ink, label) in enumerate(zip(digits.images, digits.target)):
            folder = tmp / ("val" if is_val[row] else "train") / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            _write_png(folder / f"{row:04d}.png", digits_image(ink))

    return materialize(_cache_dir("digits", val_fraction, home), "digits", fill)


def _write_png(path: Path, rgb: np.ndarray) -> None:
    Image.fromarray(rgb).save(path, format="PNG")


# ---------------------------------------------------------------- elpv

def elpv_labels() -> tuple[list[Path], np.ndarray, np.ndarray]:
    """The installed ELPV images, their defect probabilities and cell types, in labels.csv order."""
    spec = importlib.util.find_spec("elpv_dataset")
    labels = Path(spec.origin).parent / "data" / "labels.csv" if spec and spec.origin else None
    if labels is None or not labels.is_file():
        raise DataError("demo:elpv needs the ELPV solar-cell images of the 'elpv-dataset' package, which "
                        "is not installed in this environment. Install it with `pip install "
                        "elpv-dataset==1.0.0.post1` (or `bash scripts/env.sh`, which installs the demo "
                        "extra).")
    paths, probs, types = [], [], []
    with open(labels, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 3:
                raise DataError(f"{labels}, line {line_no}: expected 'path probability type', got "
                                f"{line.strip()!r}. Reinstall elpv-dataset==1.0.0.post1.")
            paths.append(labels.parent / fields[0])
            probs.append(float(fields[1]))
            types.append(fields[2])
    return paths, np.array(probs), np.array(types)


def elpv_folder(val_fraction: float, home: Path | None = None, *, graded: bool = False) -> Path:
    """The ELPV ImageFolder (functional/defective, or the four ``graded`` levels) for this split
    fraction, written on first use; both gradings hold out the same images."""
    def fill(tmp: Path) -> None:
        paths, probs, types = elpv_labels()
        levels = np.rint(probs * 3).astype(np.int64)  # 0, 1/3, 2/3, 1 -> 0..3
        kinds = np.unique(types, return_inverse=True)[1]
        is_val = stratified_holdout(levels * (kinds.max() + 1) + kinds, val_fraction)
        for src, p, level, val in zip(paths, probs, levels, is_val):
            name = ELPV_GRADES[level] if graded else ELPV_CLASSES[int(p >= 0.5)]
            folder = tmp / ("val" if val else "train") / name
            folder.mkdir(parents=True, exist_ok=True)
            link_or_copy(src, folder / src.name)

    name = "elpv_graded" if graded else "elpv"
    return materialize(_cache_dir(name, val_fraction, home), name, fill)


def demo_folder(name: str, val_fraction: float) -> Path:
    """The ImageFolder root behind ``demo:NAME``."""
    if name not in DEMOS:
        raise DataError(f"Unknown demo dataset 'demo:{name}'. Available: "
                        f"{', '.join('demo:' + d for d in DEMOS)}.")
    if name == "elpv_graded":
        return elpv_folder(val_fraction, graded=True)
    return (digits_folder if name == "digits" else elpv_folder)(val_fraction)
