"""demo:digits_det: the three written formats agree, boxes are the tight box of the pasted ink,
the two tasks have their documented sizes and digits, and the data is deterministic."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gluontl.detect import synth
from gluontl.detect.data import make_detection_loaders
from gluontl.detect.formats import read_coco, read_voc_xml, read_yolo
from gluontl.recipe import DataSpec

SAMPLE = list(range(0, 1600, 37)) + [999, 1000, 1599]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return synth.digits_det_folder(tmp_path_factory.mktemp("home"))


def _voc_split(folder: Path, split: str) -> dict[str, np.ndarray]:
    out = {}
    for stem in (folder / "ImageSets" / "Main" / f"{split}.txt").read_text().split():
        ann, names = read_voc_xml(folder / "Annotations" / f"{stem}.xml", folder / "JPEGImages")
        labels = ann.labels.copy()
        labels[:, 4] = [int(n) for n in names]  # class names are the digits
        assert ann.size == (128, 128) and ann.image.is_file()
        out[ann.image.name] = labels
    return out


def test_voc_yolo_and_coco_hold_the_same_boxes_as_the_generator(folder):
    for split in ("train", "val"):
        voc = _voc_split(folder, split)
        coco, names = read_coco(folder / "annotations" / f"instances_{split}.json", folder / split)
        yolo = read_yolo(folder / "images" / split, folder / "labels" / split, 10)
        assert names == [str(d) for d in range(10)]
        assert sorted(voc) == sorted(a.image.name for a in coco) == sorted(a.image.name for a in yolo)
        for a in coco:
            np.testing.assert_array_equal(a.labels, voc[a.image.name])
        for a in yolo:  # 8 decimals of x / 128: exact to float32 rounding
            np.testing.assert_allclose(a.labels, voc[a.image.name], rtol=0, atol=1e-4)
    for i in SAMPLE:
        ann, names = read_voc_xml(folder / "Annotations" / f"{i:05d}.xml", folder / "JPEGImages")
        ann.labels[:, 4] = [int(n) for n in names]
        np.testing.assert_array_equal(ann.labels, synth.render(i)[2])


def test_boxes_are_the_tight_box_of_the_pasted_ink():
    for i in SAMPLE:
        img, background, labels = synth.render(i)
        changed = (img != background).any(axis=2)
        inside = np.zeros_like(changed)
        for x0, y0, x1, y1 in labels[:, :4].astype(int):
            inside[y0:y1, x0:x1] = True
            box = changed[y0:y1, x0:x1]
            # every edge row and column of the box holds ink: no box is larger than its glyph
            assert box[0].any() and box[-1].any() and box[:, 0].any() and box[:, -1].any(), (i, x0, y0, x1, y1)
        assert not (changed & ~inside).any(), i  # no ink outside the boxes
        assert (labels[:, :4] == np.round(labels[:, :4])).all()


def _iou(a, b) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union


def test_tasks_digits_object_counts_and_overlap(folder):
    train = (folder / "ImageSets" / "Main" / "train.txt").read_text().split()
    val = (folder / "ImageSets" / "Main" / "val.txt").read_text().split()
    assert (len(train), len(val)) == (1200, 400) and not set(train) & set(val)
    counts = {n: 0 for n in (1, 2, 3)}
    for split in ("train", "val"):
        for name, labels in _voc_split(folder, split).items():
            i = int(Path(name).stem)
            digits = set(labels[:, 4].astype(int))
            assert digits <= (set(range(5)) if i < 1000 else set(range(5, 10))), name
            counts[len(labels)] += 1
            sides = labels[:, 2:4] - labels[:, :2]
            assert (sides >= 1).all() and (sides <= 40).all()
            for a, b in itertools.combinations(labels[:, :4].tolist(), 2):
                assert _iou(a, b) < 0.3, name
    assert sum(counts.values()) == 1600 and min(counts.values()) > 300  # 1-3 objects, each count common


@pytest.mark.parametrize("classes, sizes", [([str(d) for d in range(5)], (800, 200)),
                                            ([str(d) for d in range(5, 10)], (400, 200))])
def test_data_classes_pick_a_task(folder, monkeypatch, classes, sizes):
    monkeypatch.setenv("GLUONTL_HOME", str(folder.parents[2]))
    spec = DataSpec(source="demo:digits_det", classes=classes, batch_size=8)
    loaders = make_detection_loaders(spec, (3, 128, 128), seed=0)
    assert (loaders.train_size, loaders.val_size) == sizes and loaders.class_names == classes
    assert loaders.split is None  # the demo has its own ImageSets


def test_render_is_deterministic_and_files_hold_its_pixels(folder):
    first = [synth.render(i) for i in (0, 1234)]
    synth._material.cache_clear()
    for i, (img, bg, labels) in zip((0, 1234), first):
        again = synth.render(i)
        for a, b in zip((img, bg, labels), again):
            np.testing.assert_array_equal(a, b)
        on_disk = np.asarray(Image.open(folder / "JPEGImages" / f"{i:05d}.jpg").convert("RGB"), np.float64)
        assert on_disk.shape == (128, 128, 3)
        assert np.abs(on_disk - img).mean() < 3  # JPEG quality 90


def test_second_call_reuses_the_folder(folder):
    stamp = os.stat(folder / "Annotations" / "00000.xml").st_mtime_ns
    assert synth.digits_det_folder(folder.parents[2]) == folder
    assert os.stat(folder / "Annotations" / "00000.xml").st_mtime_ns == stamp
