"""``demo:digits_det``: an offline detection dataset made from real material that ships installed.

scikit-learn's 8x8 handwritten digits (``load_digits``) are scaled to 20-40 px glyphs and pasted
as ink (the glyph is the alpha mask, ink levels below 0.15 of full are cut so the box is tight)
onto random 128-384 px square crops of the real photos of scikit-learn (china, flower) and matplotlib
(grace_hopper), each crop scaled to 128x128. Ink is dark on bright ground and light on dark
ground. 1-3 digits per image, pairwise box IoU < 0.3; boxes are the tight pixel box of the
ink, so they are exact integers in every format.

Two tasks share one folder and are picked by ``data.classes``: images 0..999 hold only digits
0-4 (800 train / 200 val, the pretraining task), images 1000..1599 only digits 5-9 (400 train
/ 200 val, the fine-tuning task). Train and val images use disjoint sets of digit samples (a
fixed stratified hold-out of the 1797 glyphs), so val measures new handwriting too.

Written once (fixed seed; pixels are a pure function of the image index) to
``$GLUONTL_HOME/datasets/digits_det/v1/`` as one folder that every reader takes:
VOC (``JPEGImages``, ``Annotations``, ``ImageSets/Main/{train,val}.txt``), YOLO (``data.yaml``,
``images/{split}``, ``labels/{split}``) and COCO (``annotations/instances_{split}.json``,
``{split}/``), the image files hard-linked between the layouts.
"""
from __future__ import annotations

import functools
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from ..home import gluontl_home
from .formats import Annotation, write_coco, write_voc, write_yolo

SIZE = 128
CLASSES = [str(d) for d in range(10)]
TASKS = ((range(0, 5), 800, 200), (range(5, 10), 400, 200))  # digits, train images, val images
GLYPH_PX = (20, 40)
MAX_CROP = 3 * SIZE  # background crops are 128..384 px squares of the photos
ALPHA_CUT = 0.15
MAX_IOU = 0.3
_SEED = 20261123
_LAYOUT = "v1"  # bump when pixels or layout change, so stale caches are not reused


@functools.lru_cache(maxsize=1)
def _material() -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Background photos, digit glyphs (float 0..1), their labels, and which glyphs are val."""
    import matplotlib
    from sklearn.datasets import load_digits, load_sample_images

    from ..data.splits import stratified_holdout

    photos = list(load_sample_images().images)
    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    with Image.open(hopper) as im:
        photos.append(np.asarray(im.convert("RGB")))
    digits = load_digits()
    return photos, digits.images.astype(np.float32) / 16, digits.target, stratified_holdout(digits.target, 0.25)


@functools.lru_cache(maxsize=1)
def layout() -> tuple[tuple[int, str, range], ...]:
    """(image index, split, digits) for every image, in index order."""
    out: list[tuple[int, str, range]] = []
    for digits, n_train, n_val in TASKS:
        out += [(len(out) + i, "train" if i < n_train else "val", digits) for i in range(n_train + n_val)]
    return tuple(out)


def _box_iou(a: list[float], b: list[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def render(index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Image ``index``: (128x128x3 uint8 RGB, its background before pasting, labels (N, 6))."""
    return paste(index)[:3]


def paste(index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int, np.ndarray, int]]]:
    """:func:`render` plus each pasted glyph as ``(x, y, alpha, digit)`` in paste order (the
    ink geometry pixel masks are made of, for ``demo:digits_seg``)."""
    photos, glyphs, target, glyph_val = _material()
    _, split, digits = layout()[index]
    rng = np.random.default_rng([_SEED, index])
    photo = photos[int(rng.integers(len(photos)))]
    h, w = photo.shape[:2]
    side = int(rng.integers(SIZE, min(h, w, MAX_CROP) + 1))
    y, x = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
    background = cv2.resize(photo[y:y + side, x:x + side], (SIZE, SIZE), interpolation=cv2.INTER_AREA)
    img = background.astype(np.float32)
    pool = np.flatnonzero(np.isin(target, list(digits)) & (glyph_val == (split == "val")))
    rows: list[list[float]] = []
    glyphs_at: list[tuple[int, int, np.ndarray, int]] = []
    for _ in range(int(rng.integers(1, 4))):
        g = int(rng.choice(pool))
        s = int(rng.integers(GLYPH_PX[0], GLYPH_PX[1] + 1))
        alpha = np.clip(cv2.resize(glyphs[g], (s, s), interpolation=cv2.INTER_LINEAR), 0, 1)
        alpha[alpha < ALPHA_CUT] = 0
        cols, lines = np.flatnonzero(alpha.any(0)), np.flatnonzero(alpha.any(1))
        for _ in range(50):
            px, py = int(rng.integers(SIZE - s + 1)), int(rng.integers(SIZE - s + 1))
            box = [px + cols[0], py + lines[0], px + cols[-1] + 1, py + lines[-1] + 1]
            if all(_box_iou(box, r) < MAX_IOU for r in rows):
                break
        else:
            continue  # no room left for this glyph
        patch = img[py:py + s, px:px + s]
        bright = float(background[py:py + s, px:px + s].mean()) > 127
        ink = rng.uniform(0, 50, 3) if bright else rng.uniform(205, 255, 3)
        a = alpha[:, :, None]
        img[py:py + s, px:px + s] = patch * (1 - a) + ink.astype(np.float32) * a
        rows.append([float(v) for v in box] + [float(target[g]), 0.0])
        glyphs_at.append((px, py, alpha, int(target[g])))
    out = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return out, background, np.array(rows, np.float32).reshape(-1, 6), glyphs_at


def _fill(root: Path) -> None:
    images = root / "JPEGImages"
    images.mkdir(parents=True)
    splits: dict[str, list[Annotation]] = {"train": [], "val": []}
    for index, split, _ in layout():
        img, _, labels = render(index)
        path = images / f"{index:05d}.jpg"
        Image.fromarray(img).save(path, format="JPEG", quality=90)
        splits[split].append(Annotation(path, (SIZE, SIZE), labels, f"digits_det image {index}"))
    write_voc(root, splits, CLASSES)
    write_yolo(root, splits, CLASSES)
    write_coco(root, splits, CLASSES)


def digits_det_folder(home: Path | None = None) -> Path:
    """The demo folder (VOC, YOLO and COCO at once), written on first use."""
    from ..data.demo import materialize

    return materialize((home or gluontl_home()) / "datasets" / "digits_det" / _LAYOUT, "digits_det", _fill)
