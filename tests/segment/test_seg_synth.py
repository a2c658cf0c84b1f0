"""demo:digits_seg: the images are demo:digits_det's, mask pixels are digit where the picture
shows the digit's ink (checked from the pixels: the ink weight recovered from image, background
and ink colour), ids in range, the VOC folder reads back through segment.formats, and writing it
twice gives the same bytes."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gluontl.detect import synth as det
from gluontl.segment import synth
from gluontl.segment.formats import read_mask, read_voc

SAMPLE = list(range(0, 1600, 53)) + [999, 1000, 1599]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return synth.digits_seg_folder(tmp_path_factory.mktemp("home"))


def test_reads_back_as_voc_with_the_detection_split(folder):
    assert folder.name == "v1" and folder.parent.name == "digits_seg"
    train, val = read_voc(folder, "train"), read_voc(folder, "val")
    assert (len(train), len(val)) == (1200, 400)
    want = {s: [f"{i:05d}" for i, split, _ in det.layout() if split == s] for s in ("train", "val")}
    assert [s.image.stem for s in train] == want["train"] and [s.image.stem for s in val] == want["val"]
    for i in SAMPLE:
        sample = (train + val)[[s.image.stem for s in train + val].index(f"{i:05d}")]
        img, mask = synth.render(i)
        np.testing.assert_array_equal(read_mask(sample.mask, len(synth.CLASSES)), mask)
        jpeg = io.BytesIO()
        Image.fromarray(det.render(i)[0]).save(jpeg, format="JPEG", quality=90)  # digits_det's image file
        assert sample.image.read_bytes() == jpeg.getvalue()


def test_all_classes_and_only_them(folder):
    seen = set()
    for s in read_voc(folder, "train")[::10] + read_voc(folder, "val")[::10]:
        seen |= set(np.unique(read_mask(s.mask, 11)).tolist())
    assert seen == set(range(11))
    assert synth.CLASSES == ["background"] + [str(d) for d in range(10)]


@pytest.mark.parametrize("index", SAMPLE)
def test_mask_is_where_the_digits_were_pasted(index):
    img, mask = synth.render(index)
    det_img, background, labels = det.render(index)
    np.testing.assert_array_equal(img, det_img)
    assert mask.shape == (128, 128) and mask.dtype == np.uint8 and mask.max() <= 10
    in_box = np.zeros_like(mask, bool)
    for x0, y0, x1, y1, digit, _ in labels.astype(int):
        box = mask[y0:y1, x0:x1]
        in_box[y0:y1, x0:x1] = True
        assert np.isin(box, [0] + [int(d) + 1 for d in labels[:, 4]]).all()
    assert not mask[~in_box].any()  # outside every box: background
    assert set(np.unique(mask[mask > 0]) - 1) <= set(labels[:, 4].astype(int).tolist())
    if len(labels) == 1:  # no overlap: the ink weight follows from the pixels alone
        x0, y0, x1, y1, digit, _ = labels[0].astype(int)
        diff = img[y0:y1, x0:x1].astype(np.float64) - background[y0:y1, x0:x1]
        darkest = np.unravel_index(np.abs(diff).sum(2).argmax(), diff.shape[:2])
        ink = img[y0:y1, x0:x1][darkest].astype(np.float64)  # a full-ink pixel shows the ink colour
        span = ink - background[y0:y1, x0:x1]
        weight = (diff * span).sum(2) / np.maximum((span ** 2).sum(2), 1e-9)
        clear = (np.abs(span).sum(2) > 150) & (np.abs(weight - 0.5) > 0.1)  # far from 1/2 and from ground colour
        assert clear.sum() > 20
        np.testing.assert_array_equal(mask[y0:y1, x0:x1][clear], np.where(weight[clear] >= 0.5, digit + 1, 0))


def test_same_bytes_twice(folder, tmp_path):
    again = synth.digits_seg_folder(tmp_path)
    files = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert len(files) == 2 * 1600 + 2
    for f in files:
        assert (folder / f).read_bytes() == (again / f).read_bytes(), f
    assert synth.digits_seg_folder(tmp_path) == again  # a second call reuses the cache
